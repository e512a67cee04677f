"""Time the symbolic proofs: the bounded table, larger bounds, and the all-sizes micro-steps.

    python bench/bench_proofs.py [--bounds 4,8] [--large 6,12] [--timeout 60] [--policy fcfs,priority]
        [--skip-bounded] [--skip-large] [--skip-unbounded]

Every bounded proof runs in a fresh process (``proofs.prove_isolated``), one at a time, with a
timeout per proof; the micro-step proofs of ``spec/symbolic/unbounded.py`` likewise. Prints one
markdown table per part and the totals. Report the machine's load with the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spec.symbolic.proofs import prove_isolated  # noqa: E402
from spec.symbolic.state import Shape  # noqa: E402
from spec.symbolic.transitions import TRANSITIONS  # noqa: E402
from spec.symbolic.unbounded import prove_all_steps  # noqa: E402


def run_bounded(r: int, b: int, policies: list[str], timeout_s: float) -> float:
    """Prove every transition at (r, b) per policy; print the table; return the total seconds."""
    print(f"\n| transition | {' | '.join(policies)} |  (R={r}, B={b}, timeout {timeout_s:.0f} s)")
    print("|---|" + "---|" * len(policies))
    total = 0.0
    for name in TRANSITIONS:
        cells = []
        for policy in policies:
            res = prove_isolated(Shape(r, b, 2, policy), name, timeout_s)
            total += res.seconds
            cells.append(f"{res.seconds:.1f} s" + ("" if res.status == "proved" else f" ({res.status})"))
        print(f"| `{name}` | {' | '.join(cells)} |", flush=True)
    print(f"total {total:.1f} s")
    return total


def run_unbounded(policies: list[str], timeout_s: float) -> float:
    """Prove every micro-step for all sizes per policy; print the table; return the total seconds."""
    print(f"\n| micro-step | policy | result | time |  (all R, B; timeout {timeout_s:.0f} s)")
    print("|---|---|---|---|")
    total = 0.0
    for policy in policies:
        for res in prove_all_steps(policy, timeout_s):
            total += res.seconds
            print(f"| `{res.step}` | {policy} | {res.status} | {res.seconds:.1f} s |", flush=True)
    print(f"total {total:.1f} s")
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bounds", default="4,8")
    parser.add_argument("--large", default="6,12")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--policy", default="fcfs,priority")
    parser.add_argument("--skip-bounded", action="store_true")
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-unbounded", action="store_true")
    args = parser.parse_args()
    policies = args.policy.split(",")
    print(f"load average at start: {os.getloadavg()}")
    t0 = time.monotonic()
    if not args.skip_unbounded:
        run_unbounded(policies, args.timeout)
    if not args.skip_bounded:
        run_bounded(*(int(x) for x in args.bounds.split(",")), policies, args.timeout)
    if not args.skip_large:
        run_bounded(*(int(x) for x in args.large.split(",")), policies, args.timeout)
    print(f"\nwall {time.monotonic() - t0:.1f} s; load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
