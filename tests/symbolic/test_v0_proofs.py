"""Z3 proofs for the v0 encoding: every transition preserves every v0 invariant, lemma and model assertion.

Target bounds R = 4 request slots, B = 8 GPU blocks, C = 8 CPU blocks, block
size 2. ``-m symbolic`` proves the cheap transitions at the target (policy
priority's ``priority_sort_running`` and ``priority_end`` among them) and the
expensive ones at R = 3, B = 4, C = 4; ``-m deep`` proves the expensive ones
(those that allocate: ``prefill_admit``, ``running_append``,
``running_preempt_swap``, ``swapped_swap_in``, and the ones that free a
table, ``priority_force_preempt`` among them) and the order theorem at the target. Each proof runs in a fresh process
(Z3's global context slows a proof that runs after many others).

The proof machinery is tested too: a deliberately false invariant must fail
with a counterexample that breaks it; a mutated transition must fail; every
transition's premises must be satisfiable (no proof is vacuous), also with
each named branch; and the two transitions the bounds make unreachable
(``prefill_ignore``, ``swapped_ignore``: NEVER needs a watermark, i.e. at
least 100 GPU blocks, under ``max_model_len <= block_size * num_gpu_blocks``)
are reported vacuous, not proved. Each priority transition, deliberately
broken, must fail its proof on the goal its bug breaks.
"""

from __future__ import annotations

from typing import Any

import pytest
import z3

from schedconf.spec.symbolic.v0.invariants import INVARIANTS
from schedconf.spec.symbolic.v0.proofs import (
    FAILED,
    PROVED,
    VACUOUS,
    premises,
    prove,
    prove_isolated,
    prove_theorem_rank,
)
from schedconf.spec.symbolic.v0.state import PRIORITY_LOOP, PRIORITY_SORT, WAITING, Shape, State
from schedconf.spec.symbolic.v0.transitions import (
    TRANSITIONS,
    Outcome,
    at,
    priority_end,
    priority_force_preempt,
    priority_sort_running,
    running_preempt_recompute,
    set_field,
)
from schedconf.spec.symbolic.z3ops import count, ite, land, lor, to_bool

TARGET = Shape(4, 8, 8, 2)
SMALL = Shape(3, 4, 4, 2)
CI_TIMEOUT_S = 300.0
UNREACHABLE = ("prefill_ignore", "swapped_ignore")
"""NEVER needs int(0.01 * num_gpu_blocks) >= 1, i.e. >= 100 GPU blocks (never_prompt witnesses it there)."""
EXPENSIVE = (
    "prefill_admit",
    "running_append",
    "running_preempt_recompute",
    "running_preempt_swap",
    "swapped_swap_in",
    "update_append_token",
    "abort",
    "priority_force_preempt",
)
"""Proved at the target under ``deep``; their times are in the README's v0 proof table."""
CHEAP = tuple(n for n in TRANSITIONS if n not in EXPENSIVE)


def _assert_result(res: Any, expected: str = PROVED) -> None:
    failing = {g: s for g, s in res.goals.items() if s != PROVED}
    details = "\n\n".join(c.render() for c in res.counterexamples[:1])
    assert res.status == expected, f"{res.transition} at {res.shape.label()}: {res.status} {failing}\n{details}"


def _expected(name: str) -> str:
    return VACUOUS if name in UNREACHABLE else PROVED


@pytest.mark.symbolic
def test_theorem_rank_small() -> None:
    """The n front blocks of a deque of distinct keys are n blocks; ranks follow keys (4 blocks, CI's shape)."""
    _assert_result(prove_theorem_rank(SMALL.num_blocks, CI_TIMEOUT_S))


@pytest.mark.deep
def test_theorem_rank_target() -> None:
    """The same for 8 blocks (both devices at the target)."""
    _assert_result(prove_theorem_rank(TARGET.num_blocks, 900))


