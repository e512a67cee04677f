"""The premises every proof assumes of its pre-state (the invariants and the encoding's lemmas), and the verdicts.

Shared by ``proofs`` (the inductive step), ``symmetry`` (slot symmetry of the premises and the
transitions), ``liveness`` and ``witnesses``; it imports none of them.
"""

from __future__ import annotations

from typing import Any

import z3

import schedconf.spec.v1.invariants
from schedconf.spec.symbolic.state import LEMMAS, State, SymbolicView
from schedconf.spec.symbolic.z3ops import Z3Ops, is_z3

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"


def invariant_formulas(s: State) -> list[tuple[str, Any]]:
    """``(name, formula)`` for every invariant of spec/v1/invariants.py on ``s``."""
    view = SymbolicView(s)
    return [(f"inv:{name}", fn(view, Z3Ops())) for name, fn in schedconf.spec.v1.invariants.INVARIANTS.items()]


def lemma_formulas(s: State) -> list[tuple[str, Any]]:
    """``(name, formula)`` for every lemma of the encoding on ``s``."""
    return [(f"lemma:{name}", fn(s, Z3Ops())) for name, fn in LEMMAS.items()]


def premises(s: State) -> list[Any]:
    """Invariants and lemmas of ``s`` as Z3 Booleans."""
    return [as_bool(f) for _, f in invariant_formulas(s) + lemma_formulas(s)]


def as_bool(f: Any) -> z3.BoolRef:
    """``f`` as a Z3 Boolean (a Python bool becomes a constant)."""
    return f if is_z3(f) else z3.BoolVal(bool(f))
