"""Per-step cost of impl/'s fast scheduler next to the reference model, same process, same traces.

Usage: python bench/bench_impl.py [--sizes 64,256,1024] [--steps 50] [--repeats 5]
                                  [--vllm-json reports/bench_vllm.json]

Each size N: N requests of 128-token prompts (distinct, no prefix sharing,
prefix caching on, the bench_spec.py config) are admitted (prefill steps not
timed), then ``--steps`` steady-decode steps are timed, each =
``schedule()`` + ``update_from_output()`` with one sampled token per request,
the model's output built inside the timed loop in each scheduler's own input
form. The best of ``--repeats`` runs is reported for both, in wall time and
in this process's CPU time (``time.process_time``: on a shared machine, the
time the process actually ran).

Before timing, both schedulers run the same steps side by side and every
SchedulerOutput and request output is compared in the strict canonical form;
the bench refuses to print figures for schedulers that disagree.

The last two columns put impl's step beside its *floor* (``floor_step``, the
loop bench_impl_floor.py times): the same step's output written down by a
scheduler that already knows the answer, on a third copy of the workload, timed
in turns with impl's step (best of ``--repeats``, wall time).

The vLLM column reads ``--vllm-json`` when the file exists: either
``{"ms_per_step": {"64": 1.2, ...}}`` or ``{"results": [{"requests": 64,
"ms_per_step": 1.2}, ...]}``, optionally with ``"vllm_version"``. Without it,
the figures measured by hand in the notes (``vllm_as_sut.md``, vLLM 0.32, 2-core)
are printed and labelled as notes.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedconf.conformance.adapters.impl import canonical_request_outputs
from schedconf.impl.scheduler import FastScheduler, Req, StepOutput
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

PROMPT_LEN = 128
BLOCK_SIZE = 16
NOTES_VLLM = {64: "1.0-1.9", 256: "4-8.6", 1024: "22-37"}
_NO_BLOCKS: tuple[int, ...] = ()


def make_config(n: int, decode_steps: int) -> SchedulerConfig:
    """The bench_spec.py config: a pool that holds every request, a budget of max(8192, n)."""
    max_len = PROMPT_LEN + decode_steps + 64
    blocks_per_req = -(-max_len // BLOCK_SIZE)
    return SchedulerConfig(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=n * blocks_per_req + 1,
        max_num_batched_tokens=max(8192, n),
        max_num_seqs=n,
        max_model_len=max_len,
    )


def add_requests(sched: Any, n: int, max_tokens: int) -> None:
    for i in range(n):
        sched.add_request(f"r{i}", range(i * PROMPT_LEN, (i + 1) * PROMPT_LEN), max_tokens=max_tokens)


def spec_step(sched: Scheduler) -> tuple[Any, Any]:
    out = sched.schedule()
    assert sched.last_step is not None
    sampled: dict[str, tuple[int, ...]] = {rid: (7,) for rid, samples in sched.last_step.samples.items() if samples}
    return out, sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))


def impl_step(sched: FastScheduler) -> tuple[Any, Any]:
    out = sched.schedule()
    sampled = [(7,) if before + n >= ntok else () for (_, n, before, ntok, _) in out.entries]
    return out, sched.update_from_output(out, sampled)


def build_impl(n: int, decode_steps: int) -> FastScheduler:
    """A FastScheduler with ``n`` requests past their prefill (steady decode from here on)."""
    sched = FastScheduler(make_config(n, decode_steps))
    add_requests(sched, n, decode_steps + 32)
    while any(len(r.tokens) == r.num_prompt for r in sched.requests.values()):  # until every prefill is done
        impl_step(sched)
    return sched


def floor_step(sched: FastScheduler, step: int) -> tuple[StepOutput, list[tuple[Any, ...]]]:
    """The floor: the step's output written down for requests already known to decode one token each.

    Only what any scheduler must produce for a steady-decode step in impl's own
    form: the ``StepOutput`` with one entry tuple per request (in batch order),
    the sampled-token list, one token appended to each request, and one
    request-output tuple each. No decision is made.
    """
    running = sched.running
    entries: list[tuple[Req, int, int, int, Sequence[int]]] = [
        (req, 1, len(req.tokens) - 1, len(req.tokens), _NO_BLOCKS) for req in running
    ]
    out = StepOutput(step, entries, len(running), [], {}, set(), set(), len(entries))
    sampled = [(7,)] * len(entries)
    results: list[tuple[Any, ...]] = []
    append = results.append
    for entry, toks in zip(entries, sampled):
        req = entry[0]
        req.tokens.append(toks[0])
        append((req.req_id, toks, None, None))
    return out, results


def build(n: int, decode_steps: int) -> tuple[Scheduler, FastScheduler]:
    """Both schedulers with ``n`` requests past their prefill, checked equal on every step so far."""
    config = make_config(n, decode_steps)
    ref, fast = Scheduler(config), FastScheduler(config)
    add_requests(ref, n, decode_steps + 32)
    add_requests(fast, n, decode_steps + 32)
    while ref.waiting or any(r.num_output_tokens == 0 for r in ref.requests.values()):
        compare_step(ref, fast)
    return ref, fast


def compare_step(ref: Scheduler, fast: FastScheduler) -> None:
    """One step on both; raise if the canonical outputs differ."""
    ref_out, ref_res = spec_step(ref)
    fast_out, fast_res = impl_step(fast)
    if ref_out.to_canonical() != fast_out.to_canonical():
        raise SystemExit(f"step {ref_out.step}: SchedulerOutputs differ; refusing to time")
    if [o.to_canonical() for o in ref_res] != canonical_request_outputs(fast_res):
        raise SystemExit(f"step {ref_out.step}: request outputs differ; refusing to time")


def time_steps(step: Any, sched: Any, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per step over ``steps`` steps (garbage collected before, left on during)."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step(sched)
    return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def load_vllm(path: Path) -> tuple[dict[int, str], str]:
    """vLLM ms/step by size from ``path``, or the notes' figures; and the column label."""
    if not path.exists():
        return dict(NOTES_VLLM), "vLLM 0.32 (notes, 2-core)"
    data = json.loads(path.read_text())
    figures: dict[int, str] = {}
    if isinstance(data.get("ms_per_step"), dict):
        figures = {int(k): f"{float(v):.2f}" for k, v in data["ms_per_step"].items()}
    for row in data.get("results", []):
        figures[int(row["requests"])] = f"{float(row['ms_per_step']):.2f}"
    return figures, f"vLLM {data.get('vllm_version', '?')} ({path.name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm-json", type=Path, default=Path("reports/bench_vllm.json"))
    args = parser.parse_args()
    vllm, vllm_label = load_vllm(args.vllm_json)
    # The floor columns come last: tests/harness/test_bench_smoke.py reads the first seven by position.
    header = (
        f"{'requests':>8} | {'impl ms/step':>12} | {'spec ms/step':>12} | {'spec/impl':>9} | "
        f"{'impl CPU ms':>11} | {'spec CPU ms':>11} | {vllm_label} ms/step | {'floor ms/step':>13} | impl/floor"
    )
    print(header)
    print("-" * len(header))
    for n in (int(s) for s in args.sizes.split(",")):
        total = args.steps * (args.repeats + 1)
        ref, fast = build(n, total)
        # Equal outputs on the steps to be timed: one checked pass first.
        for _ in range(args.steps):
            compare_step(ref, fast)
        floor_sched = build_impl(n, total)
        ref_runs = [time_steps(spec_step, ref, args.steps) for _ in range(args.repeats)]
        fast_runs, floor_runs = [], []
        for _ in range(args.repeats):  # in turns, so a change of load hits both
            fast_runs.append(time_steps(impl_step, fast, args.steps))
            floor_runs.append(time_steps(lambda s: floor_step(s, 0), floor_sched, args.steps))
        best_ref, best_fast = min(r[0] for r in ref_runs), min(r[0] for r in fast_runs)
        cpu_ref, cpu_fast = min(r[1] for r in ref_runs), min(r[1] for r in fast_runs)
        best_floor = min(r[0] for r in floor_runs)
        vllm_cell = f"{vllm.get(n, '-'):>{len(vllm_label) + 8}}"
        print(
            f"{n:>8} | {best_fast * 1e3:>12.3f} | {best_ref * 1e3:>12.2f} | {best_ref / best_fast:>8.1f}x | "
            f"{cpu_fast * 1e3:>11.3f} | {cpu_ref * 1e3:>11.2f} | {vllm_cell} | {best_floor * 1e3:>13.3f} | "
            f"{best_fast / best_floor:.2f}x"
        )


if __name__ == "__main__":
    main()
