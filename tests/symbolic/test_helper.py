"""The helper process beside a proof (``spec/symbolic/helper.py``, ``proofs.prove(parallel=True)``).

A query that goes to a fresh solver is checked by the helper while the proof
goes on with the goal assumed; the proof is only reported proved once every
such goal came back ``unsat``. The tests: the text round trip keeps a
query's verdict; a proof with every query sent there proves as before; a
false goal sent there still fails the transition, with a counterexample; and
``settle`` turns what the helper says (or did not get to) into verdicts.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest
import z3

import schedconf.spec.symbolic.proofs as P
from schedconf.spec.symbolic.helper import check_text, render_query
from schedconf.spec.symbolic.state import Shape, SymbolicView
from schedconf.spec.symbolic.transitions import TRANSITIONS
from schedconf.spec.symbolic.z3ops import Z3Ops

SHAPE = Shape(3, 3, 2, "priority")


def test_the_text_keeps_the_verdict() -> None:
    """A query written as SMT-LIB and read in a new solver: x > 2 and x < 5 with x = 3 asserted is sat, with
    x = 7 unsat; the literals of the query are asserted, as ``_check_fresh`` asserts them."""
    x, lit = z3.Int("x"), z3.Bool("goal!0")
    solver = z3.Solver()
    solver.add(lit == z3.And(x > 2, x < 5))
    deadline = time.monotonic() + 30
    assert check_text(render_query(solver, [lit, x == 3]), deadline)[0] == "sat"
    assert check_text(render_query(solver, [lit, x == 7]), deadline)[0] == "unsat"
    assert check_text(render_query(solver, [z3.Not(lit), x == 3]), deadline)[0] == "unsat"


@pytest.mark.symbolic
@pytest.mark.parametrize("name", ["running_preempt", "waiting_admit"])
def test_a_parallel_proof_proves_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every query goes to the helper (the cap made tiny): the proof still proves, the helper's times are
    recorded, and the cases and symmetry goals it checked are proved."""
    monkeypatch.setattr(P, "FRESH_AFTER_S", 1e-4)
    res = P.prove(SHAPE, name, 240, parallel=True)
    assert res.status == P.PROVED, {g: s for g, s in res.goals.items() if s != P.PROVED}
    assert [k for k in res.goal_seconds if k.endswith(" (fresh)")], "no query went to the helper"
    assert res.goals["symmetry"] == P.PROVED and res.goals["cases"] == P.PROVED
    assert P.PENDING not in res.goals.values()


def _inv_nothing_running(s: Any, o: Any) -> Any:
    """Deliberately false: no request is RUNNING."""
    return o.eq(s.num_running, 0)


@pytest.mark.symbolic
def test_a_false_goal_sent_to_the_helper_fails_the_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The goal is assumed while the helper checks it; its ``sat`` makes it a counterexample (read here) and the
    transition is not proved, though the goals after it were proved assuming it."""
    from schedconf.spec.v1 import invariants

    monkeypatch.setattr(P, "FRESH_AFTER_S", 1e-4)
    monkeypatch.setattr(invariants, "INVARIANTS", dict(invariants.INVARIANTS, nothing_running=_inv_nothing_running))
    res = P.prove(SHAPE, "waiting_admit", 240, parallel=True)
    assert res.status == P.FAILED
    assert res.goals["inv:nothing_running"] == P.FAILED
    cex = next(c for c in res.counterexamples if c.goal == "inv:nothing_running")
    out = TRANSITIONS["waiting_admit"].apply(cex.pre, cex.inputs)
    assert out.guard is True
    assert _inv_nothing_running(SymbolicView(out.post), Z3Ops()) is False


def _done(value: Any) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    future.set_result(value)
    return future


def test_settle_turns_the_helpers_answers_into_verdicts() -> None:
    """unsat keeps the goal proved; unknown makes it unknown; sat and a task not started are checked here (the
    recheck); a counterexample already found for a goal is not overwritten; a goal the helper checked (symmetry)
    takes its verdict and time, not the fallback's."""
    rechecked: list[str] = []

    def recheck(key: str, status: str) -> Any:
        return lambda: rechecked.append(key) or status

    result = P.TransitionResult(
        "t", SHAPE, P.PROVED, 0.0, goals={"a": P.PROVED, "b": P.PROVED, "c": P.PROVED, "d": P.PROVED, "e": P.FAILED}
    )
    not_started: concurrent.futures.Future = concurrent.futures.Future()
    pending = [
        P.Pending("a", "k:a", _done(("unsat", 1.5)), recheck("a", P.FAILED)),
        P.Pending("b", "k:b", _done(("unknown", 2.0)), recheck("b", P.PROVED)),
        P.Pending("c", "k:c", _done(("sat", 0.5)), recheck("c", P.FAILED)),
        P.Pending("d", "k:d", not_started, recheck("d", P.PROVED)),
        P.Pending("e", "k:e", _done(("unknown", 1.0)), recheck("e", P.PROVED)),
    ]
    deferred = {"symmetry": (_done((P.PROVED, 3.0)), lambda: (P.FAILED, 0.0))}
    P.settle(result, deferred, pending, time.monotonic() + 10)
    assert result.goals == {
        "a": P.PROVED,
        "b": P.UNKNOWN,
        "c": P.FAILED,
        "d": P.PROVED,
        "e": P.FAILED,
        "symmetry": P.PROVED,
    }
    assert rechecked == ["d", "c"]  # the task not started is taken back first; the sat one is checked while settling
    assert result.goal_seconds["k:a (fresh)"] == 1.5 and result.goal_seconds["symmetry"] == 3.0


def test_close_stops_a_helper_that_overruns() -> None:
    """A task that runs past its deadline (here a 600 s sleep) does not hold the proof: close() gives it 5 s, then
    stops the process."""
    from schedconf.spec.symbolic.helper import Helper

    helper = Helper()
    future = helper.submit(time.sleep, 600)
    deadline = time.monotonic() + 120
    while not future.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert future.running()
    t0 = time.monotonic()
    helper.close()
    assert time.monotonic() - t0 < 120  # far below the sleep: the process was stopped, not waited for
