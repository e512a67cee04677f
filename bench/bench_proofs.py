"""Time the symbolic proofs: the bounded table, larger bounds, and the all-sizes micro-steps.

    python bench/bench_proofs.py [--bounds 4,8] [--large 6,12] [--timeout 60] [--policy fcfs,priority]
        [--skip-bounded] [--skip-large] [--skip-unbounded] [--method symmetric|named|plain]
        [--compare [--methods plain,symmetric]] [--transitions a,b]

Every bounded proof runs in a fresh process (``proofs.prove_isolated``), one at a time, with a
timeout per proof; the micro-step proofs of ``spec/symbolic/unbounded.py`` likewise. Prints one
markdown table per part and the totals. Report the machine's load with the figures.

``--compare`` proves the bounded table (``--bounds``) by each method of ``--methods`` (default
``plain``, the path before issue 14, and ``symmetric``, today's) in one command: per transition and
policy, each method in a fresh process, one right after the other (the order rotates from row to
row), so that all see the same load on a shared machine; it prints the times, the ratio first / last
and the 1-minute load average per row, then the totals. ``symmetric`` also pays for its theorem
(one row per policy). ``--method`` picks the method of the other tables. A method may end in
``-serial``: the same method in one process, without the helper process that checks the slow
queries beside the proof (``spec/symbolic/helper.py``); ``--methods symmetric-serial,symmetric``
is the before-and-after of that helper.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from schedconf.spec.symbolic.proofs import (  # noqa: E402
    METHODS,
    PLAIN,
    PROVED,
    SYMMETRIC,
    prove_isolated,
    prove_theorem_symmetry,
    run_isolated,
)
from schedconf.spec.symbolic.state import Shape  # noqa: E402
from schedconf.spec.symbolic.transitions import TRANSITIONS  # noqa: E402
from schedconf.spec.symbolic.unbounded import prove_all_steps  # noqa: E402

THEOREM_SYMMETRY = "theorem_symmetry"
SERIAL = "-serial"
"""Suffix of a method proved without the helper process (``prove_isolated(parallel=False)``)."""


def get_method(spec: str) -> tuple[str, bool]:
    """``symmetric-serial`` -> ("symmetric", False); ``symmetric`` -> ("symmetric", True)."""
    return (spec[: -len(SERIAL)], False) if spec.endswith(SERIAL) else (spec, True)


def run_bounded(
    r: int, b: int, policies: list[str], timeout_s: float, names: list[str], method: str = SYMMETRIC
) -> float:
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


def run_compare(
    r: int, b: int, policies: list[str], timeout_s: float, names: list[str], methods: list[str]
) -> dict[str, float]:
    """Prove every transition at (r, b) per policy by each method, rotating the order; print the table; return the totals.

    The ``symmetric`` method rests on one theorem per shape (the premises are blind to slot
    names, ``proofs.prove_theorem_symmetry``), proved in a fresh process of its own and counted
    in its total as one more row (for each of ``symmetric`` and ``symmetric-serial``).
    """
    first, last = methods[0], methods[-1]
    print(
        f"\n| transition | policy | {' | '.join(methods)} | {first} / {last} | load (1 min) |"
        f"  (R={r}, B={b}, timeout {timeout_s:.0f} s)"
    )
    print("|---|---|" + "---|" * len(methods) + "---|---|")
    totals = {m: 0.0 for m in methods}
    rows = [(name, policy) for name in names for policy in policies]
    if any(get_method(m)[0] == SYMMETRIC for m in methods):
        rows += [(THEOREM_SYMMETRY, policy) for policy in policies]
    for i, (name, policy) in enumerate(rows):
        shape = Shape(r, b, 2, policy)
        cells = {}
        for method in methods[i % len(methods) :] + methods[: i % len(methods)]:
            if name == THEOREM_SYMMETRY:
                if get_method(method)[0] != SYMMETRIC:
                    cells[method] = (0.0, "-")
                    continue
                res = run_isolated(prove_theorem_symmetry, shape, timeout_s)
            else:
                res = prove_isolated(shape, name, timeout_s, *get_method(method))
            totals[method] += res.seconds
            cells[method] = (res.seconds, f"{res.seconds:.1f} s" + ("" if res.status == PROVED else f" ({res.status})"))
        ratio = f"{cells[first][0] / cells[last][0]:.2f}" if cells[first][0] and cells[last][0] else "-"
        print(
            f"| `{name}` | {policy} | {' | '.join(cells[m][1] for m in methods)} | {ratio} | "
            f"{os.getloadavg()[0]:.2f} |",
            flush=True,
        )
    print(
        f"| total | | {' | '.join(f'{totals[m]:.1f} s' for m in methods)} | "
        f"{totals[first] / max(totals[last], 1e-9):.2f} | |"
    )
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
    parser.add_argument("--method", default=SYMMETRIC, choices=METHODS, help="how the bounded proofs query Z3")
    parser.add_argument(
        "--compare", action="store_true", help="the table at --bounds by each of --methods, in rotating order"
    )
    parser.add_argument(
        "--methods",
        default=f"{PLAIN},{SYMMETRIC}",
        help=f"with --compare: comma-separated, among {', '.join(METHODS)}, each may end in {SERIAL} "
        "(no helper process); the ratio is first / last",
    )
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
            methods = args.methods.split(",")
            unknown = [m for m in methods if get_method(m)[0] not in METHODS]
            if unknown or len(methods) < 2:
                parser.error(
                    f"--methods: two or more of {', '.join(METHODS)} (each may end in {SERIAL}), got {args.methods!r}"
                )
            run_compare(*bounds, policies, args.timeout, names, methods)
        else:
            run_bounded(*bounds, policies, args.timeout, names, args.method)
    if not args.skip_large:
        run_bounded(*(int(x) for x in args.large.split(",")), policies, args.timeout, names, args.method)
    print(f"\nwall {time.monotonic() - t0:.1f} s; load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
