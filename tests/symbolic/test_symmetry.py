"""Slot symmetry (``spec/symbolic/symmetry.py``): the checks that let a proof keep only slot 0 must hold, and must fail when they should.

The reduction rests on two obligations, both proved by Z3: the premises are
blind to slot names (``theorem_symmetry``, once per shape) and every
transition commutes with the permutation that takes a case to the canonical
one (the goal ``symmetry`` of each proof). The negative tests break each of
them on purpose: a lemma that singles out slot 0, and a transition that
writes to slot 0 whichever slot acts, or that acts on a second slot it does
not declare.
"""

from __future__ import annotations

import dataclasses

import pytest
import z3

from schedconf.spec.symbolic import state as state_module
from schedconf.spec.symbolic.proofs import FAILED, PROVED, prove, prove_theorem_symmetry
from schedconf.spec.symbolic.state import Shape, fresh_state
from schedconf.spec.symbolic.symmetry import (
    canonical_cases,
    check_equivariance,
    check_premises_symmetric,
    map_slot,
    permute,
    reductions,
    transposition,
)
from schedconf.spec.symbolic.transitions import TRANSITIONS, Outcome, abort_idle, put

TARGET = (4, 8)
TIMEOUT_S = 240.0


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_theorem_symmetry(policy: str) -> None:
    """Every invariant and lemma holds of a state iff it holds with two slots swapped (R=4, B=8)."""
    res = prove_theorem_symmetry(Shape(*TARGET, 2, policy), TIMEOUT_S)
    assert res.status == PROVED, res


def test_reductions_reach_the_canonical_cases() -> None:
    """Each permutation takes its case to a canonical one, and together the cases are every slot (pair)."""
    shape = Shape(4, 2)
    for actor in [("slot",), ("case_request", "case_victim")]:
        canonical = canonical_cases(actor)
        seen = [c for c in canonical]
        for case, pi in reductions(shape, actor):
            assert sorted(pi) == sorted(pi.values()), pi  # a permutation of the slots
            moved = {key: pi.get(v, v) for key, v in case.items()}
            assert moved in canonical, (case, pi, moved)
            seen.append(case)
        expected = 4 if len(actor) == 1 else 16
        assert len(seen) == expected and len({tuple(c.items()) for c in seen}) == expected, seen


def test_permute_moves_slots_and_slot_values() -> None:
    """``permute`` moves per-slot rows and maps slot-valued scalars; blocks and records stay."""
    shape = Shape(3, 2)
    s = fresh_state(shape, "s")
    pi = transposition(0, 2)
    t = permute(s, pi)
    assert t.status[0] is s.status[2] and t.status[2] is s.status[0] and t.status[1] is s.status[1]
    assert t.held[0] is s.held[2] and t.hashes[2] is s.hashes[0]
    assert t.ref_cnt is s.ref_cnt and t.rec_priority is s.rec_priority and t.rec_num_candidates is s.rec_num_candidates
    assert map_slot(pi, 0) == 2 and map_slot(pi, 1) == 1 and map_slot(pi, 7) == 7
    # Twice is the identity: the same leaves, and alloc_request the same value.
    back = permute(t, pi)
    assert all(x is y for (name, x, _), (_, y, _) in zip(back.leaves(), s.leaves()) if name != "alloc_request")
    solver = z3.Solver()
    solver.add(back.alloc_request != s.alloc_request)
    assert solver.check() == z3.unsat


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("name", ["waiting_admit", "running_preempt", "append_token"])
def test_equivariance_small(name: str, policy: str) -> None:
    """The transitions whose acting slot is derived (the waiting head, the victim) or an input commute with the reductions (R=3, B=4)."""
    status, _, failures = check_equivariance(Shape(3, 4, 2, policy), TRANSITIONS[name], TIMEOUT_S)
    assert status == PROVED, failures


def _lemma_slot0_not_running(s, o):  # noqa: ANN001, ANN202
    """Singles out slot 0 (true of some states, and not blind to slot names)."""
    return o.not_(s.in_running[0])


def test_premise_naming_a_slot_breaks_the_theorem(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lemma that singles out slot 0 makes ``theorem_symmetry`` fail."""
    monkeypatch.setattr(state_module, "LEMMAS", {**state_module.LEMMAS, "slot0": _lemma_slot0_not_running})
    import schedconf.spec.symbolic.premises as premises_module  # where the premises read the lemmas

    monkeypatch.setattr(premises_module, "LEMMAS", state_module.LEMMAS)
    status, _ = check_premises_symmetric(Shape(3, 3, 2, "fcfs"), TIMEOUT_S)
    assert status == FAILED


def _abort_marks_slot0(s, inp):  # noqa: ANN001, ANN202
    """``abort`` that also raises slot 0's priority, whichever slot is aborted."""
    out = abort_idle(s, inp)
    return Outcome(
        out.post.replace(priority=put(out.post.priority, 0, out.post.priority[0] + 1)),
        out.guard,
        out.checks,
        out.facts,
        out.premises,
    )


def _abort_touches_next(s, inp):  # noqa: ANN001, ANN202
    """``abort`` that also raises the priority of the slot after the aborted one: a second acting slot, undeclared."""
    out = abort_idle(s, inp)
    q = inp["slot"]
    nxt = (q + 1) % s.shape.num_reqs if isinstance(q, int) else 0
    return Outcome(
        out.post.replace(priority=put(out.post.priority, nxt, out.post.priority[nxt] + 1)),
        out.guard,
        out.checks,
        out.facts,
        out.premises,
    )


@pytest.mark.symbolic
@pytest.mark.parametrize("broken", [_abort_marks_slot0, _abort_touches_next])
def test_asymmetric_transition_fails_symmetry(broken, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A transition that names a slot other than its acting one fails the ``symmetry`` goal, and so its proof."""
    transition = dataclasses.replace(TRANSITIONS["abort"], apply=broken)
    status, _, failures = check_equivariance(Shape(3, 3, 2, "fcfs"), transition, TIMEOUT_S)
    assert status == FAILED and failures, (status, failures)
    monkeypatch.setitem(TRANSITIONS, "abort", transition)
    res = prove(Shape(3, 3, 2, "fcfs"), "abort", TIMEOUT_S)
    assert res.goals["symmetry"] == FAILED and res.status == FAILED, res.goals
