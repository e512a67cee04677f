"""A query of a ``symmetric`` proof still open after ``proofs.FRESH_AFTER_S`` goes to a fresh solver.

With the cap made tiny every query takes that path: the proofs must come out
the same, and a false invariant must still give a counterexample (read from
the fresh solver that found it).
"""

from __future__ import annotations

from typing import Any

import pytest

import schedconf.spec.symbolic.proofs as P
from schedconf.spec.symbolic.state import Shape, SymbolicView
from schedconf.spec.symbolic.transitions import TRANSITIONS
from schedconf.spec.symbolic.z3ops import Z3Ops, count, ite, total, total_set

SHAPE = Shape(3, 3, 2, "priority")


@pytest.mark.symbolic
@pytest.mark.parametrize("name", ["running_preempt", "waiting_admit"])
def test_fresh_queries_prove_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "FRESH_AFTER_S", 1e-4)
    res = P.prove(SHAPE, name, 240)
    assert res.status == P.PROVED, {g: s for g, s in res.goals.items() if s != P.PROVED}
    assert [k for k in res.goal_seconds if k.endswith(" (fresh)")], "no query was sent to a fresh solver"


def _inv_nothing_running(s: Any, o: Any) -> Any:
    """Deliberately false: no request is RUNNING."""
    return o.eq(s.num_running, 0)


@pytest.mark.symbolic
def test_fresh_queries_find_counterexamples(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedconf.spec.v1 import invariants

    monkeypatch.setattr(P, "FRESH_AFTER_S", 1e-4)
    monkeypatch.setattr(invariants, "INVARIANTS", dict(invariants.INVARIANTS, nothing_running=_inv_nothing_running))
    res = P.prove(SHAPE, "waiting_admit", 240)
    assert res.goals["inv:nothing_running"] == P.FAILED
    cex = next(c for c in res.counterexamples if c.goal == "inv:nothing_running")
    # Replayed on Python values, the admission makes its request RUNNING.
    out = TRANSITIONS["waiting_admit"].apply(cex.pre, cex.inputs)
    assert out.guard is True
    assert _inv_nothing_running(SymbolicView(out.post), Z3Ops()) is False


def test_total_set_is_blind_to_order() -> None:
    """Sums over slots in canonical order: the same terms in any order make the same Z3 term."""
    import z3

    xs = [z3.Int(f"x{i}") for i in range(5)]
    a, b = total_set(xs), total_set(list(reversed(xs)) + [0])
    assert a.eq(b)
    assert not z3.Sum(*xs).eq(z3.Sum(*reversed(xs)))
    assert total_set([1, 2]) == 3


def test_c_api_helpers_make_the_terms_z3_makes() -> None:
    """ite / total / count build through the C API: the very terms (same AST id) z3.If and z3.Sum make."""
    import z3

    x, y, b = z3.Int("x"), z3.Int("y"), z3.Bool("b")
    assert ite(b, x, 3).get_id() == z3.If(b, x, z3.IntVal(3)).get_id()
    assert ite(b, True, y > 0).get_id() == z3.If(b, z3.BoolVal(True), y > 0).get_id()
    assert isinstance(ite(b, x, y), z3.ArithRef) and isinstance(ite(b, b, x > y), z3.BoolRef)
    assert total([x, 2, y, 5]).get_id() == (z3.Sum(x, y) + 7).get_id()
    assert count([b, True, x > 1]).get_id() == (z3.Sum(z3.If(b, 1, 0), z3.If(x > 1, 1, 0)) + 1).get_id()
    # Operands of different sorts go through z3.If and its coercions.
    r = z3.Real("r")
    assert ite(b, x, r).get_id() == z3.If(b, x, r).get_id() and ite(b, x, r).sort() == z3.RealSort()


@pytest.mark.symbolic
def test_a_goal_sent_fresh_once_goes_fresh_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``running_preempt`` has two cases (a victim that is the request itself, or another): a goal the first case
    sent to a fresh solver is not tried in the proof's solver in the second, and still proves."""
    monkeypatch.setattr(P, "FRESH_AFTER_S", 1e-4)
    res = P.prove(SHAPE, "running_preempt", 240)
    assert res.status == P.PROVED, {g: s for g, s in res.goals.items() if s != P.PROVED}
    first, second = "case_request=0,case_victim=0:", "case_request=0,case_victim=1:"
    sent = {
        k[len(first) : -len(" (fresh)")] for k in res.goal_seconds if k.startswith(first) and k.endswith(" (fresh)")
    }
    sent = {g for g in sent if not g.startswith("abstraction:")}  # checked before the goals, not by check()
    assert sent, res.goal_seconds
    for goal in sent:
        assert first + goal in res.goal_seconds, goal  # tried in the proof's solver first
        if second + goal + " (fresh)" in res.goal_seconds:
            assert second + goal not in res.goal_seconds, goal  # not tried there in the second case
    assert any(second + goal + " (fresh)" in res.goal_seconds for goal in sent)
