"""How far impl/'s scheduler step is from its floor: the cost of building one step's output alone.

Usage: python bench/bench_impl_floor.py [--sizes 64,256,1024] [--steps 50] [--repeats 5]

The workload is bench_impl.py's steady decode: N requests of 128-token prompts past their prefill,
one token each per step. Two loops over the same requests, in one process:

* ``impl step``: ``FastScheduler.schedule()`` + ``update_from_output()`` with one sampled token per
  request (bench_impl.py's timed step);
* ``floor``: only what any scheduler must produce for that step in impl's own form: the
  ``StepOutput`` with one entry tuple per request (in batch order), the sampled-token list, one token
  appended to each request, and one request-output tuple each. No decision is made: the floor is the
  output of a scheduler that already knows the answer (``bench_impl.floor_step``, which bench_impl.py
  prints beside impl's step too).

The ratio ``impl / floor`` is what the scheduling decisions cost on top of writing their result down.
The two loops are timed in turns, so a change of load on a shared machine hits both; the best of
``--repeats`` runs is reported for each, wall time per step.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_impl import build_impl as build  # noqa: E402
from bench_impl import floor_step, impl_step  # noqa: E402


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
        impl_runs: list[float] = []
        floor_runs: list[float] = []
        for _ in range(args.repeats):  # in turns, so a change of load hits both
            impl_runs.append(time_loop(lambda _i: impl_step(fast), args.steps))
            floor_runs.append(time_loop(lambda i: floor_step(floor_sched, i), args.steps))
        best_impl, best_floor = min(impl_runs), min(floor_runs)
        print(f"| {n} | {best_impl * 1e3:.3f} | {best_floor * 1e3:.3f} | {best_impl / best_floor:.2f}x |")


if __name__ == "__main__":
    main()
