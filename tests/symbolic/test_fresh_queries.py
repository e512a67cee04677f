"""A query of a ``symmetric`` proof still open after ``proofs.FRESH_AFTER_S`` goes to a fresh solver.

With the cap made tiny every query takes that path: the proofs must come out
the same, and a false invariant must still give a counterexample (read from
the fresh solver that found it).
"""

from __future__ import annotations

from typing import Any

import pytest

import spec.symbolic.proofs as P
from spec.symbolic.state import Shape, SymbolicView
from spec.symbolic.transitions import TRANSITIONS
from spec.symbolic.z3ops import Z3Ops, total_set

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
    from spec import invariants

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
