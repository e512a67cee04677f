"""Steps per second of the reference model on a steady decode workload.

Usage: python bench/bench_spec.py [--sizes 64,256,1024] [--steps 50] [--invariants]

Each size N: N requests of 128-token prompts are admitted (prefill steps not
timed), then --steps decode steps are timed, each = schedule() +
update_from_output() with one sampled token per request. Prints ms per step and
steps/s, and with --invariants the cost of checking every invariant after each
call as a ratio over the plain step measured in the same run.
"""

from __future__ import annotations

import argparse
import time

from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.invariants import check_invariants
from schedconf.spec.v1.scheduler import Scheduler

PROMPT_LEN = 128
BLOCK_SIZE = 16


def build_decoding(n: int, decode_steps: int) -> Scheduler:
    """A scheduler with ``n`` requests, all past their prefill."""
    max_len = PROMPT_LEN + decode_steps + 64
    blocks_per_req = -(-max_len // BLOCK_SIZE)
    config = SchedulerConfig(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=n * blocks_per_req + 1,
        max_num_batched_tokens=max(8192, n),
        max_num_seqs=n,
        max_model_len=max_len,
    )
    sched = Scheduler(config)
    for i in range(n):
        # distinct prompts: no prefix sharing
        sched.add_request(f"r{i}", range(i * PROMPT_LEN, (i + 1) * PROMPT_LEN), max_tokens=decode_steps + 32)
    while sched.waiting or any(r.num_output_tokens == 0 for r in sched.requests.values()):
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=_tokens(sched, out)))
    return sched


def _tokens(sched: Scheduler, out) -> dict[str, tuple[int, ...]]:
    assert sched.last_step is not None
    return {rid: (7,) for rid, samples in sched.last_step.samples.items() if samples}


def time_decode(sched: Scheduler, steps: int, invariants: bool) -> float:
    """Seconds per decode step."""
    t0 = time.perf_counter()
    for _ in range(steps):
        out = sched.schedule()
        if invariants:
            check_invariants(sched)
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=_tokens(sched, out)))
        if invariants:
            check_invariants(sched)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--invariants", action="store_true", help="also time with every invariant checked")
    args = parser.parse_args()
    print(
        f"{'requests':>8} | {'ms/step':>8} | {'steps/s':>8} | vLLM 0.32 ms/step (2-core, notes) "
        + ("| +invariants ms/step | ratio" if args.invariants else "")
    )
    vllm = {64: "1.0-1.9", 256: "4-8.6", 1024: "22-37"}
    for n in (int(s) for s in args.sizes.split(",")):
        sched = build_decoding(n, 2 * args.steps)
        per_step = time_decode(sched, args.steps, invariants=False)
        line = f"{n:>8} | {per_step * 1e3:>8.2f} | {1 / per_step:>8.1f} | {vllm.get(n, '-'):>34} "
        if args.invariants:
            with_inv = time_decode(sched, args.steps, invariants=True)
            line += f"| {with_inv * 1e3:>19.2f} | {with_inv / per_step:.1f}x"
        print(line)


if __name__ == "__main__":
    main()
