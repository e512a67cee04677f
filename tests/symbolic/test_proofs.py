"""Z3 proofs: every transition preserves every invariant, lemma and model assertion.

``-m symbolic`` proves each transition at the target bounds (R = 4 request
slots, B = 8 blocks, block size 2) for both policies, and the two order
theorems the transitions instantiate. A proof counts only if its premises are
satisfiable (``prove`` reports ``vacuous`` otherwise). ``-m deep`` adds the
composed loop iterations, other block sizes and larger bounds.

The counterexample path is tested too: with a deliberately false invariant
registered, a proof must fail, the counterexample must be confirmed by the
model on the injected state, and a trace must be found in which the model
breaks that invariant.
"""

from __future__ import annotations

import pytest

from schedconf.spec.symbolic.proofs import (
    PROVED,
    confirm_counterexample,
    counterexample_trace,
    prove,
    prove_isolated,
    prove_theorem_order,
    prove_theorem_rank,
)
from schedconf.spec.symbolic.state import Shape
from schedconf.spec.symbolic.transitions import COMPOSED, TRANSITIONS
from schedconf.spec.symbolic.z3ops import Z3Ops

TARGET_R, TARGET_B = 4, 8
CI_TIMEOUT_S = 240.0


def _assert_proved(res) -> None:  # noqa: ANN001
    failing = {g: s for g, s in res.goals.items() if s != PROVED}
    details = "\n\n".join(c.render() for c in res.counterexamples[:1])
    assert res.status == PROVED, f"{res.transition} at {res.shape.label()}: {res.status} {failing}\n{details}"


@pytest.mark.symbolic
def test_theorem_rank() -> None:
    """The n front blocks of a free queue of distinct keys are n blocks; ranks follow keys (B = 8)."""
    _assert_proved(prove_theorem_rank(Shape(TARGET_R, TARGET_B), timeout_s=CI_TIMEOUT_S))


@pytest.mark.symbolic
def test_theorem_order() -> None:
    """Ranks within any subset follow the keys and stay below the subset's size (8 items)."""
    _assert_proved(prove_theorem_order(TARGET_B, timeout_s=CI_TIMEOUT_S))


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_transition_preserves_invariants(name: str, policy: str) -> None:
    """Inv and lemmas and guard imply Inv, lemmas and the model's assertions after, at R=4, B=8."""
    _assert_proved(prove_isolated(Shape(TARGET_R, TARGET_B, 2, policy), name, CI_TIMEOUT_S))


@pytest.mark.symbolic
@pytest.mark.parametrize("name", list(COMPOSED))
def test_composed_iterations_small(name: str) -> None:
    """The whole loop iterations (composed of the steps) at small bounds."""
    _assert_proved(prove_isolated(Shape(2, 3, 2, "priority"), name, CI_TIMEOUT_S))


@pytest.mark.symbolic
def test_proof_by_cases() -> None:
    """Splitting a proof on the request and victim slots proves the same, plus that the cases cover the guard."""
    import dataclasses

    split = dataclasses.replace(TRANSITIONS["running_preempt"], split=("case_request", "case_victim"))
    original = TRANSITIONS["running_preempt"]
    TRANSITIONS["running_preempt"] = split
    try:
        res = prove(Shape(2, 3, 2, "priority"), "running_preempt", CI_TIMEOUT_S)
    finally:
        TRANSITIONS["running_preempt"] = original
    _assert_proved(res)
    assert res.goals["cases"] == PROVED
    assert any(key.startswith("case_request=1,case_victim=0:") for key in res.goal_seconds)


@pytest.mark.deep
@pytest.mark.parametrize("block_size", [1, 3])
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_other_block_sizes(name: str, block_size: int) -> None:
    """Block sizes 1 and 3 at the target bounds, both policies."""
    for policy in ("fcfs", "priority"):
        _assert_proved(prove_isolated(Shape(TARGET_R, TARGET_B, block_size, policy), name, 900))


@pytest.mark.deep
@pytest.mark.parametrize("name", list(COMPOSED))
def test_composed_iterations_target(name: str) -> None:
    """The whole loop iterations at the largest bounds they reach within the deep budget."""
    _assert_proved(prove_isolated(Shape(3, 5, 2, "priority"), name, 1800))


