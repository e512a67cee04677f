"""Safety for every pool size: the block-and-seat skeleton, proved over unbounded arrays.

The bounded proofs (``proofs.py``) fix ``R`` request slots and ``B`` blocks.
This module proves the budget, seat, block-conservation, free-iff-unreferenced,
ref-count, no-double-hold, scheduled-only-running and victim-order rules for
*every* ``R`` and ``B`` (both symbolic integers), by induction over the
*micro-steps* every transition of the encoding is made of. The argument is
written out in ``spec/symbolic/UNBOUNDED.md``; in short:

* **Skeleton.** A state keeps, per block (ids ``1..B``), ``ref_cnt`` and
  free-queue membership; per request slot (``0..R-1``), status, membership of
  ``running`` and scheduled tokens; per (slot, block) how many times the
  slot's table holds the block; the step's budget, total and preemption
  records; and the counters the rules compare (``num_free_blocks``,
  ``len(running)``). Z3 sees arrays indexed by integers and ``ForAll`` over
  the domains ``1 <= b <= B`` and ``0 <= r < R``.
* **Micro-steps.** Each changes at most one block and one request: pop a free
  block into a table, touch a held block, release a table entry, admit,
  leave ``running``, schedule tokens, give tokens back, one step of the
  priority victim scan, ... (``STEPS``). A transition of the encoding loops
  over blocks or requests; each loop iteration is one micro-step, so every
  transition, at every size, is a finite sequence of micro-steps.
* **Counting without cardinality.** A rule that counts (``sum`` / ``count``
  over a domain) is stated over a *ghost counter*. A micro-step that touches
  point ``p`` must prove the frame condition "the counted term is unchanged
  at every other point" (a ``ForAll`` Z3 discharges); the ghost then moves by
  the term's change at ``p``. That the ghost equals the true sum afterwards
  is the one-line lemma ``sum(f') = sum(f) + f'(p) - f(p)`` when ``f'`` and
  ``f`` differ only at ``p`` (UNBOUNDED.md, Lemma 1); resets to zero use
  ``sum(0) = 0``. Pre-states may also assume that a non-negative term is at
  most its sum (Lemma 2).
* **Refinement.** :func:`check_refinement` maps a state of the bounded
  encoding to the skeleton (:func:`abstract`), explains a transition's
  before/after pair as micro-steps (:func:`explain`), replays them with every
  guard and frame condition checked on Python values, and compares the
  result with the abstraction of the after-state. The drift guard runs it on
  every transition of its random programs (``refining``), so the skeleton is
  tied to the model through the encoding the drift guard already ties to it.

The same micro-step code runs on Z3 arrays (proofs) and on
:class:`PyArray` values (refinement), like ``transitions.py``.
"""

# Size: one unbounded encoding (the quantified state, its transitions and proofs), kept whole for
# the same reason as in_flight.py.

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from schedconf.spec.symbolic.state import DEAD, State, SymbolicView
from schedconf.spec.symbolic.z3ops import is_z3, ite, land, limplies, lnot, lor
from schedconf.spec.v1.view import PREEMPTED, RUNNING, WAITING

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"
ALL = "all"
"""A micro-step that touches every point of a domain (a reset to zero)."""

MUTANTS = ("priority_victim_min", "fcfs_victim_head", "budget_not_restored")
"""Mutants of ``conformance/checking/mutants.py`` whose broken rule lives in the skeleton (see ``STEPS``)."""


# ------------------------------------------------------------------ arrays on two backends


class PyArray:
    """A total map from ints to Python values: a default and the entries that differ (immutable)."""

    __slots__ = ("default", "entries")

    def __init__(self, default: Any, entries: dict[int, Any] | None = None) -> None:
        self.default = default
        self.entries = dict(entries or {})

    def get(self, i: int) -> Any:
        return self.entries.get(i, self.default)

    def set(self, i: int, v: Any) -> PyArray:
        out = PyArray(self.default, self.entries)
        out.entries[i] = v
        return out


def sel(a: Any, i: Any) -> Any:
    """``a[i]``."""
    return z3.Select(a, i) if is_z3(a) else a.get(i)


def store(a: Any, i: Any, v: Any) -> Any:
    """``a`` with ``a[i] = v``."""
    if is_z3(a):
        return z3.Store(a, i, v if is_z3(v) else (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v)))
    return a.set(i, v)


def sel2(a: Any, i: Any, j: Any) -> Any:
    return sel(sel(a, i), j)


def store2(a: Any, i: Any, j: Any, v: Any) -> Any:
    return store(a, i, store(sel(a, i), j, v))


# ------------------------------------------------------------------ the skeleton state

SCALARS = (
    "M",
    "S",
    "B",
    "R",
    "out",
    "nf",
    "total",
    "budget",
    "npre",
    "scan_on",
    "scan_c",
    "scan_best",
    "nrun",
    "g_free",
    "g_held",
    "g_sched",
)
"""``M`` max_num_batched_tokens, ``S`` max_num_seqs, ``B``/``R`` the sizes, ``out`` the step's scheduled
tokens are visible (``State.has_output``), ``nf`` num_free_blocks, ``total``/``budget`` the view's
total_num_scheduled_tokens / remaining_token_budget, ``npre`` preemption records, the scan's state,
``nrun`` len(running), and the ghost counters ``g_free`` (free blocks), ``g_held`` (blocks with
ref_cnt > 0), ``g_sched`` (sum of scheduled tokens)."""
ARRAYS = ("ref", "free", "status", "inrun", "sched", "hold", "g_hold", "rec_n", "rec_v", "rec_p", "rec_a")
"""Per block: ``ref``, ``free``, ghost ``g_hold`` (sum over slots of ``hold``); per slot: ``status``
(``DEAD`` or a view code), ``inrun``, ``sched``; per slot and block: ``hold`` (times the table holds
the block); per record ``k``: candidate count, victim position, and per candidate its key."""
BOOL_SCALARS = ("out", "scan_on")
SORTS = {
    "free": (z3.IntSort(), z3.BoolSort()),
    "inrun": (z3.IntSort(), z3.BoolSort()),
    "hold": (z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.IntSort())),
    "rec_p": (z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.IntSort())),
    "rec_a": (z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.IntSort())),
}


