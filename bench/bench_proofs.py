"""Time the symbolic proofs: the bounded table, larger bounds, and the all-sizes micro-steps.

    python bench/bench_proofs.py [--bounds 4,8] [--large 6,12] [--timeout 60] [--policy fcfs,priority]
        [--skip-bounded] [--skip-large] [--skip-unbounded] [--method named|plain] [--compare]
        [--transitions a,b]

Every bounded proof runs in a fresh process (``proofs.prove_isolated``), one at a time, with a
timeout per proof; the micro-step proofs of ``spec/symbolic/unbounded.py`` likewise. Prints one
markdown table per part and the totals. Report the machine's load with the figures.

``--compare`` proves the bounded table (``--bounds``) by both methods of ``proofs.METHODS`` in one
command: per transition and policy, ``plain`` (the path before issue 14) and ``named``, each in a
fresh process, one right after the other (which goes first alternates from row to row), so that
both see the same load on a shared machine; it prints both times, their ratio and the 1-minute load
average per row, then the totals. ``--method`` picks the method of the other tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spec.symbolic.proofs import METHODS, NAMED, PLAIN, PROVED, prove_isolated  # noqa: E402
from spec.symbolic.state import Shape  # noqa: E402
from spec.symbolic.transitions import TRANSITIONS  # noqa: E402
from spec.symbolic.unbounded import prove_all_steps  # noqa: E402


def run_bounded(r: int, b: int, policies: list[str], timeout_s: float, names: list[str], method: str = NAMED) -> float:
    """Prove every transition at (r, b) per policy; print the table; return the total seconds."""
    print(f"\n| transition | {' | '.join(policies)} |  (R={r}, B={b}, timeout {timeout_s:.0f} s, {method})")
    print("|---|" + "---|" * len(policies))
    total = 0.0
    for name in names:
        cells = []
        for policy in policies:
            res = prove_isolated(Shape(r, b, 2, policy), name, timeout_s, method)
            total += res.seconds
            cells.append(f"{res.seconds:.1f} s" + ("" if res.status == "proved" else f" ({res.status})"))
        print(f"| `{name}` | {' | '.join(cells)} |", flush=True)
    print(f"total {total:.1f} s")
    return total


def run_compare(r: int, b: int, policies: list[str], timeout_s: float, names: list[str]) -> dict[str, float]:
    """Prove every transition at (r, b) per policy by both methods, alternating; print the table; return the totals."""
    print(f"\n| transition | policy | {PLAIN} | {NAMED} | {PLAIN} / {NAMED} | load (1 min) |"
          f"  (R={r}, B={b}, timeout {timeout_s:.0f} s)")
    print("|---|---|---|---|---|---|")
    totals = {m: 0.0 for m in METHODS}
    row = 0
    for name in names:
        for policy in policies:
            order = (PLAIN, NAMED) if row % 2 == 0 else (NAMED, PLAIN)
            row += 1
            cells = {}
            for method in order:
                res = prove_isolated(Shape(r, b, 2, policy), name, timeout_s, method)
                totals[method] += res.seconds
                cells[method] = (res.seconds, f"{res.seconds:.1f} s" + ("" if res.status == PROVED else f" ({res.status})"))
            ratio = cells[PLAIN][0] / max(cells[NAMED][0], 1e-9)
            print(f"| `{name}` | {policy} | {cells[PLAIN][1]} | {cells[NAMED][1]} | {ratio:.2f} | "
                  f"{os.getloadavg()[0]:.2f} |", flush=True)
    print(f"| total | | {totals[PLAIN]:.1f} s | {totals[NAMED]:.1f} s | {totals[PLAIN] / max(totals[NAMED], 1e-9):.2f} | |")
    return totals


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
    parser.add_argument("--method", default=NAMED, choices=METHODS, help="how the bounded proofs query Z3")
    parser.add_argument("--compare", action="store_true", help="the table at --bounds by both methods, alternating")
    parser.add_argument("--transitions", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    policies = args.policy.split(",")
    names = [n for n in args.transitions.split(",") if n] or list(TRANSITIONS)
    print(f"load average at start: {os.getloadavg()}")
    t0 = time.monotonic()
    if not args.skip_unbounded:
        run_unbounded(policies, args.timeout)
    if not args.skip_bounded:
        bounds = tuple(int(x) for x in args.bounds.split(","))
        if args.compare:
            run_compare(*bounds, policies, args.timeout, names)
        else:
            run_bounded(*bounds, policies, args.timeout, names, args.method)
    if not args.skip_large:
        run_bounded(*(int(x) for x in args.large.split(",")), policies, args.timeout, names, args.method)
    print(f"\nwall {time.monotonic() - t0:.1f} s; load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
