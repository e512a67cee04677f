"""The Z3 backend of the operations layer (``spec/ops.py``).

Every operation accepts Python values (``bool``/``int``) and Z3 terms mixed,
as the invariants pass both (view scalars such as ``block_size`` are Python
ints, state values are Z3 terms). When every operand is a Python value the
result is a Python value, computed the way :class:`~schedconf.spec.ops.ConcreteOps`
computes it; as soon as one operand is a Z3 term the result is a Z3 term, with
Python operands coerced (``True`` -> ``BoolVal(True)``, ``3`` -> ``IntVal(3)``).

``forall`` is a conjunction over the (finite, Python) domain the view
supplies, so Z3 never sees a quantifier. Each conjunct is remembered with its
subject description, so that a counterexample model can name the subjects
that break an invariant (:meth:`Z3Ops.failing_subjects`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import z3
from z3.z3 import _to_expr_ref  # the wrapper z3.If puts on a new term (right class for its sort)

from schedconf.spec.ops import LexMixin


def is_z3(x: Any) -> bool:
    """True for a Z3 expression (as opposed to a Python value)."""
    return isinstance(x, z3.ExprRef)


def to_bool(x: Any) -> z3.BoolRef:
    """Coerce a Python bool or a Z3 Boolean to a Z3 Boolean."""
    if is_z3(x):
        if not z3.is_bool(x):
            raise TypeError(f"expected a Boolean term, got {x.sort()}: {x}")
        return x
    if isinstance(x, bool):
        return z3.BoolVal(x)
    raise TypeError(f"expected a bool, got {type(x).__name__}: {x!r}")


def to_term(x: Any) -> z3.ExprRef:
    """Coerce a Python bool/int or a Z3 term to a Z3 term."""
    if is_z3(x):
        return x
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if isinstance(x, int):
        return _int_val(x)
    raise TypeError(f"cannot make a Z3 term of {type(x).__name__}: {x!r}")


_INT_VALS: dict[int, z3.IntNumRef] = {}
"""Numerals made so far, by value (Z3 shares terms, so a cached one is the term ``IntVal`` makes)."""


def _int_val(x: int) -> z3.IntNumRef:
    """``z3.IntVal(x)``, made once per value for small values (the counts' 0 and 1 are made thousands of times)."""
    if -1024 <= x <= 1024:
        v = _INT_VALS.get(x)
        if v is None:
            v = _INT_VALS[x] = z3.IntVal(x)
        return v
    return z3.IntVal(x)


class Z3Ops(LexMixin):
    """Build Z3 formulas from the invariant operations (see module docstring)."""

    def __init__(self) -> None:
        self.subjects: list[tuple[str, Any]] = []
        """Every ``forall`` conjunct built, with its subject description."""

    # logic (the term helpers below, with Booleans checked on the way in)
    def and_(self, *xs: Any) -> Any:
        """Conjunction; Python ``False`` short-circuits, Python ``True`` drops out."""
        return land(*(to_bool(x) if is_z3(x) else x for x in xs))

    def or_(self, *xs: Any) -> Any:
        """Disjunction; Python ``True`` short-circuits, Python ``False`` drops out."""
        return lor(*(to_bool(x) if is_z3(x) else x for x in xs))

    def not_(self, x: Any) -> Any:
        """Negation."""
        return lnot(to_bool(x) if is_z3(x) else x)

    def implies(self, a: Any, b: Any) -> Any:
        """``a -> b``, i.e. ``not a or b``."""
        return self.or_(self.not_(a), b)

    def ite(self, c: Any, a: Any, b: Any) -> Any:
        """``a if c else b``; a Python condition picks a branch without building a term."""
        return ite(to_bool(c) if is_z3(c) else c, a, b)

    # comparisons
    def eq(self, a: Any, b: Any) -> Any:
        """Equality (Booleans compare as Booleans, integers as integers)."""
        return eq(a, b)

    def le(self, a: Any, b: Any) -> Any:
        """``a <= b`` on integers."""
        if not is_z3(a) and not is_z3(b):
            return a <= b
        return to_term(a) <= to_term(b)

    def lt(self, a: Any, b: Any) -> Any:
        """``a < b`` on integers."""
        if not is_z3(a) and not is_z3(b):
            return a < b
        return to_term(a) < to_term(b)

    # arithmetic
    def sum(self, xs: Iterable[Any]) -> Any:
        """Sum of integers; Python ints are folded, Z3 terms summed with ``z3.Sum``."""
        return total(xs)

    def count(self, xs: Iterable[Any]) -> Any:
        """Number of true Booleans."""
        return count(xs)

    def forall(
        self, domain: Iterable[Any], predicate: Callable[[Any], Any], describe: Callable[[Any], str] | None = None
    ) -> Any:
        """Conjunction of ``predicate(x)`` over the finite domain; each conjunct is recorded."""
        parts = []
        for x in domain:
            p = predicate(x)
            self.subjects.append((describe(x) if describe else repr(x), p))
            parts.append(p)
        return self.and_(*parts)

    def failing_subjects(self, model: z3.ModelRef) -> list[str]:
        """The recorded subjects whose conjunct is false in ``model``."""
        out = []
        for name, p in self.subjects:
            value = p if not is_z3(p) else z3.is_true(model.eval(p, model_completion=True))
            if not value:
                out.append(name)
        return out


# ---------------------------------------------------------------------------
# Term helpers for the transitions and the symbolic state.
#
# Like Z3Ops, each accepts Python values and Z3 terms mixed and stays in
# Python when it can, so the same transition code runs on Python values (fast
# evaluation) and on Z3 terms (proofs). Indices of lists are Python ints
# unless a helper says otherwise (``select``).


def ite(c: Any, a: Any, b: Any) -> Any:
    """``a if c else b``; identical branches are not wrapped in an ``If``."""
    if not is_z3(c):
        return a if c else b
    if a is b:
        return a
    if is_z3(a) and is_z3(b) and a.get_id() == b.get_id():
        return a
    if not is_z3(a) and not is_z3(b) and type(a) is type(b) and a == b:
        return a
    i = c.get_id()
    if i == _TRUE_ID:
        return a
    if i == _FALSE_ID:
        return b
    a, b = to_term(a), to_term(b)
    if a.sort_kind() != b.sort_kind():
        return z3.If(c, a, b)  # through z3.If and its coercions (Int with Real)
    # The C API directly: z3.If re-checks and coerces every operand; the term is the same.
    ctx = c.ctx
    return _to_expr_ref(z3.Z3_mk_ite(ctx.ref(), c.as_ast(), a.as_ast(), b.as_ast()), ctx)


_TRUE_ID = z3.BoolVal(True).get_id()
_FALSE_ID = z3.BoolVal(False).get_id()
"""AST ids of the literals ``true`` and ``false`` (Z3 shares terms, so every ``true`` has this id)."""


def _boolean(x: z3.ExprRef) -> z3.BoolRef:
    """``x``, which must be a Z3 Boolean (every Boolean term is a ``BoolRef``)."""
    if not isinstance(x, z3.BoolRef):
        raise TypeError(f"expected a Boolean term, got {x.sort()}: {x}")
    return x


def _mk_nary(mk: Any, terms: list[Any], cls: Any = z3.BoolRef) -> Any:
    """``And`` / ``Or`` / ``+`` of Z3 terms of one sort through the C API (``z3.And`` / ``z3.Sum`` re-check and coerce every operand)."""
    ctx = terms[0].ctx
    args = (z3.Ast * len(terms))(*[t.as_ast() for t in terms])
    return cls(mk(ctx.ref(), len(terms), args), ctx)


def land(*xs: Any) -> Any:
    """Conjunction (Python when every operand is)."""
    terms = []
    for x in xs:
        if not isinstance(x, z3.ExprRef):
            if not x:
                return False
            continue
        i = x.get_id()
        if i == _FALSE_ID:
            return False
        if i != _TRUE_ID:
            terms.append(_boolean(x))
    if not terms:
        return True
    return terms[0] if len(terms) == 1 else _mk_nary(z3.Z3_mk_and, terms)


def lor(*xs: Any) -> Any:
    """Disjunction (Python when every operand is)."""
    terms = []
    for x in xs:
        if not isinstance(x, z3.ExprRef):
            if x:
                return True
            continue
        i = x.get_id()
        if i == _TRUE_ID:
            return True
        if i != _FALSE_ID:
            terms.append(_boolean(x))
    if not terms:
        return False
    return terms[0] if len(terms) == 1 else _mk_nary(z3.Z3_mk_or, terms)


def lnot(x: Any) -> Any:
    """Negation."""
    return z3.Not(x) if is_z3(x) else not x


def limplies(a: Any, b: Any) -> Any:
    """``a -> b``."""
    return lor(lnot(a), b)


def eq(a: Any, b: Any) -> Any:
    """Equality of two values of the same kind."""
    if not is_z3(a) and not is_z3(b):
        return a == b
    return to_term(a) == to_term(b)


def imin(a: Any, b: Any) -> Any:
    """``min(a, b)`` on integers."""
    if not is_z3(a) and not is_z3(b):
        return min(a, b)
    return ite(to_term(a) <= to_term(b), a, b)


def imax(a: Any, b: Any) -> Any:
    """``max(a, b)`` on integers."""
    if not is_z3(a) and not is_z3(b):
        return max(a, b)
    return ite(to_term(a) >= to_term(b), a, b)


def fdiv(a: Any, k: int) -> Any:
    """``a // k`` for a positive Python int ``k`` (SMT-LIB ``div`` floors for k > 0)."""
    assert isinstance(k, int) and k > 0
    if not is_z3(a):
        return a // k
    return a / k if k != 1 else a


def cdiv(a: Any, k: int) -> Any:
    """``ceil(a / k)`` for ``a >= 0`` and a positive Python int ``k`` (``schedconf.spec.v1.config.cdiv``)."""
    return fdiv(a + (k - 1), k)


def total(xs: Iterable[Any]) -> Any:
    """Sum of integers."""
    const = 0
    terms = []
    for x in xs:
        if is_z3(x):
            terms.append(x)
        else:
            const += int(x)
    if not terms:
        return const
    if len(terms) == 1:
        s = terms[0]
    elif all(isinstance(t, z3.ArithRef) and t.is_int() for t in terms):
        s = _mk_nary(z3.Z3_mk_add, terms, z3.ArithRef)  # z3.Sum's term
    else:
        s = z3.Sum(*terms)
    return s + const if const else s


def count(xs: Iterable[Any]) -> Any:
    """Number of true Booleans."""
    return total(ite(x, 1, 0) if is_z3(x) else (1 if x else 0) for x in xs)


def total_set(xs: Iterable[Any]) -> Any:
    """Sum of integers, its terms in a canonical order (by AST id).

    The same terms in any order give the same Z3 term: a sum over request
    slots is then literally unchanged when the slots are renamed, and the
    symmetry checks (``symmetry.py``) need not prove it equal.
    """
    xs = list(xs)
    return total(sorted((x for x in xs if is_z3(x)), key=lambda x: x.get_id()) + [x for x in xs if not is_z3(x)])


def count_set(xs: Iterable[Any]) -> Any:
    """Number of true Booleans, as :func:`total_set` orders them."""
    return total_set(ite(x, 1, 0) if is_z3(x) else (1 if x else 0) for x in xs)


def select(values: list[Any], idx: Any, default: Any) -> Any:
    """``values[idx]`` for a possibly symbolic index; ``default`` when out of range."""
    if not is_z3(idx):
        return values[idx] if 0 <= idx < len(values) else default
    out = default
    for i in reversed(range(len(values))):
        out = ite(idx == i, values[i], out)
    return out


def value_of(x: Any) -> Any:
    """A Python value of a Python value or a ground Z3 numeral / Boolean literal."""
    if not is_z3(x):
        return x
    if z3.is_true(x):
        return True
    if z3.is_false(x):
        return False
    if z3.is_int_value(x):
        return x.as_long()
    raise ValueError(f"not a ground value: {x}")
