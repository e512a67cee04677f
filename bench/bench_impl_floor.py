"""How far impl/'s scheduler step is from its floor: the cost of building one step's output alone.

Usage: python bench/bench_impl_floor.py [--sizes 64,256,1024] [--steps 50] [--repeats 5]

The workload is bench_impl.py's steady decode: N requests of 128-token prompts past their prefill,
one token each per step. Two loops over the same requests, in one process:

* ``impl step``: ``FastScheduler.schedule()`` + ``update_from_output()`` with one sampled token per
  request (bench_impl.py's timed step);
* ``floor``: only what any scheduler must produce for that step in impl's own form: the
  ``StepOutput`` with one entry tuple per request (in batch order), the sampled-token list, one token
  appended to each request, and one request-output tuple each. No decision is made: the floor is the
  output of a scheduler that already knows the answer.

The ratio ``impl / floor`` is what the scheduling decisions cost on top of writing their result down.
The best of ``--repeats`` runs is reported for each, wall time per step.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_impl import add_requests, impl_step, make_config  # noqa: E402

from schedconf.impl.scheduler import FastScheduler, StepOutput  # noqa: E402

_NO_BLOCKS: tuple[int, ...] = ()


def build(n: int, decode_steps: int) -> FastScheduler:
    """A FastScheduler with ``n`` requests past their prefill (steady decode from here on)."""
    sched = FastScheduler(make_config(n, decode_steps))
    add_requests(sched, n, decode_steps + 32)
    while any(len(r.tokens) == r.num_prompt for r in sched.requests.values()):  # until every prefill is done
        impl_step(sched)
    return sched


def floor_step(sched: FastScheduler, step: int) -> tuple[StepOutput, list[tuple[Any, ...]]]:
    """The step's output written down for requests already known to decode one token each."""
    running = sched.running
    entries = [(req, 1, len(req.tokens) - 1, len(req.tokens), _NO_BLOCKS) for req in running]
    out = StepOutput(step, entries, len(running), [], {}, set(), set(), len(entries))
    sampled = [(7,)] * len(entries)
    results = []
    append = results.append
    for entry, toks in zip(entries, sampled):
        req = entry[0]
        req.tokens.append(toks[0])
        append((req.req_id, toks, None, None))
    return out, results


def time_loop(run: Any, steps: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for i in range(steps):
        run(i)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"steady decode, 128-token prompts, {args.steps} timed steps, best of {args.repeats}")
    print("| requests | impl step ms | floor ms | impl / floor |")
    print("|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        total = 2 * args.steps * (args.repeats + 1)
        fast = build(n, total)
        floor_sched = build(n, total)
        impl_runs = [time_loop(lambda _i: impl_step(fast), args.steps) for _ in range(args.repeats)]
        floor_runs = [time_loop(lambda i: floor_step(floor_sched, i), args.steps) for _ in range(args.repeats)]
        best_impl, best_floor = min(impl_runs), min(floor_runs)
        print(f"| {n} | {best_impl * 1e3:.3f} | {best_floor * 1e3:.3f} | {best_impl / best_floor:.2f}x |")


if __name__ == "__main__":
    main()