@pytest.mark.deep
@pytest.mark.parametrize("num_blocks", range(1, TARGET_B))
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_smaller_pools(name: str, num_blocks: int) -> None:
    """The target covers exactly B = 8 usable blocks; the smaller pools, both policies."""
    for policy in ("fcfs", "priority"):
        _assert_proved(prove_isolated(Shape(TARGET_R, num_blocks, 2, policy), name, 900))


@pytest.mark.deep
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_larger_bounds(name: str) -> None:
    """R = 5, B = 10."""
    _assert_proved(prove_isolated(Shape(5, 10, 2, "priority"), name, 1800))


def _inv_free_blocks_uncached(s, o):  # noqa: ANN001, ANN202
    """Deliberately false: a block in the free queue carries no hash."""
    return o.forall(s.blocks, lambda b: o.implies(s.in_free_queue(b), o.not_(s.is_cached(b))), lambda b: f"block {b}")


def _false_invariant_counterexample() -> dict:
    """In a fresh process: register the false invariant, prove ``abort`` against it, confirm, trace."""
    from schedconf.spec.v1 import invariants

    invariants.INVARIANTS = dict(invariants.INVARIANTS, free_blocks_uncached=_inv_free_blocks_uncached)
    res = prove(Shape(2, 4, 2, "fcfs"), "abort", 120, goals=["inv:free_blocks_uncached"])
    if not res.counterexamples:
        return {"status": res.status}
    cex = res.counterexamples[0]
    trace = counterexample_trace(cex, "abort")
    return {
        "status": res.status,
        "post_violates": any(cex.post.in_free[b] and cex.post.cached[b] for b in cex.post.shape.blocks),
        "confirmed": confirm_counterexample(cex, "abort"),
        "trace": None if trace is None else (trace.events[-1]["kind"], trace.header["description"]),
    }


@pytest.mark.symbolic
def test_counterexample_is_confirmed_and_traced() -> None:
    """A false invariant yields a counterexample that the model confirms and a trace that breaks it.

    Run in a fresh process, like every figure of the proof table: which
    counterexample Z3 returns depends on what the process built before.
    """
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(_false_invariant_counterexample).result()
    assert got["status"] == "counterexample", got
    assert got["post_violates"], got
    assert got["confirmed"] is not None and got["confirmed"].startswith("free_blocks_uncached"), got
    assert got["trace"] is not None, "no trace reaching the violation was found"
    kind, description = got["trace"]
    assert kind == "abort" and "free_blocks_uncached" in description, got


def _split_false_invariant_counterexamples() -> dict:
    """In a fresh process: the false invariant proved by parts, in two groups and one part per slot; both must fail."""
    from schedconf.spec.symbolic import proofs
    from schedconf.spec.v1 import invariants

    invariants.INVARIANTS = dict(invariants.INVARIANTS, free_blocks_uncached=_inv_free_blocks_uncached)
    got = {}
    for how in [(1, 2), (2, proofs.SLOTS)]:
        proofs.GOAL_SPLITS["abort"] = {"inv:free_blocks_uncached": how}
        res = prove(Shape(2, 4, 2, "fcfs"), "abort", 120, goals=["inv:free_blocks_uncached"])
        cex = res.counterexamples[0] if res.counterexamples else None
        got[how] = {
            "status": res.status,
            "goal": cex and cex.goal,
            "confirmed": cex and confirm_counterexample(cex, "abort"),
        }
    return got


@pytest.mark.symbolic
def test_split_goals_still_fail() -> None:
    """A false invariant proved by parts still yields a counterexample the model confirms."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(_split_false_invariant_counterexamples).result()
    for how, one in got.items():
        assert one["status"] == "counterexample", (how, got)
        assert one["goal"] == "inv:free_blocks_uncached", (how, got)
        assert one["confirmed"] is not None and one["confirmed"].startswith("free_blocks_uncached"), (how, got)


def test_goal_parts_are_the_goal() -> None:
    """``goal_parts`` flattens nested conjunctions and regroups them; the parts' conjunction is the goal."""
    import z3

    from schedconf.spec.symbolic.proofs import goal_parts

    a, b, c, d, e = z3.Bools("a b c d e")
    goal = z3.And(z3.And(a, z3.And(b, c)), d, z3.Or(e, a))
    assert [str(p) for p in goal_parts(goal, 1, 100)] == ["And(a, And(b, c))", "d", "Or(e, a)"]
    assert [str(p) for p in goal_parts(goal, 3, 100)] == ["a", "b", "c", "d", "Or(e, a)"]
    assert [str(p) for p in goal_parts(goal, 3, 2)] == ["And(a, b, c)", "And(d, Or(e, a))"]
    for depth, chunks in [(1, 1), (2, 2), (3, 4)]:
        solver = z3.Solver()
        solver.add(z3.Not(z3.And(*goal_parts(goal, depth, chunks)) == goal))
        assert solver.check() == z3.unsat
    assert goal_parts(a, 2, 3) == [a]