class Skel:
    """A skeleton state: Z3 terms (proofs) or Python values and :class:`PyArray` (refinement)."""

    __slots__ = SCALARS + ARRAYS

    def __init__(self, **fields: Any) -> None:
        for name in SCALARS + ARRAYS:
            setattr(self, name, fields[name])

    def replace(self, **changes: Any) -> Skel:
        fields = {name: getattr(self, name) for name in SCALARS + ARRAYS}
        fields.update(changes)
        return Skel(**fields)


def fresh_skel(tag: str) -> Skel:
    """A skeleton whose every field is a fresh Z3 constant (sizes included)."""
    fields: dict[str, Any] = {}
    for name in SCALARS:
        fields[name] = z3.Bool(f"{tag}.{name}") if name in BOOL_SCALARS else z3.Int(f"{tag}.{name}")
    for name in ARRAYS:
        dom, rng = SORTS.get(name, (z3.IntSort(), z3.IntSort()))
        fields[name] = z3.Array(f"{tag}.{name}", dom, rng)
    return Skel(**fields)


def in_blocks(t: Skel, b: Any) -> Any:
    return land(1 <= b, b <= t.B)


def in_reqs(t: Skel, r: Any) -> Any:
    return land(0 <= r, r < t.R)


_BOUND = itertools.count()
"""Numbers for bound variables, so that nested quantifiers never capture each other's."""


class _Mode:
    """How ``forall`` builds a quantifier over Z3 terms (see ``prove_step``).

    ``quant``: a ``ForAll``. ``goal``: the body at fresh constants (universal generalisation; every
    ``forall`` of a goal is in a positive position), which are remembered in ``skolems``.
    ``premise``: the conjunction of the body's instances at every term of ``candidates`` (sound:
    instances of a true ``ForAll``); this keeps every query free of quantifiers.
    """

    kind = "quant"
    skolems: list[tuple[str, z3.ArithRef]] = []
    candidates: dict[str, list[z3.ArithRef]] = {}
    """Per class: ``b`` blocks, ``r`` slots, ``c`` records and positions in them."""


MODE = _Mode()


def _points(t: Skel, kinds: str) -> list[tuple[list[Any], Any]]:
    """(point, domain condition) pairs a Z3 ``forall`` ranges over in the current mode."""

    def dom(kind: str, x: Any) -> Any:
        return in_blocks(t, x) if kind == "b" else in_reqs(t, x)

    def cls(kind: str) -> str:
        return "b" if kind == "b" else "r"

    if MODE.kind == "goal":
        xs = [z3.Int(f"sk.{kind}{len(MODE.skolems) + i}") for i, kind in enumerate(kinds)]
        MODE.skolems.extend((cls(k), x) for k, x in zip(kinds, xs))
        return [(xs, land(*(dom(k, x) for k, x in zip(kinds, xs))))]
    out: list[tuple[list[Any], Any]] = [([], True)]
    for kind in kinds:
        out = [(xs + [x], land(cond, dom(kind, x))) for xs, cond in out for x in MODE.candidates[cls(kind)]]
    return out


def forall(t: Skel, kinds: str, body: Callable[..., Any]) -> Any:
    """``body`` for every point of the domains named by ``kinds`` (``"b"`` blocks, any other letter
    slots): on Z3 terms as the mode says (:class:`_Mode`), on Python values a loop."""
    if is_z3(t.B):
        if MODE.kind == "quant":
            xs = [z3.Int(f"{kind}!{next(_BOUND)}") for kind in kinds]
            dom = [in_blocks(t, x) if kind == "b" else in_reqs(t, x) for kind, x in zip(kinds, xs)]
            return z3.ForAll(xs, z3.Implies(z3.And(*dom), body(*xs)))
        return land(*(limplies(cond, body(*xs)) for xs, cond in _points(t, kinds)))
    ranges = [range(1, t.B + 1) if kind == "b" else range(t.R) for kind in kinds]

    def rec(i: int, args: list[int]) -> bool:
        if i == len(ranges):
            return bool(body(*args))
        return all(rec(i + 1, args + [x]) for x in ranges[i])

    return rec(0, [])


def forall_below(t: Skel, n: Any, body: Callable[[Any], Any], lo: Any = 0) -> Any:
    """``body(c)`` for every ``lo <= c < n`` (``n`` symbolic or Python)."""
    if is_z3(t.B):
        if MODE.kind == "quant":
            c = z3.Int(f"c!{next(_BOUND)}")
            return z3.ForAll([c], z3.Implies(z3.And(lo <= c, c < n), body(c)))
        if MODE.kind == "goal":
            c = z3.Int(f"sk.c{len(MODE.skolems)}")
            MODE.skolems.append(("c", c))
            return limplies(land(lo <= c, c < n), body(c))
        return land(*(limplies(land(lo <= c, c < n), body(c)) for c in MODE.candidates["c"]))
    return all(bool(body(c)) for c in range(lo, n))


