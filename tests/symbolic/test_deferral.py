"""Prefill deferral in the encoding: ``inv_deferred_step_carries_no_prefill`` is proved, not vacuous.

``schedule(throttle_prefills)`` and ``prefill_schedule_interval`` hold prefill
back (``Scheduler.is_prefill_deferred``); the encoding states both
(``transitions.is_prefill_deferred``, ``holds_running_request``,
``holds_admission``, ``end_schedule``). ``test_proofs.py`` proves every
transition keeps the invariant; these tests check that this says something:

* under the premises of the proofs, a step that holds prefill back and
  schedules tokens exists, reached by the throttle and by the cadence alone;
* an encoding that drops either hold fails its proof, on the invariant (the
  waiting loop) or on the lemma that carries it (the running loop).

The drift guard's throttled programs are in ``test_drift_guard.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import z3

import schedconf.spec.symbolic.transitions as T
from schedconf.spec.symbolic.proofs import FAILED, premises, prove
from schedconf.spec.symbolic.state import IDLE, Shape, SymbolicView, fresh_state

TARGET = Shape(4, 8, 2, "fcfs")
SMALL = Shape(2, 3, 2, "fcfs")
TIMEOUT_S = 240.0


def _sat(*constraints: Any) -> bool:
    solver = z3.Solver()
    solver.set("timeout", 60000)
    solver.add(*constraints)
    return solver.check() == z3.sat


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("by", ["throttle", "cadence"])
def test_begin_step_can_hold_prefill(by: str, policy: str) -> None:
    """From a state the proofs assume, schedule() holds prefill back on the throttle, and on the cadence with the throttle off."""
    shape = Shape(4, 8, 2, policy)
    s = fresh_state(shape, "pre")
    throttle = z3.Bool("throttle")
    out = T.TRANSITIONS["begin_step"].apply(s, {"throttle_prefills": throttle})
    pinned = [throttle] if by == "throttle" else [z3.Not(throttle), s.prefill_schedule_interval > 1]
    assert _sat(*premises(s), out.guard, *pinned, out.post.defer_prefills)
    # Never with neither cause.
    assert not _sat(
        *premises(s), out.guard, z3.Not(throttle), s.prefill_schedule_interval == 1, out.post.defer_prefills
    )


@pytest.mark.symbolic
@pytest.mark.parametrize("name", ["running_allocate", "waiting_admit"])
def test_a_deferred_step_schedules_tokens(name: str) -> None:
    """The invariant's premise is live in the proofs: a deferred step's decode or admission schedules tokens (at R=4, B=8)."""
    s = fresh_state(TARGET, "pre")
    out = T.TRANSITIONS[name].apply(s, {})
    view = SymbolicView(out.post)
    scheduled = z3.Or(*(view.num_scheduled_tokens(r) > 0 for r in TARGET.slots))
    assert _sat(*premises(s), out.guard, s.defer_prefills, view.deferred_prefills, scheduled)
    # ... and what it schedules is one token at most per request, as the proof says.
    one = z3.And(*(view.num_scheduled_tokens(r) <= 1 for r in TARGET.slots))
    assert not _sat(*premises(s), out.guard, s.defer_prefills, z3.Not(one))


def test_outside_a_step_nothing_is_deferred() -> None:
    """The view shows a deferral only for the step in progress or pending, as the model's view does."""
    s = fresh_state(SMALL, "s")
    view = SymbolicView(s)
    assert not _sat(s.phase == IDLE, view.deferred_prefills)
    assert _sat(s.in_step(), view.deferred_prefills)


@pytest.mark.symbolic
@pytest.mark.parametrize(
    "hold, transition, goal",
    [
        ("holds_admission", "waiting_admit", "inv:deferred_step_carries_no_prefill"),
        ("holds_running_request", "running_start", "lemma:step"),
    ],
)
def test_proof_fails_without_the_hold(hold: str, transition: str, goal: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoding in which a deferred step admits a prefill, or runs a prefill chunk, fails its proof."""
    monkeypatch.setattr(T, hold, lambda s, *args: False)
    res = prove(SMALL, transition, TIMEOUT_S)
    assert res.status == FAILED, res.goals
    assert res.goals[goal] == FAILED, res.goals
    cex = next(c for c in res.counterexamples if c.goal == goal)
    assert cex.pre.defer_prefills is True
