"""Race a query of the proof's solver against fresh solvers in processes of their own (issue 14, speed).

A proof's solver is incremental: its queries pass the premises and the goals
proved so far as assumptions, so Z3 keeps what it learns from query to query
but cannot preprocess them. A new solver with everything asserted is
preprocessed, and on some queries it is much faster (the record rule of
``lemma:step`` after a self-preemption at R=6, B=12: 0.8 s against unknown
after 140 s), on others much slower (``waiting_admit``'s touch stepping stone:
26-31 s against about 3 s). Which one wins is not predictable (Z3 is
sensitive to the order of its terms: the same query read back from SMT-LIB
took over 60 s where it took 13.5 s as built), so a fixed rule for when to go
fresh was a gamble either way; run side by side, a query costs about the
faster of the two.

The fresh solvers run in worker processes (:func:`serve`, ``python -m spec.symbolic.race KIND``), not threads: two
Z3 contexts in one Python process share its heap, and the garbage collector
may release one context's objects from the thread of the other while that
context is in a check, which Z3 does not allow (a thread race was tried and
reverted at stop 23 after a CI failure it may have caused). The query travels
as SMT-LIB text (``Solver.to_smt2``: 0.1 s for 1.9 MB; read back in 0.2 s).
Nothing is interrupted: ``Context.interrupt`` stopping the proof's solver
mid-check made it answer ``sat`` to valid queries (a proof at R=3, B=3 under
priority reported bogus counterexamples in 3 runs of 11; none in 8 runs
without the interrupt), so the proof's solver runs in slices of at most
:data:`SLICE_S` (Z3's own timeout, which the proofs have always used) and
looks for a worker's answer between them, and a worker still busy with a
decided query is killed and started again (a new process, warm by the next
race).

Two workers race the proof's solver, each with another fresh solver
(:data:`FRESH_SOLVERS`), because no single configuration is safe: on the two
slowest queries at R=6, B=12 (read back from SMT-LIB, 40-100 s limits),
``waiting_admit``'s ``lemma:requests`` for the admitted slot took over 60 s with
Z3's default solver and 12.4 s with a preprocessing chain before the SMT core,
and ``running_preempt``'s ``victim_order`` after a self-preemption under priority
took 5.2 s with the default solver and over 100 s with the chain.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable

import z3

FRESH_SOLVERS = ("default", "chain")
"""The workers' solvers: Z3's default solver, and its preprocessing tactics (:data:`CHAIN`) then the
SMT core; each on everything asserted."""

CHAIN = ("simplify", "propagate-values", "solve-eqs", "elim-uncnstr", "smt")

SLICE_S = (0.25, 0.5, 1.0)
"""The proof's solver's slices during a race: the first ones, then the last one on and on."""


def make_solver(kind: str) -> z3.Solver:
    """A new solver of kind ``kind`` (one of :data:`FRESH_SOLVERS`)."""
    if kind == "chain":
        return z3.Then(*CHAIN).solver()
    assert kind == "default", kind
    return z3.Solver()


def serve(kind: str, inp: IO[bytes], out: IO[bytes]) -> None:
    """A worker process: check each job's SMT-LIB text in a new solver of ``kind`` and answer its verdict.

    JSON lines in: ``{"job": id, "smt2": text, "timeout_ms": n}``; the end of input stops it.
    Lines out: ``{"job": id, "verdict": "sat" | "unsat" | "unknown"}``, one per job.
    """
    for line in inp:
        job = json.loads(line)
        solver = make_solver(kind)
        solver.from_string(job["smt2"])
        solver.set("timeout", job["timeout_ms"])
        verdict = solver.check()
        try:
            out.write(json.dumps({"job": job["job"], "verdict": str(verdict)}).encode() + b"\n")
            out.flush()
        except (BrokenPipeError, OSError):
            return


class FreshRacer:
    """The proof's side of the race: a worker process per fresh solver, started at the first race, stopped on ``close``.

    ``after_s``: how long a query runs alone in the proof's solver before the
    workers race it (most queries are answered sooner, and sending one costs
    about 0.1 s of the proof's time).
    """

    def __init__(self, after_s: float, kinds: tuple[str, ...] = FRESH_SOLVERS) -> None:
        self.after_s = after_s
        self.kinds = kinds
        self._lock = threading.Lock()
        self._answers: dict[int, dict[str, str]] = {}
        self._next_job = 0
        self._procs: dict[str, Any] = {}
        self._listeners: list[threading.Thread] = []

    def __enter__(self) -> "FreshRacer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for kind in list(self._procs):
            self._stop(kind, kill=False)
        for listener in self._listeners:
            listener.join(2)  # each ends at its worker's end of output
        self._listeners = []

    def _stop(self, kind: str, kill: bool) -> None:
        proc = self._procs.pop(kind)
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        if kill:
            proc.kill()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _start(self, kind: str) -> None:
        # A plain subprocess, not multiprocessing: a spawned child would re-run the caller's
        # main script, which a script calling prove() without a __main__ guard cannot survive.
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen([sys.executable, "-m", "spec.symbolic.race", kind], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)
        self._procs[kind] = proc
        self._listeners.append(threading.Thread(target=self._listen, args=(kind, proc.stdout), daemon=True))
        self._listeners[-1].start()

    def _listen(self, kind: str, out: IO[bytes]) -> None:
        """Record a worker's answers (until its output ends: stopped or killed)."""
        with out:
            for line in out:
                msg = json.loads(line)
                with self._lock:
                    if msg["job"] in self._answers:
                        self._answers[msg["job"]][kind] = msg["verdict"]

    def check(self, solver: z3.Solver, query: list[z3.BoolRef], remaining_ms: Callable[[], int]) -> tuple[Any, str]:
        """``query`` in ``solver`` (again) while the workers check it in fresh solvers; the first verdict wins.

        Returns ``(verdict, winner)``: ``winner`` is ``"proof"``, a worker's kind, or ``"neither"``
        (``unknown``: all ran out of time). A ``sat`` from a worker carries no model: the caller
        reads one in this process.
        """
        for kind in self.kinds:
            if kind not in self._procs:
                self._start(kind)
        fresh = z3.Solver(ctx=solver.ctx)
        fresh.add(*solver.assertions(), *query)
        line = json.dumps({"job": self._next_job, "smt2": fresh.to_smt2(), "timeout_ms": remaining_ms()}).encode()
        del fresh
        job = self._next_job
        self._next_job += 1
        with self._lock:
            self._answers[job] = {}
        for proc in self._procs.values():
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
        verdict, winner = z3.unknown, "neither"
        for n in itertools.count():
            if remaining_ms() <= 1:
                break
            solver.set("timeout", min(remaining_ms(), int(SLICE_S[min(n, len(SLICE_S) - 1)] * 1000)))
            verdict = solver.check(*query)
            if verdict != z3.unknown:
                winner = "proof"
                break
            with self._lock:
                answers = dict(self._answers[job])
            decided = [kind for kind in self.kinds if answers.get(kind, "unknown") != "unknown"]
            if decided:
                winner = decided[0]
                verdict = z3.sat if answers[winner] == "sat" else z3.unsat
                break
            if len(answers) == len(self.kinds):
                break  # every worker ran out of time
        with self._lock:
            answers = self._answers.pop(job)
        for kind in self.kinds:
            if kind not in answers:
                # Still on this query: a new worker instead of an interrupted one.
                self._stop(kind, kill=True)
                self._start(kind)
        return verdict, winner


if __name__ == "__main__":
    serve(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
