"""Slot symmetry: prove a transition for one acting slot, and check by Z3 that this covers them all.

The request slots of the encoding are names, not places: every per-request
field is a list over the slots, every loop of ``transitions.py``,
``state.LEMMAS`` and ``spec/v1/invariants.py`` runs over all of them alike, and
a slot-valued term (the input ``slot``, ``alloc_request``) is only ever
compared for equality. Swapping the contents of two slots (a transposition
``pi``, :func:`permute`) should then map a step to a step. Two things make
that a claim to check rather than a fact to assume:

* ``If`` chains pick the *first* slot that satisfies a condition
  (``running_at``, ``waiting_head``, ``select_victim``); they commute with
  ``pi`` only where the premises make that slot unique.
* Under priority, ``waiting_head`` breaks a tie of (priority, arrival) by
  slot order (ids sort like slots). A transposition ``(0 q)`` with ``q`` the
  head still maps the head to slot 0: the slots before ``q`` all have larger
  keys (else one of them would be the head), so moving ``q`` to the front
  changes no comparison that decides it.

So the obligation is stated for exactly the permutations the reduction uses
(:func:`reductions`), and proved per transition (:func:`check_equivariance`):
for every pre-state ``s`` satisfying the premises, inputs ``x`` with the
transition's guard and acting slot(s) ``a``, and the permutation ``pi`` that
moves ``a`` to the canonical case (slot 0; for a second acting slot, 0 if it
is the same slot, else 1):

    guard(pi s, pi x),  actor(pi s, pi x) = pi(a),  T(pi s, pi x) = pi(T(s, x)) leaf by leaf,
    and every model check of T holds at (pi s, pi x) iff it holds at (s, x).

Both sides are the transition with its acting slots pinned to Python ints
(``transitions.pinned``: the slot is replaced by its value, and the guard
says the derived slot has it), so ``actor(pi s, pi x) = pi(a)`` is part of
the canonical case's guard, and most leaves are the same term on both sides.
A third goal, ``cases``, proves that every application has its acting slots
in range, i.e. falls into one of the pinned cases.

And once per shape (:func:`check_premises_symmetric`): ``Pre(s) => Pre(pi s)``
for the transpositions ``(0 r)``, which generate every permutation, so every
invariant and lemma is blind to slot names (the goals after a step are the
same formulas as the premises before it, on the post-state).

Then the proof of the canonical case covers every case: given ``s, x`` with
``Pre(s)``, the guard and acting slot ``a`` (in range, by ``cases``),
``Pre(pi s)`` holds and so does the canonical case's guard at ``(pi s, pi
x)``; its proof gives the goals at ``T(pi s, pi x) = pi T(s, x)``, hence (the
goals being blind to slot names, and ``pi`` invertible) at ``T(s, x)``; each
check of T holds at ``(pi s, pi x)``, hence at ``(s, x)``. ``proofs.prove`` does this
when a transition names its acting slot (``Transition.actor``).
"""

from __future__ import annotations

import time
from typing import Any

import z3

from schedconf.spec.symbolic.premises import FAILED, PROVED, UNKNOWN, as_bool, premises
from schedconf.spec.symbolic.state import (
    BLOCK_FIELDS,
    CONFIG_FIELDS,
    RECORD_FIELDS,
    RECORD_ROW_FIELDS,
    REQUEST_BLOCK_FIELDS,
    REQUEST_FIELDS,
    REQUEST_ROW_FIELDS,
    SCALAR_FIELDS,
    Shape,
    State,
)
from schedconf.spec.symbolic.z3ops import eq, is_z3, ite

SLOT_SCALARS = ("alloc_request",)
"""Scalar fields whose value is a slot (mapped through the permutation)."""

SLOT_INPUTS = ("slot",)
"""Input keys whose value is a slot."""

ACTOR_KEYS = {"slot": "slot", "case_request": "request", "case_victim": "victim"}
"""A case key and where its slot is read: an input (``slot``) or a fact of the outcome."""


def map_slot(pi: dict[int, int], v: Any) -> Any:
    """``pi(v)`` for a possibly symbolic slot value (values that are not slots stay)."""
    if not is_z3(v):
        return pi.get(v, v)
    out = v
    for a, b in pi.items():
        if a != b:
            out = ite(eq(v, a), b, out)
    return out


def permute(s: State, pi: dict[int, int]) -> State:
    """The state with the contents of slot ``r`` moved to slot ``pi[r]`` (records and blocks stay)."""
    sh = s.shape
    inverse = {b: a for a, b in pi.items()}
    fields: dict[str, Any] = {}
    for name, _ in CONFIG_FIELDS + SCALAR_FIELDS:
        value = getattr(s, name)
        fields[name] = map_slot(pi, value) if name in SLOT_SCALARS else value
    for name, _ in BLOCK_FIELDS + RECORD_FIELDS + RECORD_ROW_FIELDS:
        fields[name] = getattr(s, name)
    for name, _ in REQUEST_FIELDS + REQUEST_ROW_FIELDS + REQUEST_BLOCK_FIELDS:
        values = getattr(s, name)
        fields[name] = [values[inverse.get(r, r)] for r in sh.slots]
    return State(sh, **fields)


