"""What containing a Python scheduler costs: the same traces replayed in-process and through a child process.

Usage: python bench/bench_module_sut.py [--examples 200] [--seed 0] [--comparison strict]

The scheduler is the reference model, named three ways: ``reference`` (our
own adapter, unchecked), ``inprocess:`` (a user's scheduler in the harness's
process, every answer checked through JSON and the protocol's schema) and
``module:`` (a user's scheduler in a child process behind the protocol, the
default). The traces are generated once, then each SUT replays all of them in
this process, so the ratios compare like with like. Prints traces/s, ms per
trace and each row's cost as a ratio over ``reference``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedconf.conformance.adapters import make_sut  # noqa: E402
from schedconf.conformance.checking.replay import FAIL, replay  # noqa: E402
from schedconf.conformance.runs.campaign import CampaignSpec, generate_workloads  # noqa: E402
from schedconf.conformance.workloads.workload import WorkloadError, run_workload  # noqa: E402

TARGET = "schedconf.conformance.adapters.reference:ReferenceSut"
SUTS = ("reference", f"inprocess:{TARGET}", f"module:{TARGET}")


def time_replays(sut_name: str, traces: list, comparison: str) -> tuple[float, float]:
    """(seconds to replay every trace, seconds to build the SUT); no replay may fail."""
    t0 = time.perf_counter()
    sut = make_sut(sut_name)
    built = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        for trace in traces:
            result = replay(trace, sut, comparison)
            assert result.verdict != FAIL, (sut_name, trace.path, result)
        return time.perf_counter() - t1, built
    finally:
        sut.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--comparison", default="strict", choices=["strict", "observable", "safety"])
    args = parser.parse_args()
    traces = []
    spec = CampaignSpec(sut="reference", examples=args.examples, seed=args.seed, comparison=args.comparison)
    for i, workload in enumerate(generate_workloads(spec)):
        try:
            trace = run_workload(workload)
        except WorkloadError:
            continue
        trace.path = f"trace-{i}"
        traces.append(trace)
    events = sum(len(t.events) for t in traces)
    print(f"{len(traces)} traces, {events} events, --comparison {args.comparison}, seed {args.seed}")
    print(f"{'SUT':<58} {'start s':>8} {'traces/s':>9} {'ms/trace':>9} {'vs reference':>13}")
    base = None
    for name in SUTS:
        seconds, built = time_replays(name, traces, args.comparison)
        base = base or seconds
        print(
            f"{name:<58} {built:>8.2f} {len(traces) / seconds:>9.1f} {1000 * seconds / len(traces):>9.2f} "
            f"{seconds / base:>12.2f}x"
        )


if __name__ == "__main__":
    main()
