"""The logic layer invariants are written in, so one statement runs on two backends.

An invariant never uses Python's ``and``/``or``/``not``/``if`` on state values;
it calls these operations. :class:`ConcreteOps` evaluates them on Python ints
and bools and remembers which subject made a ``forall`` fail; the Z3 backend
(``spec/symbolic/``) builds formulas from the same calls.

Quantifiers are Python loops over domains the state view supplies
(``forall(domain, predicate, describe)``), so Z3 never sees a quantifier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Ops(Protocol):
    """The operations an invariant may use on state values."""

    def and_(self, *xs: Any) -> Any: ...
    def or_(self, *xs: Any) -> Any: ...
    def not_(self, x: Any) -> Any: ...
    def implies(self, a: Any, b: Any) -> Any: ...
    def ite(self, c: Any, a: Any, b: Any) -> Any: ...
    def eq(self, a: Any, b: Any) -> Any: ...
    def le(self, a: Any, b: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def sum(self, xs: Iterable[Any]) -> Any: ...
    def count(self, xs: Iterable[Any]) -> Any: ...
    def forall(
        self, domain: Iterable[Any], predicate: Callable[[Any], Any], describe: Callable[[Any], str] | None = None
    ) -> Any: ...
    def lex_le(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> Any: ...
    def lex_lt(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> Any: ...


class LexMixin:
    """Lexicographic order on tuples, built from the primitive operations."""

    # The primitive operations of the class this is mixed into (declared for the type checker).
    or_: Callable[..., Any]
    and_: Callable[..., Any]
    eq: Callable[..., Any]
    lt: Callable[..., Any]
    le: Callable[..., Any]

    def lex_lt(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
        """``a < b`` in lexicographic order."""
        if not a:
            return self.or_()  # false
        return self.or_(
            self.lt(a[0], b[0]),
            self.and_(self.eq(a[0], b[0]), self.lex_lt(a[1:], b[1:])),
        )

    def lex_le(self, a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
        """``a <= b`` in lexicographic order."""
        return self.or_(self.lex_lt(a, b), self.and_(*(self.eq(x, y) for x, y in zip(a, b))))


class ConcreteOps(LexMixin):
    """Evaluate on Python values; ``failures`` names the subjects that broke a forall."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def and_(self, *xs: Any) -> bool:
        return all(bool(x) for x in xs)

    def or_(self, *xs: Any) -> bool:
        return any(bool(x) for x in xs)

    def not_(self, x: Any) -> bool:
        return not x

    def implies(self, a: Any, b: Any) -> bool:
        return (not a) or bool(b)

    def ite(self, c: Any, a: Any, b: Any) -> Any:
        return a if c else b

    def eq(self, a: Any, b: Any) -> bool:
        return a == b

    def le(self, a: Any, b: Any) -> bool:
        return a <= b

    def lt(self, a: Any, b: Any) -> bool:
        return a < b

    def sum(self, xs: Iterable[Any]) -> int:
        return sum(xs)

    def count(self, xs: Iterable[Any]) -> int:
        return sum(1 for x in xs if x)

    def forall(
        self, domain: Iterable[Any], predicate: Callable[[Any], Any], describe: Callable[[Any], str] | None = None
    ) -> bool:
        """True if ``predicate`` holds for every element; records the first that fails."""
        for x in domain:
            if not predicate(x):
                self.failures.append(describe(x) if describe else repr(x))
                return False
        return True