@pytest.mark.symbolic
@pytest.mark.parametrize("name", CHEAP)
def test_transition_at_target(name: str) -> None:
    """Inv and lemmas and guard imply the model's assertions, lemmas and Inv after, at R=4, B=8, C=8."""
    _assert_result(prove_isolated(TARGET, name, CI_TIMEOUT_S), _expected(name))


@pytest.mark.deep
@pytest.mark.parametrize("name", EXPENSIVE)
def test_expensive_transition_at_target(name: str) -> None:
    """The transitions that allocate or free, at R=4, B=8, C=8."""
    _assert_result(prove_isolated(TARGET, name, 1800), _expected(name))


@pytest.mark.symbolic
@pytest.mark.parametrize("name", EXPENSIVE)
def test_expensive_transition_small(name: str) -> None:
    """The same transitions at R=3, B=4, C=4 (CI)."""
    _assert_result(prove_isolated(SMALL, name, CI_TIMEOUT_S), _expected(name))


MODEL_SHAPE = Shape(2, 3, 2, 2)


@pytest.mark.symbolic
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_model_invariants_small(name: str) -> None:
    """The rules of spec/v0/invariants.py (the model's own, through model_view.ModelView) are preserved too, at R=2, B=3, C=2."""
    res = prove(MODEL_SHAPE, name, CI_TIMEOUT_S, model_invariants=True)
    _assert_result(res, _expected(name))
    if res.status == PROVED:
        assert any(g.startswith("model:") for g in res.goals)


def _inv_a_gpu_block_left(s: Any, o: Any) -> Any:
    """Deliberately false: a GPU block is always free."""
    return o.lt(0, s.num_free_gpu_blocks)


@pytest.mark.symbolic
def test_false_invariant_fails() -> None:
    """A false rule fails with a counterexample whose state after the transition breaks it."""
    invariants = dict(INVARIANTS, a_gpu_block_left=_inv_a_gpu_block_left)
    res = prove(Shape(2, 3, 2, 2), "prefill_admit", CI_TIMEOUT_S, goals=["inv:a_gpu_block_left"], invariants=invariants)
    assert res.status == FAILED, res.goals
    cex = res.counterexamples[0]
    assert cex.pre.num_free_gpu > 0 and cex.post.num_free_gpu == 0, cex.render()


def _recompute_keeps_computed(s: State, inp: dict[str, Any]) -> Outcome:
    """Mutated ``running_preempt_recompute``: the victim keeps its computed tokens (no reset_state_for_recompute)."""
    out = running_preempt_recompute(s, inp)
    v = out.facts["victim"]
    from schedconf.spec.symbolic.v0.transitions import at

    return Outcome(
        set_field(out.post, "num_computed_tokens", v, at(s.num_computed_tokens, v)),
        out.guard,
        out.checks,
        out.facts,
        out.premises,
    )


@pytest.mark.symbolic
def test_mutated_transition_fails() -> None:
    """A transition mutated like a plausible model bug fails the proof (waiting_from_scratch)."""
    res = prove(Shape(2, 3, 2, 2), "running_preempt_recompute", CI_TIMEOUT_S, apply=_recompute_keeps_computed)
    assert res.status == FAILED, res.goals
    assert res.goals["inv:waiting_from_scratch"] == FAILED, res.goals
    cex = [c for c in res.counterexamples if c.goal == "inv:waiting_from_scratch"][0]
    assert any(cex.post.status[r] == WAITING and cex.post.num_computed_tokens[r] > 0 for r in cex.post.shape.slots)


BRANCHES = {
    "begin_step": ["skips_prefills"],
    "prefill_admit": ["fills_budget"],
    "prefill_stop": ["later"],
    "running_append": ["new_block"],
    "running_preempt_recompute": ["self_preempted"],
    "running_preempt_swap": ["self_preempted"],
    "end_running_loop": ["preempted"],
    "swapped_stop": ["later"],
    "update_append_token": ["stopped", "length_capped"],
    "abort": ["was_swapped"],
    "priority_sort_running": ["reorders"],
    "priority_force_preempt": ["last_running"],
    "priority_end": ["reorders"],
}