@pytest.mark.symbolic
@pytest.mark.parametrize("name", ["touch", "running_preempt", "waiting_admit"])
def test_methods_agree_small(name: str) -> None:
    """The three methods prove alike at R=3, B=3: ``plain`` (the path before issue 14), ``named`` (stepping stones,
    goals by parts) and the default ``symmetric`` (``named`` for slot 0 only, with the cover and symmetry goals)."""
    from schedconf.spec.symbolic.proofs import METHODS, PLAIN, SYMMETRIC

    for method in METHODS:
        res = prove(Shape(3, 3, 2, "priority"), name, CI_TIMEOUT_S, method=method)
        _assert_proved(res)
        stones = [g for g in res.goals if g.startswith("check:stepping stone: ")]
        assert bool(stones) == (method != PLAIN), (method, stones)
        assert ("symmetry" in res.goals) == (method == SYMMETRIC), (method, res.goals)
        cases = {key.split(":")[0] for key in res.goal_seconds if key not in ("symmetry", "cases")}
        if method == SYMMETRIC:
            # Only the canonical cases: the acting slot is slot 0, a victim slot 0 (itself) or 1.
            canonical = {"slot=0", "case_request=0", "case_request=0,case_victim=0", "case_request=0,case_victim=1"}
            assert cases and cases <= canonical, cases
            assert res.goals["cases"] == PROVED


BRANCHES = {
    "running_preempt": ["self_preempted", "victim_was_scheduled"],
    "running_start": ["skipped"],
    "waiting_admit": ["whole_prompt_cached"],
    "waiting_stop": ["refused"],
    "append_token": ["stopped", "length_capped_at_max_model_len"],
    "end_schedule": ["budget_exhausted"],
}


@pytest.mark.symbolic
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_premises_admit_each_branch(name: str) -> None:
    """Premises and guard are satisfiable, also together with each named branch (no proof is vacuous there)."""
    import z3

    from schedconf.spec.symbolic.proofs import premises
    from schedconf.spec.symbolic.state import fresh_state
    from schedconf.spec.symbolic.z3ops import to_bool

    shape = Shape(3, 4, 2, "priority")
    pre = fresh_state(shape, "pre")
    out = TRANSITIONS[name].apply(pre, TRANSITIONS[name].inputs(shape, "in"))
    base = [*premises(pre), to_bool(out.guard), *[to_bool(p) for p in out.premises]]
    for branch in [None, *BRANCHES.get(name, [])]:
        solver = z3.Solver()
        solver.set("timeout", 60_000)
        solver.add(*base, *([to_bool(out.facts[branch])] if branch else []))
        assert solver.check() == z3.sat, f"{name}: no state takes branch {branch or '(any)'}"


def test_phase_fixed_by_guard() -> None:
    """A guard that fixes the phase (``2 == phase`` among nested conjuncts) is read; a disjunction of phases is not."""
    from schedconf.spec.symbolic.proofs import _phase_fixed_by
    from schedconf.spec.symbolic.state import IDLE, RUNNING_LOOP, WAITING_LOOP, fresh_state

    shape = Shape(2, 3, 2, "priority")
    pre = fresh_state(shape, "pre")
    expected = {
        "end_schedule": WAITING_LOOP,
        "end_running_loop": RUNNING_LOOP,
        "waiting_admit": WAITING_LOOP,
        "abort": IDLE,
        "add_request": None,
        "touch": None,
    }
    for name, phase in expected.items():
        out = TRANSITIONS[name].apply(pre, TRANSITIONS[name].inputs(shape, "in"))
        assert _phase_fixed_by(out.guard, pre.phase) == phase, name


