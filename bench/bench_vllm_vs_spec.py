"""Side by side: the reference model and the real vLLM scheduler on the same steady decode.

Usage: python bench/bench_vllm_vs_spec.py [--sizes 64,256,1024] [--steps 50] [--warmup 1] [--version 0.33.0]

Each size N: N requests with distinct 128-token prompts are admitted and
prefilled (not timed), then ``--steps`` decode steps are timed, each one
``schedule()`` + ``update_from_output()`` with one sampled token per request.

* reference: ``schedconf.spec.v1.scheduler.Scheduler`` in this process, wall time of the
  two calls (as ``bench/bench_spec.py``);
* vLLM: the real scheduler in its own environment, driven over the protocol
  (``--sut vllm-v1@VERSION``); its time is measured INSIDE the driver process
  around vLLM's ``schedule()`` and ``update_from_output()`` and read back with
  the driver's ``stats`` extension method, so JSON and pipe costs are not
  counted. The protocol round trip per step is shown separately.

Prints one row per size: ms/step of each, and reference/vLLM as a ratio
(above 1: the reference is slower). Both run one after the other, never at the
same time, on whatever cores the machine has. Each size is first measured
``--warmup`` times untimed (both processes then have what a campaign's first
traces build once: the harness's compiled validators, the driver's caches).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedconf.conformance.adapters.vllm_v1 import VllmV1Sut  # noqa: E402
from schedconf.conformance.engines.vllm_env import ensure_vllm_env  # noqa: E402
from schedconf.spec.output import ModelRunnerOutput  # noqa: E402
from schedconf.spec.v1.config import SchedulerConfig  # noqa: E402
from schedconf.spec.v1.scheduler import Scheduler  # noqa: E402

PROMPT_LEN = 128
BLOCK_SIZE = 16


def bench_config(n: int, decode_steps: int) -> SchedulerConfig:
    """A pool big enough that nobody is ever preempted; budget and seats for all N."""
    max_len = PROMPT_LEN + decode_steps + 64
    blocks_per_req = -(-max_len // BLOCK_SIZE)
    return SchedulerConfig(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=n * blocks_per_req + 1,
        max_num_batched_tokens=max(8192, n),
        max_num_seqs=n,
        max_model_len=max_len,
    )


def prompt(i: int) -> list[int]:
    """Distinct prompts: no prefix sharing."""
    return list(range(i * PROMPT_LEN, (i + 1) * PROMPT_LEN))


# ------------------------------------------------------------------ reference


def reference_ms_per_step(n: int, steps: int) -> float:
    """Milliseconds per decode step of the reference model."""
    config = bench_config(n, 2 * steps)
    sched = Scheduler(config, "vllm-0.33")
    for i in range(n):
        sched.add_request(f"r{i}", prompt(i), max_tokens=2 * steps + 32)

    def step() -> None:
        out = sched.schedule()
        assert sched.last_step is not None
        sampled: dict[str, tuple[int, ...]] = {rid: (7,) for rid, samples in sched.last_step.samples.items() if samples}
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))

    while sched.waiting or any(r.num_output_tokens == 0 for r in sched.requests.values()):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3


# ----------------------------------------------------------------------- vLLM


def _sampling(output: dict[str, Any], lengths: dict[str, int]) -> dict[str, list[int]]:
    """One token for every scheduled request whose tokens reach the end of its sequence."""
    computed = {r["req_id"]: r["num_computed_tokens"] for r in output["scheduled_new_reqs"]}
    computed.update({r["req_id"]: r["num_computed_tokens"] for r in output["scheduled_cached_reqs"]})
    sampled: dict[str, list[int]] = {}
    for rid, n in output["num_scheduled_tokens"].items():
        if computed[rid] + n >= lengths[rid]:
            sampled[rid] = [7]
            lengths[rid] += 1
    return sampled


def vllm_ms_per_step(sut: VllmV1Sut, n: int, steps: int) -> tuple[float, float, float, float]:
    """For N requests: (ms/step inside vLLM and through the protocol, one request per call), then the same
    two for the next ``steps`` steps sent as one batch."""
    config = bench_config(n, 2 * steps)
    sut.start(config.to_dict(), "vllm-" + ".".join(sut.version.split(".")[:2]))
    lengths: dict[str, int] = {}
    for i in range(n):
        rid = f"r{i}"
        sut.add_request(
            {
                "request_id": rid,
                "prompt_token_ids": prompt(i),
                "max_tokens": 2 * steps + 32,
                "priority": 0,
                "arrival_time": 0,
                "eos_token_id": None,
                "stop_token_ids": [],
                "ignore_eos": False,
                "min_tokens": 0,
            }
        )
        lengths[rid] = PROMPT_LEN
    outputs_seen: set[str] = set()
    while len(outputs_seen) < n:  # prefill until every request has sampled once
        out = sut.schedule()
        sampled = _sampling(out, lengths)
        outputs_seen.update(sampled)
        sut.update_from_output(sampled, {})
    sut.stats(reset=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = sut.schedule()
        sut.update_from_output(_sampling(out, lengths), {})
    per_call = (time.perf_counter() - t0) / steps * 1e3
    stats = sut.stats(reset=True)
    assert stats["steps"] == steps, stats
    inside_per_call = stats["scheduler_seconds"] / steps * 1e3

    # Steady decode: every request samples one token each step, so the inputs are known in advance.
    every = {f"r{i}": [7] for i in range(n)}
    with sut.planning() as calls:
        for _ in range(steps):
            sut.schedule()
            sut.update_from_output(every, {})
    assert sut.supports_batch, "the driver does not list the batch capability"
    t0 = time.perf_counter()
    sut.plan_batch(calls)
    for _ in range(steps):
        out = sut.schedule()
        assert _sampling(out, lengths) == every, "not a steady decode step"
        sut.update_from_output(every, {})
    sut.end_batch()
    batched = (time.perf_counter() - t0) / steps * 1e3
    stats = sut.stats()
    assert stats["steps"] == steps, stats
    return inside_per_call, per_call, stats["scheduler_seconds"] / steps * 1e3, batched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of each size before its timed one")
    parser.add_argument("--version", default="0.33.0", help="vLLM release (its environment is built if missing)")
    args = parser.parse_args()
    ensure_vllm_env(args.version)
    sut = VllmV1Sut(args.version, timeout_s=300.0)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    try:
        for n in sizes:
            for _ in range(args.warmup):
                reference_ms_per_step(n, args.steps)
                vllm_ms_per_step(sut, n, args.steps)
            ref = reference_ms_per_step(n, args.steps)
            rows.append((n, ref, *vllm_ms_per_step(sut, n, args.steps)))
    finally:
        sut.close()
    print(
        f"steady decode, {PROMPT_LEN}-token prompts, {args.steps} timed steps per column after {args.warmup} "
        f"untimed round(s); vLLM {args.version} timed inside its process; protocol columns: wall time in the "
        "harness over vLLM's own time"
    )
    print(
        f"{'requests':>8} | {'reference ms/step':>17} | {'vLLM ms/step':>12} | {'ref/vLLM':>8} | "
        f"{'per call ms/step':>16} | {'per call/vLLM':>13} | {'batch ms/step':>13} | {'batch/vLLM':>10}"
    )
    for n, ref, inside, per_call, inside_batch, batched in rows:
        print(
            f"{n:>8} | {ref:>17.2f} | {inside:>12.2f} | {ref / inside:>7.2f}x | {per_call:>16.2f} | "
            f"{per_call / inside:>12.2f}x | {batched:>13.2f} | {batched / inside_batch:>9.2f}x"
        )


if __name__ == "__main__":
    main()