@pytest.mark.symbolic
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_premises_admit_each_branch(name: str) -> None:
    """Premises and guard are satisfiable, also with each named branch (no proof is vacuous), except the two unreachable ones."""
    from schedconf.spec.symbolic.v0.state import fresh_state

    shape = SMALL
    pre = fresh_state(shape, "pre")
    out = TRANSITIONS[name].apply(pre, TRANSITIONS[name].inputs(shape, "in"))
    base = [*premises(pre), to_bool(out.guard), *[to_bool(p) for p in out.premises]]
    for branch in [None, *BRANCHES.get(name, [])]:
        solver = z3.Solver()
        solver.set("timeout", 120_000)
        solver.add(*base, *([to_bool(out.facts[branch])] if branch else []))
        expected = z3.unsat if name in UNREACHABLE else z3.sat
        assert solver.check() == expected, f"{name}: branch {branch or '(any)'} is not {expected}"


# ------------------------------------------------------------------ policy priority: broken transitions


def _sort_running_by_priority_only(s: State, inp: dict[str, Any]) -> Outcome:
    """Broken ``priority_sort_running``: sorts by ``priority`` alone (arrival_time forgotten), ties by old place."""
    out = priority_sort_running(s, inp)
    slots = s.shape.slots

    def before(q: int, r: int) -> Any:
        return lor(
            s.priority[q] < s.priority[r], land(s.priority[q] == s.priority[r], s.running_pos[q] < s.running_pos[r])
        )

    pos = [
        ite(s.in_running[r], count(land(s.in_running[q], before(q, r)) for q in slots if q != r), s.running_pos[r])
        for r in slots
    ]
    return Outcome(out.post.replace(running_pos=pos), out.guard, out.checks, out.facts, out.premises)


def _end_without_sorting_waiting(s: State, inp: dict[str, Any]) -> Outcome:
    """Broken ``priority_end``: ``waiting`` is not re-sorted (the head and the victims stay in front)."""
    out = priority_end(s, inp)
    return Outcome(out.post.replace(waiting_pos=list(s.waiting_pos)), out.guard, out.checks, out.facts, out.premises)


def _force_preempt_keeps_blocks(s: State, inp: dict[str, Any]) -> Outcome:
    """Broken ``priority_force_preempt``: the victim goes back to waiting without ``free_seq`` (its GPU table stays)."""
    out = priority_force_preempt(s, inp)
    v = out.facts["victim"]
    post = out.post.replace(
        gpu_ref_cnt=s.gpu_ref_cnt,
        gpu_in_free=s.gpu_in_free,
        gpu_free_key=s.gpu_free_key,
        gpu_free_lo=s.gpu_free_lo,
        num_free_gpu=s.num_free_gpu,
        held=s.held,
        table_pos=s.table_pos,
    )
    post = set_field(post, "num_blocks", v, at(s.num_blocks, v))
    return Outcome(post, out.guard, out.checks, out.facts, out.premises)


BROKEN_PRIORITY = {
    "priority_sort_running": (_sort_running_by_priority_only, "lemma:priority"),
    "priority_end": (_end_without_sorting_waiting, "lemma:priority"),
    "priority_force_preempt": (_force_preempt_keeps_blocks, "lemma:requests"),
}


@pytest.mark.symbolic
@pytest.mark.parametrize("name", list(BROKEN_PRIORITY))
def test_broken_priority_transition_fails(name: str) -> None:
    """Each priority transition, deliberately broken, fails its proof on the goal the bug breaks."""
    broken, goal = BROKEN_PRIORITY[name]
    res = prove(Shape(2, 3, 2, 2), name, CI_TIMEOUT_S, apply=broken)
    assert res.status == FAILED, res.goals
    assert res.goals[goal] == FAILED, res.goals
    cex = [c for c in res.counterexamples if c.goal == goal][0]
    assert cex.pre.priority_policy and cex.pre.phase in (PRIORITY_SORT, PRIORITY_LOOP), cex.render()