def permute_inputs(inputs: dict[str, Any], pi: dict[int, int]) -> dict[str, Any]:
    """Inputs with their slot values mapped through ``pi``."""
    return {k: map_slot(pi, v) if k in SLOT_INPUTS else v for k, v in inputs.items()}


def transposition(a: int, b: int) -> dict[int, int]:
    """The permutation swapping slots ``a`` and ``b`` (the identity when they are equal)."""
    return {a: b, b: a} if a != b else {}


def canonical_cases(actor: tuple[str, ...]) -> list[dict[str, int]]:
    """The cases a symmetric proof keeps: the first acting slot is 0, a second one 0 or 1."""
    if not actor:
        return [{}]
    if len(actor) == 1:
        return [{actor[0]: 0}]
    assert len(actor) == 2, actor
    return [{actor[0]: 0, actor[1]: 0}, {actor[0]: 0, actor[1]: 1}]


def reductions(shape: Shape, actor: tuple[str, ...]) -> list[tuple[dict[str, int], dict[int, int]]]:
    """Every non-canonical case and the permutation taking it to a canonical one."""
    out = []
    slots = shape.slots
    if len(actor) == 1:
        for r in slots:
            if r != 0:
                out.append(({actor[0]: r}, transposition(0, r)))
    elif len(actor) == 2:
        for r in slots:
            for v in slots:
                first = transposition(0, r)
                v1 = first.get(v, v)
                second = transposition(1, v1) if v1 != 0 else {}
                pi = {x: second.get(first.get(x, x), first.get(x, x)) for x in slots}
                pi = {x: y for x, y in pi.items() if x != y}
                if pi:
                    out.append(({actor[0]: r, actor[1]: v}, pi))
    return out


def check_equivariance(shape: Shape, transition: Any, timeout_s: float = 60.0) -> tuple[str, float, list[str]]:
    """Prove that ``transition`` commutes with the permutations of :func:`reductions`; ``(status, seconds, failures)``.

    Per non-canonical case (acting slots pinned to Python ints, as ``proofs.prove`` pins them) with
    permutation ``pi``: under the premises and the case's guard at ``(s, x)``, the canonical case's
    guard holds at ``(pi s, pi x)``, its post-state is ``pi`` of the case's, leaf by leaf, and its
    checks hold iff the case's do. With the slots pinned, most leaves on the two sides are the same
    term up to the renaming, and are not sent to Z3.
    """
    from schedconf.spec.symbolic.state import fresh_state

    t0 = time.monotonic()
    failures: list[str] = []
    status = PROVED
    pre = fresh_state(shape, "pre")
    inputs = transition.inputs(shape, "in")
    solver = z3.Solver()
    solver.add(*premises(pre))
    for case, pi in reductions(shape, transition.actor):
        out = transition.apply(pre, {**inputs, **case})
        canon = {key: pi.get(v, v) for key, v in case.items()}
        moved = transition.apply(permute(pre, pi), {**permute_inputs(inputs, pi), **canon})
        image = permute(out.post, pi)
        goals = [as_bool(moved.guard)]
        for (_, x, _), (_, y, _) in zip(moved.post.leaves(), image.leaves()):
            if not (is_z3(x) and is_z3(y) and x.eq(y)) and not (not is_z3(x) and not is_z3(y) and x == y):
                goals.append(as_bool(eq(x, y)))
        assert [n for n, _ in moved.checks] == [n for n, _ in out.checks]
        for (_, c), (_, d) in zip(moved.checks, out.checks):
            c, d = as_bool(c), as_bool(d)
            if not c.eq(d):
                goals.append(c == d)
        solver.set("timeout", max(1, int((timeout_s - (time.monotonic() - t0)) * 1000)))
        verdict = solver.check(as_bool(out.guard), *[as_bool(p) for p in out.premises], z3.Not(z3.And(*goals)))
        if verdict == z3.sat:
            status = FAILED
            failures.append(f"{case}")
        elif verdict != z3.unsat and status == PROVED:
            status = UNKNOWN
    return status, time.monotonic() - t0, failures


def check_premises_symmetric(shape: Shape, timeout_s: float = 60.0) -> tuple[str, float]:
    """Prove ``Pre(s) => Pre(pi s)`` for the transpositions ``(0 r)``; ``(status, seconds)``.

    One query per premise (invariant or lemma) whose formula the swap changes, under all the
    premises of ``s``; a premise over no slot (``victim_order``: the preemption records) is the
    same term after the swap and is not sent.
    """
    from schedconf.spec.symbolic.state import fresh_state

    t0 = time.monotonic()
    s = fresh_state(shape, "any")
    before = premises(s)
    solver = z3.Solver()
    facts = [z3.Bool(f"premise!{i}") for i in range(len(before))]
    solver.add(*[f == p for f, p in zip(facts, before)])
    status = PROVED
    for r in shape.slots:
        if r == 0:
            continue
        for p, q in zip(before, premises(permute(s, transposition(0, r)))):
            if q.eq(p):
                continue
            solver.set("timeout", max(1, int((timeout_s - (time.monotonic() - t0)) * 1000)))
            verdict = solver.check(*facts, z3.Not(q))
            if verdict == z3.sat:
                return FAILED, time.monotonic() - t0
            if verdict != z3.unsat:
                status = UNKNOWN
    return status, time.monotonic() - t0