def test_pinned_parts_imply_the_goal() -> None:
    """``pinned_parts`` on ``running_preempt``'s new record (R=3, B=3, priority): part ``v`` (the count of
    records before the step is ``v``) states the new record's rule only, the records below it being the
    premise's own terms; the parts, the premise and the range of the count imply the goal; and a post-state
    whose new record names a victim the rule forbids leaves a part that fails."""
    import re

    import z3

    import schedconf.spec.v1.invariants
    from schedconf.spec.symbolic.proofs import pinned_parts
    from schedconf.spec.symbolic.state import SymbolicView, fresh_state

    shape = Shape(3, 3, 2, "priority")
    pre = fresh_state(shape, "pre")
    transition = TRANSITIONS["running_preempt"]
    post = transition.apply(pre, transition.inputs(shape, "in")).post

    def goal_of(s):  # noqa: ANN001, ANN202
        return schedconf.spec.v1.invariants.INVARIANTS["victim_order"](SymbolicView(s), Z3Ops())

    n = pre.num_preemptions
    values = range(shape.num_reqs + 1)
    parts = pinned_parts(goal_of, pre, post, n, values)
    assert len(parts) == len(values)
    for v, part in enumerate(parts):
        assert str(part.arg(0)) == f"pre.num_preemptions == {v}", part
        # No record of the pre-state is left to prove: the rule of record v is on the running requests' keys.
        assert not re.search(r"pre\.rec_\w+\[", str(part.arg(1))), (v, part)
    in_range = z3.Or(*[n == v for v in values])
    solver = z3.Solver()
    solver.add(goal_of(pre), in_range, *parts, z3.Not(goal_of(post)))
    assert solver.check() == z3.unsat
    # The new record's victim moved one place on: some part must fail where the goal does.
    wrong = post.replace(
        rec_victim_pos=[z3.If(r == n, post.rec_victim_pos[r] + 1, post.rec_victim_pos[r]) for r in shape.slots]
    )
    solver = z3.Solver()
    solver.add(goal_of(pre), in_range, z3.Not(goal_of(wrong)))
    assert solver.check() == z3.sat
    solver.add(z3.Not(z3.And(*pinned_parts(goal_of, pre, wrong, n, values))))
    assert solver.check() == z3.sat


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_victim_order_by_count(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``running_preempt`` proves ``inv:victim_order`` one part per count of preemption records (``Pin``), and a
    transition that preempts the head of running instead of the policy's victim fails it."""
    from schedconf.spec.symbolic import transitions
    from schedconf.spec.symbolic.proofs import FAILED

    shape = Shape(3, 3, 2, policy)
    res = prove(shape, "running_preempt", CI_TIMEOUT_S, goals=["inv:victim_order"])
    _assert_proved(res)
    parts = {key.rsplit("#", 1)[1] for key in res.goal_seconds if "inv:victim_order#" in key}
    assert parts == {*map(str, range(shape.num_reqs + 1)), "range"}, res.goal_seconds

    monkeypatch.setattr(transitions, "select_victim", lambda s: transitions.running_at(s, 0))
    res = prove(shape, "running_preempt", CI_TIMEOUT_S, goals=["inv:victim_order"])
    assert res.status == FAILED and res.goals["inv:victim_order"] == FAILED, (res.status, res.goals)
    assert res.counterexamples and res.counterexamples[0].goal == "inv:victim_order"


@pytest.mark.symbolic
def test_pin_on_an_unbounded_count_proves_the_goal_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``Pin`` whose count the premises do not keep within ``0..R`` (the step number) covers only some states:
    its parts prove, the range query does not, and the goal is then proved whole."""
    from schedconf.spec.symbolic import proofs

    monkeypatch.setitem(proofs.GOAL_SPLITS, "running_preempt", {"inv:victim_order": proofs.Pin("step")})
    res = prove(Shape(3, 3, 2, "priority"), "running_preempt", CI_TIMEOUT_S, goals=["inv:victim_order"])
    _assert_proved(res)
    for case in ("case_request=0,case_victim=0", "case_request=0,case_victim=1"):
        assert f"{case}:inv:victim_order#range" in res.goal_seconds, res.goal_seconds
        assert f"{case}:inv:victim_order" in res.goal_seconds, res.goal_seconds  # the whole goal, after the parts
