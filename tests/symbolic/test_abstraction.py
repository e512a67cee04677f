"""Abstracted terms in the proofs (``transitions.Abstraction``; ``proofs._prove_case``, method ``symmetric``).

``touch`` and ``waiting_admit`` declare the prefix hit (the hit count and the
hit matrix) and ``waiting_admit`` also the free-queue ranks as unknowns: their
facts are proved on the terms, then the goals over fresh constants of which
only the facts are known. These tests check that the facts are goals that can
fail, that a missing fact costs time but not the proof (the goal is retried
on the terms), and that a false invariant still yields a real counterexample.
"""

from __future__ import annotations

from typing import Any

import pytest

import schedconf.spec.symbolic.transitions as T
from schedconf.spec.symbolic.proofs import FAILED, PROVED, prove
from schedconf.spec.symbolic.state import Shape, SymbolicView
from schedconf.spec.symbolic.z3ops import Z3Ops, eq, land

SHAPE = Shape(3, 3, 2, "fcfs")
TIMEOUT_S = 240.0


def _facts_of(res: Any) -> dict[str, str]:
    return {g: s for g, s in res.goals.items() if g.startswith("abstraction:")}


@pytest.mark.symbolic
@pytest.mark.parametrize(
    "name, expected",
    [
        ("touch", {"prefix hit"}),
        ("waiting_admit", {"prefix hit", "free rank"}),
    ],
)
def test_facts_are_proved_and_suffice(name: str, expected: set[str]) -> None:
    """The abstraction's facts are proved as goals of their own, and no goal needs the terms themselves."""
    res = prove(SHAPE, name, TIMEOUT_S)
    assert res.status == PROVED, res.goals
    facts = _facts_of(res)
    assert {g.split(":")[1] for g in facts} == expected, facts
    assert set(facts.values()) == {PROVED}
    assert not [k for k in res.goal_seconds if k.endswith(" (terms)")], "a goal fell back to the terms"


@pytest.mark.symbolic
def test_a_false_fact_fails_the_proof(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fact that the terms do not satisfy (here: the hit count is always 0) is a failed goal, not an assumption."""
    real = T.hit_abstraction

    def wrong(s: Any, q: Any, k: Any, hits: Any) -> T.Abstraction:
        a = real(s, q, k, hits)
        return T.Abstraction(a.terms, lambda x: [*a.facts(x), ("prefix hit: there is none", eq(x["k"], 0))])

    monkeypatch.setattr(T, "hit_abstraction", wrong)
    res = prove(SHAPE, "touch", TIMEOUT_S)
    assert res.status == FAILED
    assert res.goals["abstraction:prefix hit: there is none"] == FAILED
    cex = res.counterexamples[0]
    assert cex.goal == "abstraction:prefix hit: there is none"
    # Replayed on Python values, the touch really hits something in that state.
    assert T.TRANSITIONS["touch"].apply(cex.pre, cex.inputs).facts["hit_blocks"] > 0


@pytest.mark.symbolic
def test_a_missing_fact_falls_back_to_the_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no facts at all, the goals that need them are retried with the definitions: still proved."""
    real = T.hit_abstraction
    monkeypatch.setattr(
        T, "hit_abstraction", lambda s, q, k, hits: T.Abstraction(real(s, q, k, hits).terms, lambda x: [])
    )
    res = prove(SHAPE, "touch", TIMEOUT_S)
    assert res.status == PROVED, res.goals
    assert [k for k in res.goal_seconds if k.endswith(" (terms)")], "no goal needed the hit's facts"


def _inv_tables_hold_no_cached_block(s: Any, o: Any) -> Any:
    """Deliberately false after a prefix hit: no request's table holds a cached block."""
    return o.forall(s.blocks, lambda b: o.implies(s.is_cached(b), o.eq(s.ref_cnt(b), 0)), lambda b: f"block {b}")


@pytest.mark.symbolic
def test_a_false_invariant_gives_a_real_counterexample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against an invariant the adoption of a hit breaks, the counterexample holds for the terms, not only their stand-ins."""
    from schedconf.spec.v1 import invariants

    monkeypatch.setattr(
        invariants,
        "INVARIANTS",
        dict(invariants.INVARIANTS, tables_hold_no_cached_block=_inv_tables_hold_no_cached_block),
    )
    res = prove(SHAPE, "touch", TIMEOUT_S)
    assert res.status == FAILED
    assert res.goals["inv:tables_hold_no_cached_block"] == FAILED
    cex = next(c for c in res.counterexamples if c.goal == "inv:tables_hold_no_cached_block")
    # Replayed on Python values: the guard holds, the pre-state keeps the false invariant and the post-state breaks it.
    out = T.TRANSITIONS["touch"].apply(cex.pre, cex.inputs)
    assert out.guard is True
    assert _inv_tables_hold_no_cached_block(SymbolicView(cex.pre), Z3Ops()) is True
    assert _inv_tables_hold_no_cached_block(SymbolicView(out.post), Z3Ops()) is False
    assert land(out.facts["hit_blocks"] > 0) is True