def key_lt(a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    """``a < b`` on (priority, arrival) keys."""
    return lor(a[0] < b[0], land(a[0] == b[0], a[1] < b[1]))


def key_le(a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    return lor(key_lt(a, b), land(a[0] == b[0], a[1] == b[1]))


def rec_key(t: Skel, k: Any, c: Any) -> tuple[Any, Any]:
    return sel2(t.rec_p, k, c), sel2(t.rec_a, k, c)


# ------------------------------------------------------------------ ghost counters


@dataclass(frozen=True)
class Ghost:
    """A counter standing for ``sum(term(t, x) for x in domain)``; ``per_block``: one per block ``b``,
    summing ``term(t, r, b)`` over slots ``r``."""

    name: str
    domain: str  # "b" blocks; slots: "r" (status), "s" (scheduled tokens), "t" (tables, per_block)
    term: Callable[..., Any]
    per_block: bool = False


GHOSTS = (
    Ghost("g_free", "b", lambda t, b: ite(sel(t.free, b), 1, 0)),
    Ghost("g_held", "b", lambda t, b: ite(sel(t.ref, b) > 0, 1, 0)),
    Ghost("g_sched", "s", lambda t, r: sel(t.sched, r)),
    Ghost("nrun", "r", lambda t, r: ite(sel(t.inrun, r), 1, 0)),
    Ghost("g_hold", "t", lambda t, r, b: sel2(t.hold, r, b), per_block=True),
)


def ghost_value(t: Skel, g: Ghost) -> Any:
    """The true sum on a Python-valued skeleton (the abstraction sets every ghost to it)."""
    if g.per_block:
        return PyArray(0, {b: sum(g.term(t, r, b) for r in range(t.R)) for b in range(0, t.B + 1)})
    dom = range(1, t.B + 1) if g.domain == "b" else range(t.R)
    return sum(g.term(t, x) for x in dom)


def update_ghosts(pre: Skel, post: Skel, touched: dict[str, Any]) -> tuple[Skel, list[tuple[str, Any]]]:
    """Move every ghost by the change of its term at the touched point; return the frame conditions.

    ``touched[domain]`` is ``[]``, ``[p]`` or ``ALL`` (every term becomes 0); ``"t"`` names the
    slot whose table changes. The conditions say
    the term is unchanged at every other point (or 0 everywhere, for ``ALL``); under them the
    new ghost is the true sum again (UNBOUNDED.md, Lemma 1).
    """
    out: dict[str, Any] = {}
    frames: list[tuple[str, Any]] = []
    for g in GHOSTS:
        pts = touched.get(g.domain, [])
        old = getattr(pre, g.name)
        if g.per_block:
            if pts == ALL:
                raise AssertionError("no micro-step resets tables")
            if pts:
                (q,) = pts
                frames.append(
                    (
                        f"frame:{g.name}",
                        forall(
                            post,
                            "rb",
                            lambda r, b, q=q: limplies(
                                lnot(r == q) if is_z3(r) or is_z3(q) else r != q,
                                g.term(post, r, b) == g.term(pre, r, b),
                            ),
                        ),
                    )
                )
                if is_z3(old):
                    b = z3.Int(f"b!{next(_BOUND)}")
                    out[g.name] = z3.Lambda([b], z3.Select(old, b) + g.term(post, q, b) - g.term(pre, q, b))
                else:
                    out[g.name] = PyArray(
                        0, {b: old.get(b) + g.term(post, q, b) - g.term(pre, q, b) for b in range(0, pre.B + 1)}
                    )
            else:
                frames.append(
                    (f"frame:{g.name}", forall(post, "rb", lambda r, b: g.term(post, r, b) == g.term(pre, r, b)))
                )
                out[g.name] = old
            continue
        if pts == ALL:
            frames.append((f"frame:{g.name}", forall(post, g.domain, lambda x: g.term(post, x) == 0)))
            out[g.name] = 0
            continue
        if pts:
            (p,) = pts
            frames.append(
                (
                    f"frame:{g.name}",
                    forall(
                        post,
                        g.domain,
                        lambda x, p=p: limplies(
                            lnot(x == p) if is_z3(x) or is_z3(p) else x != p, g.term(post, x) == g.term(pre, x)
                        ),
                    ),
                )
            )
            out[g.name] = old + g.term(post, p) - g.term(pre, p)
        else:
            frames.append((f"frame:{g.name}", forall(post, g.domain, lambda x: g.term(post, x) == g.term(pre, x))))
            out[g.name] = old
    return post.replace(**out), frames


def sum_facts(t: Skel) -> list[Any]:
    """Lemma 2 on the pre-state: a sum of non-negative terms is >= 0 and >= each of its terms.

    Every summed term is non-negative in a state that satisfies the rules (counts are 0 or 1,
    ``inv_scheduled_only_running`` and ``inv_no_double_hold`` bound the others below), which are
    premises of every proof alongside these facts.
    """
    out = []
    for g in GHOSTS:
        v = getattr(t, g.name)
        if g.per_block:
            out.append(forall(t, "rb", lambda r, b, g=g, v=v: land(0 <= sel(v, b), g.term(t, r, b) <= sel(v, b))))
        else:
            out.append(land(v >= 0, forall(t, g.domain, lambda x, g=g, v=v: g.term(t, x) <= v)))
    return out


# ------------------------------------------------------------------ the rules, for every size


def inv_token_budget(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_token_budget; nothing is scheduled outside a step's output."""
    return land(
        t.total <= t.M,
        0 <= t.budget,
        t.total + t.budget == t.M,
        t.g_sched == t.total,
        limplies(
            lnot(t.out),
            land(t.total == 0, t.npre == 0, lnot(t.scan_on), forall(t, "r", lambda r: sel(t.sched, r) == 0)),
        ),
    )


def inv_max_num_seqs(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_max_num_seqs (``nrun`` is len(running))."""
    return t.nrun <= t.S


def inv_scheduled_only_running(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_scheduled_only_running."""
    return forall(
        t, "r", lambda r: land(0 <= sel(t.sched, r), limplies(0 < sel(t.sched, r), sel(t.status, r) == RUNNING))
    )


def inv_block_conservation(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_block_conservation (num_gpu_blocks = B + 1)."""
    return land(t.nf + t.g_held + 1 == t.B + 1, t.g_free == t.nf)


def inv_free_iff_unreferenced(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_free_iff_unreferenced."""
    return forall(t, "b", lambda b: land(0 <= sel(t.ref, b), sel(t.free, b) == (sel(t.ref, b) == 0)))


def inv_ref_cnt_matches_tables(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_ref_cnt_matches_tables: ref_cnt = holders, nobody holds the null block, no orphan table."""
    return land(
        forall(t, "b", lambda b: sel(t.ref, b) == sel(t.g_hold, b)),
        forall(t, "r", lambda r: sel2(t.hold, r, 0) == 0),
        forall(t, "rb", lambda r, b: limplies(sel(t.status, r) == DEAD, sel2(t.hold, r, b) == 0)),
    )


def inv_no_double_hold(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_no_double_hold."""
    return forall(t, "rb", lambda r, b: land(0 <= sel2(t.hold, r, b), sel2(t.hold, r, b) <= 1))


def inv_victim_order(t: Skel, policy: str) -> Any:
    """spec/v1/invariants.py inv_victim_order, for records of any length."""

    def ok(k: Any) -> Any:
        n, v = sel(t.rec_n, k), sel(t.rec_v, k)
        if policy == "fcfs":
            right = v == n - 1
        else:
            right = land(
                forall_below(t, v, lambda c: key_lt(rec_key(t, k, c), rec_key(t, k, v))),
                forall_below(t, n, lambda c: key_le(rec_key(t, k, c), rec_key(t, k, v)), lo=v),
            )
        return land(0 <= v, v < n, right)

    return land(0 <= t.npre, forall_below(t, t.npre, ok))


def lemma_skeleton(t: Skel, policy: str) -> Any:
    """Well-formedness: sizes and configuration; status codes; running iff RUNNING; only RUNNING holds blocks; the scan's invariant."""
    scan = land(
        t.out,
        0 <= t.scan_best,
        t.scan_best < t.scan_c,
        t.scan_c <= sel(t.rec_n, t.npre),
        forall_below(t, t.scan_best, lambda c: key_lt(rec_key(t, t.npre, c), rec_key(t, t.npre, t.scan_best))),
        forall_below(t, t.scan_c, lambda c: key_le(rec_key(t, t.npre, c), rec_key(t, t.npre, t.scan_best))),
    )
    return land(
        1 <= t.B,
        1 <= t.R,
        1 <= t.M,
        1 <= t.S,
        forall(
            t,
            "r",
            lambda r: land(
                lor(*(sel(t.status, r) == code for code in (DEAD, WAITING, RUNNING, PREEMPTED))),
                sel(t.inrun, r) == (sel(t.status, r) == RUNNING),
            ),
        ),
        forall(t, "rb", lambda r, b: limplies(lnot(sel(t.status, r) == RUNNING), sel2(t.hold, r, b) == 0)),
        limplies(t.scan_on, scan) if policy == "priority" else lnot(t.scan_on),
    )


INVARIANTS: dict[str, Callable[[Skel, str], Any]] = {
    fn.__name__.removeprefix("inv_").removeprefix("lemma_"): fn
    for fn in (
        inv_token_budget,
        inv_max_num_seqs,
        inv_scheduled_only_running,
        inv_block_conservation,
        inv_free_iff_unreferenced,
        inv_ref_cnt_matches_tables,
        inv_no_double_hold,
        inv_victim_order,
        lemma_skeleton,
    )
}
"""The rules proved for every size, under the names of ``spec/v1/invariants.py`` (plus ``skeleton``)."""


# ------------------------------------------------------------------ micro-steps


@dataclass
class Step:
    """One micro-step: guard, next state (ghosts not yet moved), the points it touches per ghost domain."""

    guard: Any
    post: Skel
    touched: dict[str, Any] = field(default_factory=dict)


def step_begin_step(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``schedule()`` starts (transitions.begin_step): the step's output becomes visible, empty."""
    return Step(lnot(t.out), t.replace(out=True))


def step_take_output(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``update_from_output()`` takes the output (transitions.begin_update): nothing is scheduled any more."""
    zero = z3.K(z3.IntSort(), z3.IntVal(0)) if is_z3(t.sched) else PyArray(0)
    return Step(land(t.out, lnot(t.scan_on)), t.replace(out=False, sched=zero, total=0, budget=t.M, npre=0), {"s": ALL})


def step_schedule_tokens(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``num_scheduled_tokens[q] = num_new; token_budget -= num_new`` (running_allocate, waiting_admit):
    ``num_new`` is capped by the budget (``min(num_new, token_budget)``)."""
    q, n = i["q"], i["n"]
    guard = land(t.out, in_reqs(t, q), sel(t.status, q) == RUNNING, sel(t.sched, q) == 0, 0 < n, n <= t.budget)
    return Step(guard, t.replace(sched=store(t.sched, q, n), total=t.total + n, budget=t.budget - n), {"s": [q]})


def step_unschedule(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """A scheduled request gives its tokens back: a priority victim (``_remove_priority_victim``) or an
    abort while the output is pending (the view counts its tokens as given back)."""
    q = i["q"]
    s = sel(t.sched, q)
    budget = t.budget if mutant == "budget_not_restored" else t.budget + s
    return Step(
        land(t.out, in_reqs(t, q)), t.replace(sched=store(t.sched, q, 0), total=t.total - s, budget=budget), {"s": [q]}
    )


def step_record_fcfs(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """FCFS ``select_victim`` + its record: the candidates are ``running``, the victim its tail."""
    n = i["n"]
    k = t.npre
    victim = 0 if mutant == "fcfs_victim_head" else n - 1
    return Step(
        land(t.out, lnot(t.scan_on), n == t.nrun, 1 <= n),
        t.replace(
            rec_n=store(t.rec_n, k, n),
            rec_v=store(t.rec_v, k, victim),
            rec_p=store(t.rec_p, k, i["kp"]),
            rec_a=store(t.rec_a, k, i["ka"]),
            npre=k + 1,
        ),
    )


def step_scan_start(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """Priority ``select_victim`` = ``max(running, key=victim_key)`` starts: candidate 0 is the best so far."""
    n = i["n"]
    k = t.npre
    return Step(
        land(t.out, lnot(t.scan_on), n == t.nrun, 1 <= n),
        t.replace(
            scan_on=True,
            scan_c=1,
            scan_best=0,
            rec_n=store(t.rec_n, k, n),
            rec_p=store(t.rec_p, k, i["kp"]),
            rec_a=store(t.rec_a, k, i["ka"]),
        ),
    )


def step_scan_next(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """One comparison of ``max``: a strictly greater key replaces the best (so the first maximum wins)."""
    c, best = t.scan_c, t.scan_best
    kc, kb = rec_key(t, t.npre, c), rec_key(t, t.npre, best)
    better = key_lt(kc, kb) if mutant == "priority_victim_min" else key_lt(kb, kc)
    return Step(land(t.scan_on, c < sel(t.rec_n, t.npre)), t.replace(scan_best=ite(better, c, best), scan_c=c + 1))


def step_scan_end(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``max`` returns; the record keeps the victim's position."""
    return Step(
        land(t.scan_on, t.scan_c == sel(t.rec_n, t.npre)),
        t.replace(scan_on=False, rec_v=store(t.rec_v, t.npre, t.scan_best), npre=t.npre + 1),
    )


def step_pop_block(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """One iteration of ``BlockPool.get_new_blocks`` appended to a RUNNING table (or a touch of a free
    hit block: the same effect): the block leaves the free queue with ref_cnt 1."""
    q, b = i["q"], i["b"]
    guard = land(in_reqs(t, q), in_blocks(t, b), sel(t.status, q) == RUNNING, sel(t.free, b))
    post = t.replace(
        free=store(t.free, b, False),
        ref=store(t.ref, b, sel(t.ref, b) + 1),
        nf=t.nf - 1,
        hold=store2(t.hold, q, b, sel2(t.hold, q, b) + 1),
    )
    return Step(guard, post, {"b": [b], "t": [q]})


def step_touch_block(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """One iteration of ``BlockPool.touch`` on a held hit block, adopted into a RUNNING table.

    Assumption H1 (guard): the table does not hold it yet, i.e. the hit blocks differ; that follows
    from the hash lemmas, which the bounded proofs prove (``allocate_slots: hit blocks differ``).
    """
    q, b = i["q"], i["b"]
    guard = land(
        in_reqs(t, q), in_blocks(t, b), sel(t.status, q) == RUNNING, lnot(sel(t.free, b)), sel2(t.hold, q, b) == 0
    )
    post = t.replace(ref=store(t.ref, b, sel(t.ref, b) + 1), hold=store2(t.hold, q, b, sel2(t.hold, q, b) + 1))
    return Step(guard, post, {"b": [b], "t": [q]})


def step_release_block(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """One iteration of ``BlockPool.free_blocks`` over a table (``KVCacheManager.free``): the entry goes,
    ref_cnt drops, a block reaching 0 enters the free queue."""
    q, b = i["q"], i["b"]
    ref = sel(t.ref, b) - 1
    post = t.replace(
        hold=store2(t.hold, q, b, sel2(t.hold, q, b) - 1),
        ref=store(t.ref, b, ref),
        free=store(t.free, b, ref == 0),
        nf=t.nf + ite(ref == 0, 1, 0),
    )
    return Step(land(in_reqs(t, q), in_blocks(t, b), sel2(t.hold, q, b) >= 1), post, {"b": [b], "t": [q]})


def step_admit(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``_schedule_waiting`` admits the head: the loop breaks at ``len(running) == max_num_seqs``."""
    q = i["q"]
    guard = land(t.out, in_reqs(t, q), lor(sel(t.status, q) == WAITING, sel(t.status, q) == PREEMPTED), t.nrun < t.S)
    return Step(guard, t.replace(status=store(t.status, q, RUNNING), inrun=store(t.inrun, q, True)), {"r": [q]})


def step_leave_running(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """A RUNNING request whose table is freed leaves ``running``: preempted, finished or aborted."""
    q, to = i["q"], i["to"]
    guard = land(
        in_reqs(t, q),
        sel(t.status, q) == RUNNING,
        sel(t.sched, q) == 0,
        lor(to == PREEMPTED, to == DEAD),
        forall(t, "b", lambda b: sel2(t.hold, q, b) == 0),
    )
    return Step(guard, t.replace(status=store(t.status, q, to), inrun=store(t.inrun, q, False)), {"r": [q]})


def step_leave_waiting(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """A waiting request is aborted."""
    q = i["q"]
    guard = land(in_reqs(t, q), lor(sel(t.status, q) == WAITING, sel(t.status, q) == PREEMPTED))
    return Step(guard, t.replace(status=store(t.status, q, DEAD)), {"r": [q]})


def step_add(t: Skel, i: dict[str, Any], policy: str, mutant: str | None) -> Step:
    """``add_request`` fills a dead slot with a WAITING request."""
    q = i["q"]
    return Step(
        land(in_reqs(t, q), sel(t.status, q) == DEAD, sel(t.sched, q) == 0),
        t.replace(status=store(t.status, q, WAITING)),
        {"r": [q]},
    )


STEPS: dict[str, Callable[[Skel, dict[str, Any], str, str | None], Step]] = {
    fn.__name__.removeprefix("step_"): fn
    for fn in (
        step_begin_step,
        step_take_output,
        step_schedule_tokens,
        step_unschedule,
        step_record_fcfs,
        step_scan_start,
        step_scan_next,
        step_scan_end,
        step_pop_block,
        step_touch_block,
        step_release_block,
        step_admit,
        step_leave_running,
        step_leave_waiting,
        step_add,
    )
}
POLICY_STEPS = {
    "fcfs": [n for n in STEPS if not n.startswith("scan_")],
    "priority": [n for n in STEPS if n != "record_fcfs"],
}


def fresh_inputs(tag: str) -> dict[str, Any]:
    return {
        "q": z3.Int(f"{tag}.q"),
        "b": z3.Int(f"{tag}.b"),
        "n": z3.Int(f"{tag}.n"),
        "to": z3.Int(f"{tag}.to"),
        "kp": z3.Array(f"{tag}.kp", z3.IntSort(), z3.IntSort()),
        "ka": z3.Array(f"{tag}.ka", z3.IntSort(), z3.IntSort()),
    }


def apply_step(
    name: str, t: Skel, inputs: dict[str, Any], policy: str, mutant: str | None = None
) -> tuple[Any, Skel, list[tuple[str, Any]]]:
    """(guard, next state with ghosts moved, frame conditions) of micro-step ``name``."""
    st = STEPS[name](t, inputs, policy, mutant)
    post, frames = update_ghosts(t, st.post, st.touched)
    return st.guard, post, frames


# ------------------------------------------------------------------ proofs


@dataclass
class StepResult:
    """The proof of one micro-step for every size."""

    step: str
    policy: str
    status: str
    seconds: float
    goals: dict[str, str] = field(default_factory=dict)


def formula(fn: Callable[[Skel, str], Any], t: Skel, policy: str) -> Any:
    """``fn(t, policy)`` with ``ForAll`` and bound variables numbered from 0, so that a rule reading only
    fields a micro-step leaves alone gives the very same term before and after it."""
    global _BOUND
    _BOUND = itertools.count()
    MODE.kind = "quant"
    return fn(t, policy)


def _dedup(terms: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in terms:
        x = x if is_z3(x) else z3.IntVal(x)
        if not any(z3.eq(x, y) for y in out):
            out.append(x)
    return out


def prove_goal(
    name: str,
    policy: str,
    goal: str,
    fn: Callable[[Skel], Any] | None,
    timeout_ms: int,
    mutant: str | None,
    invariants: dict[str, Callable[[Skel, str], Any]],
) -> str:
    """One goal of a micro-step, as a query without quantifiers (see :class:`_Mode`), in a solver of its own."""
    t = fresh_skel("pre")
    inputs = fresh_inputs("in")
    MODE.kind, MODE.skolems = "goal", []
    _, post, frames = apply_step(name, t, inputs, policy, mutant)
    target = dict(frames)[goal] if fn is None else fn(post)
    MODE.kind = "premise"
    sk = {c: [x for k, x in MODE.skolems if k == c] for c in "brc"}
    MODE.candidates = {
        "b": _dedup(sk["b"] + [inputs["b"]]),
        "r": _dedup(sk["r"] + [inputs["q"]]),
        "c": _dedup(sk["c"] + [t.npre, t.scan_best, t.scan_c] + [sel(t.rec_v, k) for k in sk["c"]]),
    }
    guard, _, _ = apply_step(name, t, inputs, policy, mutant)
    premises = [fn(t, policy) for fn in invariants.values()] + sum_facts(t) + [guard]
    MODE.kind = "quant"
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*[_b(p) for p in premises], z3.Not(_b(target)))
    verdict = solver.check()
    return PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN


def prove_step(
    name: str,
    policy: str,
    timeout_s: float = 60.0,
    mutant: str | None = None,
    extra: dict[str, Callable[[Skel, str], Any]] | None = None,
) -> StepResult:
    """``Inv(t) and Lemma 2(t) and guard => frame conditions and Inv(t')`` for all R, B; one query per goal.

    A rule whose formula after the micro-step is the same term as before is its own premise. Every
    other goal is one query without quantifiers (:func:`prove_goal`). ``extra`` adds rules (the tests
    register a deliberately false one). Vacuity: the premises, quantified, must be satisfiable.
    """
    t0 = time.monotonic()
    invariants = {**INVARIANTS, **(extra or {})}
    result = StepResult(name, policy, PROVED, 0.0)
    t = fresh_skel("pre")
    inputs = fresh_inputs("in")
    guard, post, frames = apply_step(name, t, inputs, policy, mutant)
    before = {n: _b(formula(fn, t, policy)) for n, fn in invariants.items()}
    # Vacuity: some state with 2 slots, 2 blocks, no finished record and a scan at its first
    # candidate meets the premises (small finite domains keep Z3's model search quick).
    vacuity = z3.Solver()
    vacuity.set("timeout", int(min(10.0, timeout_s) * 1000))
    vacuity.add(*before.values(), _b(guard), t.B == 2, t.R == 2, t.npre == 0, t.scan_c <= 1)
    witness = vacuity.check()
    if witness == z3.unsat:
        result.status, result.seconds = VACUOUS, time.monotonic() - t0
        return result
    result.goals["satisfiable premises"] = PROVED if witness == z3.sat else UNKNOWN
    goals: list[tuple[str, Callable[[Skel], Any] | None]] = [(g, None) for g, _ in frames]
    for n, fn in invariants.items():
        if z3.eq(_b(formula(fn, post, policy)), before[n]):
            result.goals[f"inv:{n}"] = PROVED
            continue
        goals.append((f"inv:{n}", lambda p, fn=fn: fn(p, policy)))
    for goal, fn in goals:
        left_ms = max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))
        result.goals[goal] = prove_goal(name, policy, goal, fn, left_ms, mutant, invariants)
    statuses = set(result.goals.values())
    result.status = FAILED if FAILED in statuses else UNKNOWN if UNKNOWN in statuses else PROVED
    result.seconds = time.monotonic() - t0
    return result


def prove_all_steps(
    policy: str, timeout_s: float = 60.0, mutant: str | None = None, workers: int = 1, extra: str | None = None
) -> list[StepResult]:
    """Every micro-step of ``policy``, each in a fresh process (Z3's global context slows a proof that
    runs after many others in one process, as in ``proofs.prove_isolated``). ``extra`` names a rule of
    :data:`FALSE_RULES` to add (the tests' deliberately false invariant)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        jobs = [pool.submit(_prove_step_named, name, policy, timeout_s, mutant, extra) for name in POLICY_STEPS[policy]]
        return [job.result() for job in jobs]


def _prove_step_named(name: str, policy: str, timeout_s: float, mutant: str | None, extra: str | None) -> StepResult:
    return prove_step(name, policy, timeout_s, mutant, {extra: FALSE_RULES[extra]} if extra else None)


def _false_free_block(t: Skel, policy: str) -> Any:
    """Deliberately false: a free block always remains (the pool is never exhausted)."""
    return t.nf >= 1


def _false_seats(t: Skel, policy: str) -> Any:
    """Deliberately false: one seat always stays empty."""
    return t.nrun < t.S


FALSE_RULES: dict[str, Callable[[Skel, str], Any]] = {"free_block_left": _false_free_block, "seat_left": _false_seats}
"""Rules that do not hold; each must make some micro-step's proof fail (``tests/symbolic/test_unbounded.py``)."""


def _b(f: Any) -> z3.BoolRef:
    return f if is_z3(f) else z3.BoolVal(bool(f))


# ------------------------------------------------------------------ refinement: encoding -> skeleton


class RefinementError(AssertionError):
    """A transition of the encoding is not a sequence of enabled skeleton micro-steps."""


def abstract(s: State) -> Skel:
    """The skeleton of a Python-valued encoding state, through the state view the invariants read."""
    sh = s.shape
    v = SymbolicView(s)
    out = bool(s.has_output())
    k_max = s.num_preemptions if out else 0
    t = Skel(
        M=s.max_num_batched_tokens,
        S=s.max_num_seqs,
        B=sh.num_blocks,
        R=sh.num_reqs,
        out=out,
        nf=s.num_free_blocks,
        total=v.total_num_scheduled_tokens,
        budget=v.remaining_token_budget,
        npre=k_max,
        scan_on=False,
        scan_c=0,
        scan_best=0,
        nrun=0,
        g_free=0,
        g_held=0,
        g_sched=0,
        ref=PyArray(0, {b: s.ref_cnt[b] for b in sh.blocks}),
        free=PyArray(False, {b: bool(s.in_free[b]) for b in sh.blocks}),
        status=PyArray(DEAD, {r: v.status(r) for r in sh.slots}),
        inrun=PyArray(False, {r: bool(v.num_in_running(r)) for r in sh.slots}),
        sched=PyArray(0, {r: v.num_scheduled_tokens(r) for r in sh.slots}),
        hold=PyArray(PyArray(0), {r: PyArray(0, {b: v.hold_count((r, b)) for b in sh.blocks}) for r in sh.slots}),
        g_hold=PyArray(0),
        rec_n=PyArray(0, {k: s.rec_num_candidates[k] for k in range(k_max)}),
        rec_v=PyArray(0, {k: s.rec_victim_pos[k] for k in range(k_max)}),
        rec_p=PyArray(PyArray(0), {k: _record_row(s.rec_priority[k], s.rec_num_candidates[k]) for k in range(k_max)}),
        rec_a=PyArray(PyArray(0), {k: _record_row(s.rec_arrival[k], s.rec_num_candidates[k]) for k in range(k_max)}),
    )
    return t.replace(**{g.name: ghost_value(t, g) for g in GHOSTS})


def _record_row(values: list[int], n: int) -> PyArray:
    return PyArray(0, {c: values[c] for c in range(n)})


def explain(pre: Skel, post: Skel, policy: str) -> list[tuple[str, dict[str, Any]]]:
    """Micro-steps taking ``pre`` to ``post``, in the order the model's code runs them."""
    steps: list[tuple[str, dict[str, Any]]] = []
    slots, blocks = range(pre.R), range(1, pre.B + 1)
    if not pre.out and post.out:
        steps.append(("begin_step", {}))
    visible = pre.out and post.out
    for r in slots:
        if visible and pre.sched.get(r) > 0 and post.sched.get(r) == 0:
            steps.append(("unschedule", {"q": r}))
    if visible and post.npre == pre.npre + 1:
        k = pre.npre
        n = post.rec_n.get(k)
        rec = {"n": n, "kp": post.rec_p.get(k), "ka": post.rec_a.get(k)}
        if policy == "fcfs":
            steps.append(("record_fcfs", rec))
        else:
            steps += [("scan_start", rec)] + [("scan_next", {})] * (n - 1) + [("scan_end", {})]
    for r in slots:
        for b in blocks:
            for _ in range(pre.hold.get(r).get(b) - post.hold.get(r).get(b)):
                steps.append(("release_block", {"q": r, "b": b}))
    for r in slots:
        before, after = pre.status.get(r), post.status.get(r)
        if before == RUNNING and after != RUNNING:
            steps.append(("leave_running", {"q": r, "to": after}))
        elif before in (WAITING, PREEMPTED) and after == DEAD:
            steps.append(("leave_waiting", {"q": r}))
    for r in slots:
        before, after = pre.status.get(r), post.status.get(r)
        if before == DEAD and after != DEAD:
            steps.append(("add", {"q": r}))
        if before in (WAITING, PREEMPTED) and after == RUNNING:
            steps.append(("admit", {"q": r}))
    free = {b: pre.free.get(b) for b in blocks}
    for r in slots:
        for b in blocks:
            for _ in range(post.hold.get(r).get(b) - pre.hold.get(r).get(b)):
                steps.append(("pop_block" if free[b] else "touch_block", {"q": r, "b": b}))
                free[b] = False
    for r in slots:
        if visible and post.sched.get(r) > 0 and post.sched.get(r) != pre.sched.get(r):
            steps.append(("schedule_tokens", {"q": r, "n": post.sched.get(r)}))
    if pre.out and not post.out:
        steps.append(("take_output", {}))
    return steps


def replay(pre: Skel, steps: list[tuple[str, dict[str, Any]]], policy: str) -> Skel:
    """Apply the micro-steps on Python values, checking each guard and frame condition."""
    t = pre
    for name, inputs in steps:
        guard, post, frames = apply_step(name, t, inputs, policy)
        if not guard:
            raise RefinementError(f"micro-step {name}{inputs} is not enabled")
        for frame, ok in frames:
            if not ok:
                raise RefinementError(f"micro-step {name}{inputs}: {frame} fails")
        t = post
    return t


def differences(a: Skel, b: Skel) -> list[str]:
    """Fields on which two Python-valued skeletons differ, over their domains."""
    idle_scan = ("scan_c", "scan_best") if not (a.scan_on or b.scan_on) else ()
    out = [n for n in SCALARS if getattr(a, n) != getattr(b, n) and n not in idle_scan]
    slots, blocks = range(a.R), range(1, a.B + 1)
    for name, dom in (
        ("ref", blocks),
        ("free", blocks),
        ("g_hold", blocks),
        ("status", slots),
        ("inrun", slots),
        ("sched", slots),
    ):
        if any(getattr(a, name).get(x) != getattr(b, name).get(x) for x in dom):
            out.append(name)
    if any(a.hold.get(r).get(x) != b.hold.get(r).get(x) for r in slots for x in range(0, a.B + 1)):
        out.append("hold")
    for k in range(min(a.npre, b.npre)):
        n = a.rec_n.get(k)
        if (n, a.rec_v.get(k)) != (b.rec_n.get(k), b.rec_v.get(k)) or any(
            (a.rec_p.get(k).get(c), a.rec_a.get(k).get(c)) != (b.rec_p.get(k).get(c), b.rec_a.get(k).get(c))
            for c in range(n)
        ):
            out.append(f"record {k}")
    return out


def check_refinement(name: str, pre: State, post: State) -> list[str]:
    """Raise :class:`RefinementError` unless the encoded transition ``pre -> post`` is a sequence of enabled
    micro-steps reaching ``abstract(post)``; return the micro-step names."""
    policy = pre.shape.policy
    a, b = abstract(pre), abstract(post)
    steps = explain(a, b, policy)
    try:
        got = replay(a, steps, policy)
    except RefinementError as exc:
        raise RefinementError(f"{name}: {exc}") from None
    diff = differences(got, b)
    if diff:
        raise RefinementError(f"{name}: the micro-steps {[s for s, _ in steps]} do not reach the after-state: {diff}")
    return [s for s, _ in steps]


def refining(inner: Callable[..., Any], seen: dict[str, set[tuple[str, ...]]] | None = None) -> Callable[..., Any]:
    """An evaluator (``drive.Evaluator``) that also checks every enabled transition against the skeleton."""

    def ev(name: str, state: State, inputs: dict[str, Any]) -> Any:
        guard, post, facts = inner(name, state, inputs)
        if guard:
            steps = check_refinement(name, state, post)
            if seen is not None:
                seen.setdefault(name, set()).add(tuple(dict.fromkeys(steps)))
        return guard, post, facts

    return ev


# ------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    """CLI: prove every micro-step for every size and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.unbounded", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per micro-step")
    parser.add_argument("--policy", default="fcfs,priority")
    parser.add_argument("--mutant", default=None, choices=MUTANTS)
    parser.add_argument("--workers", type=int, default=1, help="processes proving micro-steps side by side")
    args = parser.parse_args(argv)
    code = 0
    print("| micro-step | policy | result | time (s) |\n|---|---|---|---|")
    for policy in args.policy.split(","):
        for res in prove_all_steps(policy, args.timeout, args.mutant, args.workers):
            bad = {g: s for g, s in res.goals.items() if s != PROVED}
            print(
                f"| {res.step} | {policy} | {res.status}{' ' + str(bad) if bad else ''} | {res.seconds:.2f} |",
                flush=True,
            )
            code |= res.status != PROVED
    return code


if __name__ == "__main__":
    sys.exit(main())
