"""Harness figures: replay overhead, campaign throughput, shrinking.

Usage: python bench/bench_harness.py [--traces 300] [--campaign 400] [--mutants [--mutant-names a,b]]

1. Replay overhead: the same traces are (a) driven straight through the
   reference Scheduler (inputs, schedule, model outputs; nothing compared) and
   (b) replayed through the harness against the reference adapter (canonical
   outputs, strict comparison, observation). Both in this process; the ratio
   b/a - 1 is the harness overhead (target: at most 25%).
2. Campaign throughput: `run_campaign` of the reference against itself,
   --jobs 1 and --jobs 2, traces per second (generation + replay).
3. With --mutants: the kill table (which check, time, shrunk trace length), of
   every mutant or of --mutant-names.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.sut import add_request_kwargs
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import WorkloadError, run_workload
from schedconf.spec.errors import InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler


def drive_reference(trace: Trace) -> None:
    """The reference model's own work for a trace: every input, no comparison."""
    sched = Scheduler(SchedulerConfig.from_dict(trace.config), trace.profile)
    pending = {}  # step number -> its SchedulerOutput (several when steps are in flight)
    for e in trace.events:
        kind = e["kind"]
        try:
            if kind == "add_request":
                sched.add_request(**add_request_kwargs(e))
            elif kind == "abort":
                sched.abort(e["request_id"])
            elif kind == "step":
                pending[e["step"]] = sched.schedule()
            elif kind == "reset_prefix_cache":
                sched.reset_prefix_cache(e.get("reset_running_requests", False))
            elif kind == "model_output":
                sched.update_from_output(
                    pending.pop(e["step"]),
                    ModelRunnerOutput(
                        {k: tuple(v) for k, v in e["sampled_token_ids"].items()},
                        {k: tuple(v) for k, v in e["draft_token_ids"].items()},
                    ),
                )
            else:
                raise ValueError(f"bench_harness: an event kind it does not drive: {kind!r}")
        except InvalidEvent:
            pass


def bench_replay(n: int) -> None:
    traces = []
    seed = 0
    while len(traces) < n:
        try:
            traces.append(run_workload(random_workload(seed)))
        except WorkloadError:
            pass
        seed += 1
    steps = sum(t.num_steps() for t in traces)
    best_ref = best_rep = float("inf")
    sut = ReferenceSut()
    for _ in range(3):  # best of three, interleaved
        t0 = time.perf_counter()
        for t in traces:
            drive_reference(t)
        best_ref = min(best_ref, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in traces:
            assert replay(t, sut, "strict").verdict == "pass"
        best_rep = min(best_rep, time.perf_counter() - t0)
    print(f"replay overhead ({n} generated traces, {steps} steps, best of 3)")
    print("| run | seconds | per step | vs reference |")
    print("|---|---|---|---|")
    print(f"| reference model alone | {best_ref:.3f} | {1e6 * best_ref / steps:.0f} us | 1.00x |")
    print(
        f"| harness replay (strict) | {best_rep:.3f} | {1e6 * best_rep / steps:.0f} us | {best_rep / best_ref:.2f}x "
        f"(+{100 * (best_rep / best_ref - 1):.0f}%) |"
    )


def bench_campaign(n: int) -> None:
    print(f"\ncampaign throughput (reference vs itself, {n} traces, generation included)")
    print("| jobs | seconds | traces/s |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 2):
            t0 = time.perf_counter()
            summary = run_campaign(
                CampaignSpec(
                    sut="reference", examples=n, seed=11, jobs=jobs, out_dir=tmp, run_id=f"j{jobs}", quiet=True
                )
            )
            dt = time.perf_counter() - t0
            assert summary["failed"] == 0
            print(f"| {jobs} | {dt:.2f} | {n / dt:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--campaign", type=int, default=400)
    parser.add_argument("--mutants", action="store_true")
    parser.add_argument("--mutant-names", default="", help="with --mutants: comma-separated names (default: all)")
    args = parser.parse_args()
    bench_replay(args.traces)
    bench_campaign(args.campaign)
    if args.mutants:
        from schedconf.conformance.checking.mutant_kill import kill_all, render_kill_table

        print("\nmutants")
        names = [n for n in args.mutant_names.split(",") if n] or None
        print(render_kill_table(kill_all(examples=3000, shrink_budget_s=20, names=names)))


if __name__ == "__main__":
    main()
