"""The race of a proof's query against fresh solvers in worker processes (spec/symbolic/race.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import z3

from spec.symbolic.race import FRESH_SOLVERS, FreshRacer


def _pigeonhole(n: int) -> list[z3.BoolRef]:
    """``n + 1`` pigeons in ``n`` holes, one each: unsatisfiable, and slow for Z3 from about n = 10."""
    p = [[z3.Bool(f"p{i}_{h}") for h in range(n)] for i in range(n + 1)]
    return [z3.Or(*row) for row in p] + [z3.Not(z3.And(p[i][h], p[j][h]))
                                         for h in range(n) for i in range(n + 1) for j in range(i + 1, n + 1)]


def _worker(kind: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spec.symbolic.race", kind], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


def _ask(proc: subprocess.Popen, msg: dict) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(msg).encode() + b"\n")
    proc.stdin.flush()


@pytest.mark.parametrize("kind", FRESH_SOLVERS)
def test_worker_answers_each_job(kind: str) -> None:
    """A worker reads SMT-LIB, checks it in a new solver and answers the job's verdict."""
    x = z3.Int("x")
    unsat, sat = z3.Solver(), z3.Solver()
    unsat.add(x > 2, x < 1)
    sat.add(x > 2, x < 4)
    proc = _worker(kind)
    try:
        _ask(proc, {"job": 7, "smt2": unsat.to_smt2(), "timeout_ms": 10_000})
        _ask(proc, {"job": 8, "smt2": sat.to_smt2(), "timeout_ms": 10_000})
        assert proc.stdout is not None
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert answers == [{"job": 7, "verdict": "unsat"}, {"job": 8, "verdict": "sat"}]
    assert proc.returncode == 0  # the end of its input stops it


def test_racer_gives_the_verdict_and_stops_its_workers() -> None:
    """Queries under assumptions, as the proofs send them: unsat and sat come back, whoever answers first."""
    x, y = z3.Int("x"), z3.Int("y")
    a, b = z3.Bool("a"), z3.Bool("b")
    solver = z3.Solver()
    solver.add(a == (x > y), b == (y > x))
    with FreshRacer(0.0) as racer:
        verdict, winner = racer.check(solver, [a, b], lambda: 10_000)
        assert verdict == z3.unsat and winner in ("proof", *FRESH_SOLVERS)
        verdict, winner = racer.check(solver, [a, z3.Not(b)], lambda: 10_000)
        assert verdict == z3.sat and winner in ("proof", *FRESH_SOLVERS)
        procs = list(racer._procs.values())
        assert len(procs) == len(FRESH_SOLVERS)
    assert all(p.returncode is not None for p in procs)


def _fake_worker(program: str) -> type[FreshRacer]:
    """A racer whose one worker (kind ``"fake"``) is ``program`` instead of a solver."""

    class Racer(FreshRacer):
        def __init__(self, after_s: float) -> None:
            super().__init__(after_s, kinds=("fake",))
            self.started: list[subprocess.Popen] = []

        def _start(self, kind: str) -> None:
            import threading

            proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.started.append(proc)
            self._procs[kind] = proc
            self._listeners.append(threading.Thread(target=self._listen, args=(kind, proc.stdout), daemon=True))
            self._listeners[-1].start()

    return Racer


INSTANT = """
import json, sys
for line in sys.stdin:
    print(json.dumps({"job": json.loads(line)["job"], "verdict": "unsat"}), flush=True)
"""

SILENT = """
import sys, time
for line in sys.stdin:
    time.sleep(3600)
"""


def test_a_worker_answer_ends_the_proof_solver_search() -> None:
    """The proof's solver, on a query that takes it minutes (pigeonhole 12), stops at its next slice when a worker answers."""
    solver = z3.Solver()
    lit = z3.Bool("lit")
    solver.add(lit == z3.And(*_pigeonhole(12)))
    t0 = time.monotonic()
    with _fake_worker(INSTANT)(0.0) as racer:
        verdict, winner = racer.check(solver, [lit], lambda: max(1, int((300 - (time.monotonic() - t0)) * 1000)))
    assert (verdict, winner) == (z3.unsat, "fake")
    assert time.monotonic() - t0 < 60
    # The solver was stopped by its own timeout, not interrupted: it answers the next query.
    solver.set("timeout", 10_000)
    assert solver.check(z3.Not(lit)) == z3.sat


def test_a_worker_still_busy_is_replaced() -> None:
    """When the proof's solver wins, a worker still on the query is killed and a new one started."""
    x = z3.Int("x")
    a = z3.Bool("a")
    solver = z3.Solver()
    solver.add(a == (x > x))
    with _fake_worker(SILENT)(0.0) as racer:
        verdict, winner = racer.check(solver, [a], lambda: 10_000)
        assert (verdict, winner) == (z3.unsat, "proof")
        assert len(racer.started) == 2
        first, second = racer.started
        assert first.returncode is not None  # killed, still asleep on the query
        assert second.poll() is None and racer._procs["fake"] is second
    assert second.returncode is not None  # close() stopped the new one
