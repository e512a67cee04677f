"""A second process beside a proof: the queries that need a fresh solver, checked while the proof goes on.

A ``symmetric`` proof sends a query still open after ``proofs.FRESH_AFTER_S``
to a fresh solver with everything asserted (``proofs._check_fresh``). On a
machine with two cores the proof need not wait for it: the query is written
as SMT-LIB text (:func:`render_query`: the proof's assertions and the query's
literals, asserted), checked in this process (:func:`check_text`), and the
proof goes on to the next goal with the goal assumed, as if proved. That is
sound when the proof is only reported proved once every such goal has come
back ``unsat`` (``proofs.settle``): each goal is then proved from the premises
and the goals before it, which by induction on the order are all proved.

The helper holds no Python object of the proof: it gets text and gives back
a verdict, so the two processes share no Z3 context (a thread did, and a
second thread releasing one context's terms during the other's check is what
Z3 does not allow; README, stop 23). It starts with ``spawn``, importing
nothing of the caller's state, so a task that builds terms (``proofs``'
symmetry and cases goals) sees the modules as imported, not as a test
patched them: ``prove`` uses a helper only when asked (``prove_isolated``
and the CLI, each in a fresh process of their own, do).

Writing and reading the text is cheap (``waiting_admit`` at R=6, B=12: the
premises are 0.5 MB of SMT-LIB, written in 11 ms and read in 26 ms).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import z3


def get_fresh_solver(solver: z3.Solver, query: list[z3.BoolRef]) -> z3.Solver:
    """A new solver holding ``solver``'s assertions with the ``query`` literals asserted (``proofs._check_fresh``)."""
    fresh = z3.Solver()
    fresh.add(*solver.assertions(), *query)
    return fresh


def render_query(solver: z3.Solver, query: list[z3.BoolRef]) -> str:
    """SMT-LIB text of the fresh solver's query (:func:`get_fresh_solver`), for the helper."""
    return get_fresh_solver(solver, query).to_smt2()


def check_text(text: str, deadline: float) -> tuple[str, float]:
    """Check the SMT-LIB ``text`` in a new solver until ``deadline`` (``time.monotonic``); ``(verdict, seconds)``.

    ``time.monotonic`` is the system's monotonic clock on Linux, the same in every process, so
    the caller's deadline holds here; the seconds include reading the text.
    """
    t0 = time.monotonic()
    solver = z3.Solver()
    solver.from_string(text)
    solver.set("timeout", max(1, int((deadline - t0) * 1000)))
    verdict = solver.check()
    return str(verdict), time.monotonic() - t0


class Helper:
    """One worker process (``spawn``), its tasks run in the order they were submitted."""

    def __init__(self) -> None:
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn")
        )

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future:
        """Run ``fn(*args)`` in the helper (``fn`` a module-level function, the args picklable)."""
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        """Drop the tasks not started; give a running one 5 s more (each ends by the deadline it was given,
        unless Z3 overruns its timeout), then stop the process, so that no proof can hang on its helper."""
        # Python 3.11's pool has no public way to stop a worker: its processes are read before shutdown.
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join()


def result_by(future: concurrent.futures.Future, deadline: float) -> Any:
    """The task's result, or None when it has not come back a few seconds after ``deadline`` or the helper died."""
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
    except (concurrent.futures.TimeoutError, BrokenProcessPool):
        return None
