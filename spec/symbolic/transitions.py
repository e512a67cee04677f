"""The model's transitions over a :class:`~schedconf.spec.symbolic.state.State`, mirroring ``spec/``.

Each transition maps a state and its inputs to an :class:`Outcome`: the next
state, the guard under which the model takes this transition, the model's
own assertions on the way (``checks``: each must hold whenever the guard
does, or the model would crash), and named facts for the witnesses. The code
is written once with the helpers of ``z3ops`` and runs on Python values and
on Z3 terms alike; the proofs (``proofs.py``) use Z3 terms, the drift guard
(``tests/symbolic/test_drift_guard.py``) runs both against the Python model.

Scope of the encoding (what is *not* here is fixed): the ``vllm-0.33``
profile; no speculative decoding (``num_spec_tokens = 0``, so no drafts and
no padding); one sampled token per step; the stop check abstracts the token
to "is a stop token (EOS or a stop id)" or not. Configuration numbers and
switches (budget, seats, ``max_model_len``, threshold, lookahead, chunked
prefill, prefix caching, full-sequence reservation, ``prefill_schedule_interval``)
are symbolic, and so is ``schedule()``'s ``throttle_prefills`` (an input of
``begin_step``): prefill deferral is encoded as the model does it.

Granularity: the model's loops are cut where the model's state is whole, so
that every transition starts and ends in a state the invariants describe. A
running-loop iteration is ``running_start`` (pick ``running[req_index]``,
count its tokens or skip it) followed by ``running_preempt`` (one victim of
``_allocate_or_preempt``) until ``running_allocate`` (the slots fit; commit)
or a self-preemption; a waiting-loop iteration is ``waiting_admit`` or
``waiting_stop``. ``COMPOSED`` holds the whole iterations built from these
steps (``running_iteration``, ``waiting_admission``).

Every function names the model code it mirrors. Loops of the model become
loops over Python ranges (slots, blocks, table positions); a symbolic index
becomes an ``If`` chain (``select``). A few ``checks`` are stepping stones
rather than model assertions (named after the fact they state); they are
proved like the others and make the later goals cheaper. Those named with
:data:`STONE` state per block what a count goal needs (:func:`count_steps`),
so that Z3 adds up instead of case-splitting on every block.
"""

# Size: one symbolic transition per scheduler entry point, side by side so the drift guard and a
# reader compare them with the concrete model in one file; they share the step helpers at the
# top.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from schedconf.spec.symbolic.state import (
    BLOCK_FIELDS,
    CONFIG_FIELDS,
    DEAD,
    IDLE,
    PENDING,
    RECORD_FIELDS,
    RECORD_ROW_FIELDS,
    REQUEST_BLOCK_FIELDS,
    REQUEST_FIELDS,
    REQUEST_ROW_FIELDS,
    RUNNING_LOOP,
    SCALAR_FIELDS,
    UPDATING,
    WAITING_LOOP,
    Shape,
    State,
    free_rank,
    order_rank,
    theorem_order,
    theorem_rank,
)
from schedconf.spec.symbolic.z3ops import (
    Z3Ops,
    cdiv,
    count,
    eq,
    fdiv,
    imax,
    imin,
    is_z3,
    ite,
    land,
    limplies,
    lnot,
    lor,
    select,
    total_set,
)
from schedconf.spec.v1.view import PREEMPTED, RUNNING, WAITING

Check = tuple[str, Any]


@dataclass
class Outcome:
    """What one transition does: next state, guard, the model's assertions, named facts.

    ``premises`` are instances of proved theorems (``state.theorem_rank``) at
    the states the transition passes through; the proofs may assume them.
    """

    post: State
    guard: Any
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    premises: list[Any] = field(default_factory=list)
    abstractions: list[Abstraction] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Theorem instances travel with the checks as "premise:" entries, abstractions as "abstraction:" ones.
        self.premises = self.premises + [c for name, c in self.checks if name.startswith(PREMISE)]
        self.abstractions = self.abstractions + [c for name, c in self.checks if name.startswith(ABSTRACTION)]
        self.checks = [
            (name, c) for name, c in self.checks if not name.startswith(PREMISE) and not name.startswith(ABSTRACTION)
        ]


PREMISE = "premise:"
"""Prefix of a check-list entry that is an instance of a proved theorem, to be assumed rather than proved."""

ABSTRACTION = "abstraction:"
"""Prefix of a check-list entry that is an :class:`Abstraction` (collected into ``Outcome.abstractions``)."""


@dataclass
class Abstraction:
    """Subterms of an outcome that a proof may treat as unknowns, and the facts it needs of them.

    ``terms`` names Z3 subterms of the outcome (e.g. the prefix hit matrix,
    whose entries compare every block's hash with every position's); ``facts``
    maps a dict with the same keys (the terms themselves, or stand-ins for
    them) to named facts. A proof (``proofs.py``, method ``symmetric``) first
    proves ``facts(terms)``, then proves its goals with each term replaced by
    a fresh constant of which only ``facts`` is known. Sound: an instance of
    the second proof at the constants' true values is the goal itself.
    """

    terms: dict[Any, Any]
    facts: Callable[[dict[Any, Any]], list[Check]]


# ------------------------------------------------------------------ helpers


def under(cond: Any, checks: list[Check]) -> list[Check]:
    """The checks asserted only when ``cond`` holds (an abstraction's facts likewise)."""

    def guarded(a: Abstraction) -> Abstraction:
        return Abstraction(a.terms, lambda x: [(n, limplies(cond, f)) for n, f in a.facts(x)])

    return [(n, guarded(c)) if n.startswith(ABSTRACTION) else (n, limplies(cond, c)) for n, c in checks]


def at(values: list[Any], q: Any, default: Any = 0) -> Any:
    """``values[q]`` for a possibly symbolic slot ``q``."""
    return select(values, q, default)


def put(values: list[Any], q: Any, new: Any) -> list[Any]:
    """``values`` with entry ``q`` (possibly symbolic) replaced by ``new``."""
    return [ite(eq(q, r), new, values[r]) for r in range(len(values))]


def row_of(rows: list[list[Any]], q: Any) -> list[Any]:
    """Row ``q`` of a per-slot table, for a possibly symbolic ``q``."""
    width = len(rows[0]) if rows else 0
    return [select([rows[r][i] for r in range(len(rows))], q, 0) for i in range(width)]


def merge(c: Any, a: State, b: State) -> State:
    """The state ``a if c else b``, leaf by leaf."""
    if not is_z3(c):
        return a if c else b
    sh = a.shape
    fields: dict[str, Any] = {}
    for name, _ in CONFIG_FIELDS + SCALAR_FIELDS:
        fields[name] = ite(c, getattr(a, name), getattr(b, name))
    for name, _ in BLOCK_FIELDS + REQUEST_FIELDS + RECORD_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        fields[name] = x if x is y else [ite(c, u, v) for u, v in zip(x, y)]
    for name, _ in REQUEST_ROW_FIELDS + REQUEST_BLOCK_FIELDS + RECORD_ROW_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        fields[name] = (
            x
            if x is y
            else [
                row_x if row_x is row_y else [ite(c, u, v) for u, v in zip(row_x, row_y)] for row_x, row_y in zip(x, y)
            ]
        )
    return State(sh, **fields)


def slot_in_range(s: State, q: Any) -> Any:
    """``q`` names a slot."""
    return land(0 <= q, q < s.shape.num_reqs) if is_z3(q) else 0 <= q < s.shape.num_reqs


def running_at(s: State, j: Any) -> Any:
    """The slot at position ``j`` of ``running`` (-1 if none)."""
    out: Any = -1
    for r in reversed(s.shape.slots):
        out = ite(land(s.in_running[r], eq(s.running_pos[r], j)), r, out)
    return out


def running_value(s: State, values: list[Any], j: int) -> Any:
    """``values[running[j]]`` (0 if none), as a sum over the slots in a canonical order.

    Running positions are distinct (``lemma_requests``), so at most one term is
    non-zero; unlike ``at(values, running_at(s, j))`` the term is the same
    under any renaming of the slots, so the symmetry checks need not prove it.
    """
    return total_set(ite(land(s.in_running[r], eq(s.running_pos[r], j)), values[r], 0) for r in s.shape.slots)


def waiting_head(s: State) -> Any:
    """``waiting.peek_request()`` (``spec/v1/queues.py``): FCFS the front; priority the least (priority, arrival, id)."""
    sh = s.shape
    out: Any = -1
    for r in reversed(sh.slots):
        if sh.is_priority:
            key_r = (s.priority[r], s.arrival_time[r])
            # Against a later id r may tie (ids break ties); against an earlier one it must be less.
            is_min = land(
                s.in_waiting[r],
                *(
                    limplies(
                        s.in_waiting[c],
                        _key_le(key_r, (s.priority[c], s.arrival_time[c]))
                        if r < c
                        else _key_lt(key_r, (s.priority[c], s.arrival_time[c])),
                    )
                    for c in sh.slots
                    if c != r
                ),
            )
        else:
            is_min = land(s.in_waiting[r], eq(s.waiting_pos[r], 0))
        out = ite(is_min, r, out)
    return out


def _key_lt(a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    return lor(a[0] < b[0], land(eq(a[0], b[0]), a[1] < b[1]))


def _key_le(a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    return lor(a[0] < b[0], land(eq(a[0], b[0]), a[1] <= b[1]))


# ------------------------------------------------------------------ queues


def remove_from_running(s: State, q: Any) -> State:
    """``running.remove(q)`` / ``del running[i]``: later requests move up one place."""
    pos_q = at(s.running_pos, q)
    in_q = at(s.in_running, q, False)
    sh = s.shape
    return s.replace(
        in_running=put(s.in_running, q, False),
        running_pos=[
            ite(
                land(in_q, lnot(eq(q, r)), s.in_running[r], s.running_pos[r] > pos_q),
                s.running_pos[r] - 1,
                s.running_pos[r],
            )
            for r in sh.slots
        ],
    )


def append_running(s: State, q: Any) -> State:
    """``running.append(q)``."""
    return s.replace(in_running=put(s.in_running, q, True), running_pos=put(s.running_pos, q, s.num_running()))


def remove_from_waiting(s: State, q: Any) -> State:
    """``waiting.pop_request()`` of the head / ``remove_requests({q})`` (``spec/v1/queues.py``)."""
    sh = s.shape
    if sh.is_priority:
        return s.replace(in_waiting=put(s.in_waiting, q, False))
    pos_q = at(s.waiting_pos, q)
    in_q = at(s.in_waiting, q, False)
    return s.replace(
        in_waiting=put(s.in_waiting, q, False),
        waiting_pos=[
            ite(
                land(in_q, lnot(eq(q, r)), s.in_waiting[r], s.waiting_pos[r] > pos_q),
                s.waiting_pos[r] - 1,
                s.waiting_pos[r],
            )
            for r in sh.slots
        ],
    )


def prepend_waiting(s: State, q: Any) -> State:
    """``waiting.prepend_request(q)``: FCFS to the head; priority by key (no position)."""
    sh = s.shape
    if sh.is_priority:
        return s.replace(in_waiting=put(s.in_waiting, q, True))
    return s.replace(
        in_waiting=put(s.in_waiting, q, True),
        waiting_pos=[ite(eq(q, r), 0, ite(s.in_waiting[r], s.waiting_pos[r] + 1, s.waiting_pos[r])) for r in sh.slots],
    )


def append_waiting(s: State, q: Any) -> State:
    """``waiting.add_request(q)``: FCFS to the tail; priority by key."""
    sh = s.shape
    if sh.is_priority:
        return s.replace(in_waiting=put(s.in_waiting, q, True))
    return s.replace(in_waiting=put(s.in_waiting, q, True), waiting_pos=put(s.waiting_pos, q, s.num_waiting()))


# ------------------------------------------------------------------ counting stepping stones

STONE = "stepping stone: "
"""Prefix of the stepping stones added for issue 14 (speed); ``proofs.PLAIN`` leaves them out."""


def count_steps(
    s: State, post: State, taken: dict[int, Any] | None = None, freed: dict[int, Any] | None = None
) -> Check:
    """A stepping stone for the counting goals: per block, "held" (``ref_cnt > 0``) and "free" change by one exactly when it is taken or freed.

    ``inv_block_conservation`` compares sums of per-block indicators before
    and after; Z3 sees the sums change by the taken / freed count only after
    deciding every block's indicators (exponential in B). Stated per block,
    each fact is a small case split, and the sums follow linearly. The
    indicators are built with the invariants' own operations, so they are the
    same Z3 terms as those in the goals. Needs ``taken`` blocks unheld and
    free, ``freed`` blocks held once and not free (both follow from the
    premises; the stone is proved like every check). ``None``: no block.
    """
    o = Z3Ops()
    taken = taken or {b: False for b in s.shape.blocks}
    freed = freed or {b: False for b in s.shape.blocks}

    def ind(x: Any) -> Any:
        return count([x])

    return (
        STONE + "per block, held and free change by the blocks taken and freed",
        land(
            *(
                land(
                    eq(ind(o.lt(0, post.ref_cnt[b])), ind(o.lt(0, s.ref_cnt[b])) + ind(taken[b]) - ind(freed[b])),
                    eq(ind(post.in_free[b]), ind(s.in_free[b]) - ind(taken[b]) + ind(freed[b])),
                )
                for b in s.shape.blocks
            )
        ),
    )


# ------------------------------------------------------------------ block pool


def pool_get_new_blocks(s: State, n: Any) -> tuple[State, dict[int, Any], dict[int, Any], list[Check], list[Any]]:
    """``BlockPool.get_new_blocks(n)``: pop ``n`` blocks from the front, evict their hashes, set ref_cnt 1.

    The popped blocks are the free blocks with fewer than ``n`` free blocks
    before them; their rank is their place in pop order. Returns the new
    state, ``popped`` and ``rank`` per block id, the model's assertions
    (``n`` within the free blocks; each popped block has ref_cnt 0), and the
    instance of ``theorem_rank`` that says exactly ``n`` blocks are popped.
    """
    sh = s.shape
    blocks = list(sh.blocks)
    rank = {b: free_rank(s, b) for b in blocks}
    popped = {b: land(s.in_free[b], rank[b] < n) for b in blocks}
    checks = [
        ("get_new_blocks: num_blocks <= free blocks", land(0 <= n, n <= s.num_free_blocks)),
        (
            "get_new_blocks: popped blocks have ref_cnt 0",
            land(*(limplies(popped[b], eq(s.ref_cnt[b], 0)) for b in blocks)),
        ),
    ]
    # _maybe_evict_cached_block, only with caching: drop the hash and the map entry.
    evict = {b: land(s.enable_prefix_caching, popped[b], s.cached[b]) for b in blocks}
    post = s.replace(
        ref_cnt=[s.ref_cnt[0]] + [ite(popped[b], 1, s.ref_cnt[b]) for b in blocks],
        in_free=[s.in_free[0]] + [land(s.in_free[b], lnot(popped[b])) for b in blocks],
        cached=[s.cached[0]] + [land(s.cached[b], lnot(evict[b])) for b in blocks],
        indexed=[s.indexed[0]] + [land(s.indexed[b], lnot(evict[b])) for b in blocks],
        num_free_blocks=s.num_free_blocks - n,
    )
    checks.append(count_steps(s, post, taken=popped))
    return post, popped, rank, checks + [(PREMISE + "rank", theorem_rank(s, n))], []


def rank_abstraction(s: State, rank: dict[int, Any]) -> Abstraction:
    """The free-queue ranks ``rank[b]`` (``free_rank`` in ``s``: a count over every other block) as unknowns.

    The goals need only that ranks are non-negative and follow the free
    queue's order (``theorem_rank``'s second part, so that free blocks, whose
    keys differ, have distinct ranks); how many fall below a count is the
    ``theorem_rank`` instance the transition carries as a premise, which
    mentions the ranks and follows them.
    """
    blocks = list(s.shape.blocks)

    def facts(x: dict[Any, Any]) -> list[Check]:
        return [
            (
                "free rank: ranks are non-negative and follow the free queue's order",
                land(
                    *(0 <= x[b] for b in blocks),
                    *(
                        limplies(land(s.in_free[b], s.in_free[c], s.free_key[b] < s.free_key[c]), x[b] < x[c])
                        for b in blocks
                        for c in blocks
                        if b != c
                    ),
                ),
            )
        ]

    return Abstraction(dict(rank), facts)


def order_abstraction(
    front: dict[int, Any],
    back: dict[int, Any],
    pos: dict[int, Any],
    rank_front: dict[int, Any],
    rank_back: dict[int, Any],
) -> Abstraction:
    """The places of the freed blocks in the order they are given (``order_rank``: counts over the table) as unknowns.

    What the goals need is ``theorem_order`` for each group (front, back): a
    block later in the table comes earlier, and every place is below the
    group's size; the transition carries that instance as a premise too.
    """
    blocks = list(front)
    terms = {**{("front", b): rank_front[b] for b in blocks}, **{("back", b): rank_back[b] for b in blocks}}

    def facts(x: dict[Any, Any]) -> list[Check]:
        def group(members: dict[int, Any], key: str) -> Any:
            rank = {b: x[(key, b)] for b in blocks}
            return land(
                theorem_order(members, pos, descending=True, rank=rank),
                *(limplies(members[b], 0 <= rank[b]) for b in blocks),
            )

        return [
            (
                "freed blocks: each group in table order from its tail, every place below the group's size",
                land(group(front, "front"), group(back, "back")),
            )
        ]

    return Abstraction(terms, facts)


def pool_touch(s: State, hits: Hits) -> tuple[State, list[Check]]:
    """``BlockPool.touch(blocks)``: take a reference on each; a block at ref_cnt 0 leaves the free queue.

    ``hits[b][i]`` says block ``b`` is touched as the hit at position ``i``.
    """
    sh = s.shape
    blocks = list(sh.blocks)
    cnt = {b: count(hits[b]) for b in blocks}
    removed = {b: land(cnt[b] > 0, eq(s.ref_cnt[b], 0)) for b in blocks}
    checks = [
        (
            "touch: a block at ref_cnt 0 is in the free queue",
            land(*(limplies(removed[b], s.in_free[b]) for b in blocks)),
        )
    ]
    post = s.replace(
        ref_cnt=[s.ref_cnt[0]] + [s.ref_cnt[b] + cnt[b] for b in blocks],
        in_free=[s.in_free[0]] + [land(s.in_free[b], lnot(removed[b])) for b in blocks],
        num_free_blocks=s.num_free_blocks - count(removed[b] for b in blocks),
    )
    once = (
        STONE + "touch: a block is hit at most once (its references grow by 0 or 1)",
        land(*(eq(cnt[b], count([lor(*hits[b])])) for b in blocks)),
    )
    return post, checks + [once, count_steps(s, post, taken=removed)]


def pool_free_table(s: State, q: Any) -> tuple[State, list[Check]]:
    """``BlockPool.free_blocks(reversed(table))`` of slot ``q``'s table, under 0.33.

    The table is given tail first, i.e. by decreasing table position. Each
    block loses one reference; those reaching 0 without a hash (or with
    caching off) are prepended to the free queue in that order, hashed ones
    appended in that order (``free_uncached_blocks_to_front``). New keys go
    below ``free_lo`` and above ``free_hi``, which move out.
    """
    sh = s.shape
    blocks = list(sh.blocks)
    has = at(s.has_table, q, False)
    held = {b: land(has, at([s.held[r][b] for r in sh.slots], q, False)) for b in blocks}
    pos = {b: at([s.table_pos[r][b] for r in sh.slots], q, 0) for b in blocks}
    reach0 = {b: land(held[b], eq(s.ref_cnt[b], 1)) for b in blocks}
    front = {b: land(reach0[b], lor(lnot(s.enable_prefix_caching), lnot(s.cached[b]))) for b in blocks}
    back = {b: land(reach0[b], lnot(front[b])) for b in blocks}
    num_front = count(front.values())
    num_back = count(back.values())
    # Earlier in the given order = later in the table.
    rank_front = {b: order_rank(front, pos, b, descending=True) for b in blocks}
    rank_back = {b: order_rank(back, pos, b, descending=True) for b in blocks}
    checks = [
        ("free_blocks: ref_cnt stays >= 0", land(*(limplies(held[b], s.ref_cnt[b] >= 1) for b in blocks))),
        (
            PREMISE + "order of the freed blocks",
            land(
                theorem_order(front, pos, descending=True, rank=rank_front),
                theorem_order(back, pos, descending=True, rank=rank_back),
            ),
        ),
        (ABSTRACTION + "order of the freed blocks", order_abstraction(front, back, pos, rank_front, rank_back)),
    ]
    post = s.replace(
        ref_cnt=[s.ref_cnt[0]] + [ite(held[b], s.ref_cnt[b] - 1, s.ref_cnt[b]) for b in blocks],
        in_free=[s.in_free[0]] + [lor(s.in_free[b], reach0[b]) for b in blocks],
        free_key=[s.free_key[0]]
        + [
            ite(front[b], s.free_lo - num_front + rank_front[b], ite(back[b], s.free_hi + rank_back[b], s.free_key[b]))
            for b in blocks
        ],
        free_lo=s.free_lo - num_front - 1,
        free_hi=s.free_hi + num_back + 1,
        num_free_blocks=s.num_free_blocks + count(reach0.values()),
    )
    return post, checks + [count_steps(s, post, freed=reach0)]


# ------------------------------------------------------------------ KV cache manager


def kv_append_blocks(
    s: State, q: Any, popped: dict[int, Any], rank: dict[int, Any], n: Any
) -> tuple[State, list[Check]]:
    """``table.extend(new_blocks)`` for slot ``q`` (``KVCacheManager.allocate_slots``): popped block of rank ``j`` at ``num_blocks + j``."""
    sh = s.shape
    nb = at(s.num_blocks, q)
    held_q = {b: at([s.held[r][b] for r in sh.slots], q, False) for b in sh.blocks}
    checks = [
        (
            "allocate_slots: a new block is not already in the table",
            land(*(limplies(popped[b], lnot(held_q[b])) for b in sh.blocks)),
        )
    ]
    post = s.replace(
        held=[[s.held[r][0]] + [lor(s.held[r][b], land(eq(q, r), popped[b])) for b in sh.blocks] for r in sh.slots],
        table_pos=[
            [s.table_pos[r][0]] + [ite(land(eq(q, r), popped[b]), nb + rank[b], s.table_pos[r][b]) for b in sh.blocks]
            for r in sh.slots
        ],
        num_blocks=put(s.num_blocks, q, nb + n),
    )
    return post, checks


def kv_cache_blocks(s: State, q: Any, num_tokens: Any) -> tuple[State, list[Check]]:
    """``KVCacheManager.cache_blocks(request, num_tokens)`` + ``BlockPool.cache_full_blocks``.

    With caching on, the blocks at table positions ``[num_cached_block,
    num_full)`` get the request's block hashes (the one of their position)
    and enter the prefix-cache map in table order, where
    ``num_full = min(num_tokens, len(block_hashes) * block_size) // block_size``.
    """
    sh = s.shape
    bs = sh.block_size
    num_cached = at(s.num_cached_blocks, q)
    num_full = fdiv(imin(num_tokens, fdiv(at(s.num_tokens, q), bs) * bs), bs)
    do = land(s.enable_prefix_caching, num_cached < num_full)
    hashes = row_of(s.hashes, q)
    has = at(s.has_table, q, False)
    cached, block_hash, indexed, order = [s.cached[0]], [s.block_hash[0]], [s.indexed[0]], [s.insert_order[0]]
    cache = {}
    for b in sh.blocks:
        pos = at([s.table_pos[r][b] for r in sh.slots], q, 0)
        cache[b] = land(do, has, at([s.held[r][b] for r in sh.slots], q, False), num_cached <= pos, pos < num_full)
        cached.append(lor(s.cached[b], cache[b]))
        indexed.append(lor(s.indexed[b], cache[b]))
        block_hash.append(ite(cache[b], select(hashes, pos, hashes[0]), s.block_hash[b]))
        order.append(ite(cache[b], s.next_insert + (pos - num_cached), s.insert_order[b]))
    checks = [
        (
            "cache_full_blocks: a block is cached once (block_hash is None)",
            land(*(limplies(cache[b], lnot(s.cached[b])) for b in sh.blocks)),
        )
    ]
    post = s.replace(
        cached=cached,
        indexed=indexed,
        block_hash=block_hash,
        insert_order=order,
        next_insert=ite(do, s.next_insert + (num_full - num_cached), s.next_insert),
        num_cached_blocks=put(s.num_cached_blocks, q, ite(do, num_full, num_cached)),
    )
    return post, checks


def kv_free(s: State, q: Any) -> tuple[State, list[Check]]:
    """``KVCacheManager.free(request)``: pop the table and free its blocks tail first."""
    sh = s.shape
    post, checks = pool_free_table(s, q)
    post = post.replace(
        has_table=put(post.has_table, q, False),
        num_blocks=put(post.num_blocks, q, 0),
        num_cached_blocks=put(post.num_cached_blocks, q, 0),
        held=[[post.held[r][0]] + [land(post.held[r][b], lnot(eq(q, r))) for b in sh.blocks] for r in sh.slots],
    )
    return post, checks


Hits = dict[int, list[Any]]
"""``hits[b][i]``: block ``b`` is the prefix hit at table position ``i``."""


def computed_blocks(s: State, q: Any) -> tuple[Any, Hits, list[Any]]:
    """``KVCacheManager.get_computed_blocks(request)`` (§9.4): the cached prefix in whole blocks.

    Looks up the request's hashes ``[0, (num_tokens - 1) // block_size)`` in
    order and stops at the first miss; each hit is the first block inserted
    under that hash (``BlockPool.get_cached_block``). Returns the number of
    hit blocks, the hit matrix, and per position whether the hash is in the
    map at all (for the witnesses).
    """
    sh = s.shape
    bs = sh.block_size
    max_hit_blocks = fdiv(at(s.num_tokens, q) - 1, bs)
    hashes = row_of(s.hashes, q)
    blocks = list(sh.blocks)
    going: Any = s.enable_prefix_caching
    hits: Hits = {b: [] for b in blocks}
    present_at: list[Any] = []
    num_hits: list[Any] = []
    for i in range(sh.num_blocks):
        h = hashes[i]
        under = {b: land(s.indexed[b], eq(s.block_hash[b], h)) for b in blocks}
        present = lor(*under.values())
        going = land(going, i < max_hit_blocks, present)
        for b in blocks:
            first = land(
                under[b], *(limplies(under[c], s.insert_order[b] < s.insert_order[c]) for c in blocks if c != b)
            )
            hits[b].append(land(going, first))
        present_at.append(present)
        num_hits.append(going)
    return count(num_hits), hits, present_at


def hit_abstraction(s: State, q: Any, k: Any, hits: Hits) -> Abstraction:
    """The prefix hit of slot ``q`` (``computed_blocks``) as unknowns: the hit count ``k`` and ``hits[b][i]``.

    Each hit entry compares a block's hash with the request's hash of its
    position and its insertion order with every other block's; the goals
    after an admission need only what ``facts`` says: the count is within the
    lookup's range (0 without caching), a hit is below the count and is an
    indexed, cached block under the request's hash of its position, and a
    position has at most one hit block, a block at most one position.
    """
    sh = s.shape
    n = sh.num_blocks
    hashes = row_of(s.hashes, q)
    max_hit_blocks = fdiv(at(s.num_tokens, q) - 1, sh.block_size)
    terms = {"k": k, **{("hit", b, i): hits[b][i] for b in sh.blocks for i in range(n)}}

    def facts(x: dict[Any, Any]) -> list[Check]:
        def hit(b: int, i: int) -> Any:
            return x[("hit", b, i)]

        return [
            (
                "prefix hit: the hit count is within the lookup (none without caching)",
                land(0 <= x["k"], x["k"] <= max_hit_blocks, limplies(lnot(s.enable_prefix_caching), eq(x["k"], 0))),
            ),
            (
                "prefix hit: a hit is below the count, an indexed cached block under the request's hash of its position",
                land(
                    *(
                        limplies(hit(b, i), land(i < x["k"], s.indexed[b], s.cached[b], eq(s.block_hash[b], hashes[i])))
                        for b in sh.blocks
                        for i in range(n)
                    )
                ),
            ),
            (
                "prefix hit: at most one block per position and one position per block",
                land(
                    *(
                        lnot(land(hit(b, i), hit(c, i)))
                        for i in range(n)
                        for b in sh.blocks
                        for c in sh.blocks
                        if b < c
                    ),
                    *(lnot(land(hit(b, i), hit(b, j))) for b in sh.blocks for i in range(n) for j in range(i + 1, n)),
                ),
            ),
        ]

    return Abstraction(terms, facts)


def kv_adopt_hits(s: State, q: Any, hits: Hits, k: Any) -> tuple[State, list[Check]]:
    """The first allocation of slot ``q`` adopts its prefix hit as its table: hit ``i`` at position ``i``."""
    sh = s.shape
    adopted = {b: lor(*hits[b]) for b in sh.blocks}
    where: dict[int, Any] = {}
    for b in sh.blocks:
        w: Any = 0
        for i in reversed(range(len(hits[b]))):
            w = ite(hits[b][i], i, w)
        where[b] = w
    held_q = {b: at([s.held[r][b] for r in sh.slots], q, False) for b in sh.blocks}
    n = sh.num_blocks
    checks = [
        (
            "allocate_slots: hit blocks differ and are not already in the table",
            land(
                *(
                    land(
                        lnot(land(adopted[b], held_q[b])),
                        *(lnot(land(hits[b][i], hits[b][j])) for i in range(n) for j in range(i + 1, n)),
                    )
                    for b in sh.blocks
                )
            ),
        )
    ]
    checks.append(
        (
            STONE + "allocate_slots: one hit per table position",
            land(
                *(lnot(land(hits[b][i], hits[c][i])) for i in range(n) for b in sh.blocks for c in sh.blocks if b < c)
            ),
        )
    )
    post = s.replace(
        held=[[s.held[r][0]] + [lor(s.held[r][b], land(eq(q, r), adopted[b])) for b in sh.blocks] for r in sh.slots],
        table_pos=[
            [s.table_pos[r][0]] + [ite(land(eq(q, r), adopted[b]), where[b], s.table_pos[r][b]) for b in sh.blocks]
            for r in sh.slots
        ],
        num_blocks=put(s.num_blocks, q, k),
        num_cached_blocks=put(s.num_cached_blocks, q, k),
        has_table=put(s.has_table, q, True),
    )
    return post, checks


# ------------------------------------------------------------------ scheduler pieces


def select_victim(s: State) -> Any:
    """``Scheduler.select_victim``: FCFS the tail of running; priority the first maximal (priority, arrival)."""
    sh = s.shape
    if not sh.is_priority:
        return running_at(s, s.num_running() - 1)
    out: Any = -1
    for r in reversed(sh.slots):
        key_r = (s.priority[r], s.arrival_time[r])
        is_victim = land(
            s.in_running[r],
            *(
                limplies(
                    s.in_running[c],
                    land(
                        _key_le((s.priority[c], s.arrival_time[c]), key_r),
                        limplies(
                            s.running_pos[c] < s.running_pos[r], _key_lt((s.priority[c], s.arrival_time[c]), key_r)
                        ),
                    ),
                )
                for c in sh.slots
                if c != r
            ),
        )
        out = ite(is_victim, r, out)
    return out


def preempt_request(s: State, v: Any) -> tuple[State, list[Check]]:
    """``Scheduler._preempt_request`` (§4.2): free the blocks, PREEMPTED, computed 0, back to waiting."""
    post, checks = kv_free(s, v)
    post = post.replace(status=put(post.status, v, PREEMPTED), num_computed_tokens=put(post.num_computed_tokens, v, 0))
    return prepend_waiting(post, v), checks


def preempt_victim(s: State, victim: Any) -> tuple[State, list[Check]]:
    """One failed attempt of ``_allocate_or_preempt``: record, remove the victim (with the priority repair), preempt it.

    Priority (0.33, ``priority_victim_repair = "index"``): the cursor moves
    back iff the victim stood before it; a victim scheduled earlier in the
    step gives its tokens back. FCFS removes the tail (never behind the cursor).
    """
    sh = s.shape
    k = s.num_preemptions
    n = s.num_running()
    vpos = at(s.running_pos, victim)
    # The candidates' keys in running order, built once for all records (the same terms for each).
    priorities = [running_value(s, s.priority, j) for j in range(sh.num_reqs)]
    arrivals = [running_value(s, s.arrival_time, j) for j in range(sh.num_reqs)]
    rec = s.replace(
        rec_num_candidates=put(s.rec_num_candidates, k, n),
        rec_victim_pos=put(s.rec_victim_pos, k, vpos),
        rec_priority=[
            [ite(eq(k, kk), priorities[j], s.rec_priority[kk][j]) for j in range(sh.num_reqs)] for kk in sh.slots
        ],
        rec_arrival=[
            [ite(eq(k, kk), arrivals[j], s.rec_arrival[kk][j]) for j in range(sh.num_reqs)] for kk in sh.slots
        ],
        num_preemptions=k + 1,
    )
    checks: list[Check] = [
        ("preemption records fit R slots", k < sh.num_reqs),
        ("a victim exists", slot_in_range(s, victim)),
    ]
    if sh.is_priority:
        sched_v = at(s.num_scheduled, victim)
        was_scheduled = sched_v > 0
        rec = rec.replace(
            req_index=ite(vpos < s.req_index, s.req_index - 1, s.req_index),
            token_budget=ite(was_scheduled, s.token_budget + sched_v, s.token_budget),
            total_num_scheduled=ite(was_scheduled, s.total_num_scheduled - sched_v, s.total_num_scheduled),
            num_scheduled=put(s.num_scheduled, victim, ite(was_scheduled, 0, sched_v)),
        )
    rec = remove_from_running(rec, victim)
    post, more = preempt_request(rec, victim)
    return post, checks + more


# ------------------------------------------------------------------ transitions

CASE_REQUEST, CASE_VICTIM = "case_request", "case_victim"
"""Input keys that pin a derived slot to a Python int (proof by cases; see ``pinned``)."""


def pinned(inp: dict[str, Any], key: str, value: Any) -> tuple[Any, Any]:
    """``(slot, condition)``: the Python slot ``inp[key]`` when the proof splits on it, else ``value``.

    When pinned, ``condition`` says the derived slot is that one; the case's
    guard includes it, and ``proofs.prove`` proves the cases cover the guard.
    """
    if key in inp:
        return inp[key], eq(value, inp[key])
    return value, True


def holds_running_request(s: State, q: Any) -> Any:
    """``_schedule_running``: a step that holds prefill back skips a running prefill chunk (decodes still fill it)."""
    return land(s.defer_prefills, at(s.is_prefill_chunk, q, False))


def holds_admission(s: State, num_computed: Any, num_tokens: Any) -> Any:
    """``_schedule_waiting``: a step that holds prefill back breaks at a head with more than one token left to compute."""
    return land(s.defer_prefills, num_computed < num_tokens - 1)


def _phase_is(s: State, *phases: int) -> Any:
    return lor(*(eq(s.phase, p) for p in phases))


def _running_guard(s: State) -> Any:
    """The running loop's condition: ``req_index < len(running) and token_budget > 0`` (and it did not break)."""
    return land(eq(s.phase, RUNNING_LOOP), lnot(s.running_done), s.req_index < s.num_running(), s.token_budget > 0)


def running_start(s: State, inp: dict[str, Any]) -> Outcome:
    """The start of one iteration of ``Scheduler._schedule_running`` (§4.1 steps 1-3).

    Take ``running[req_index]``; a step that holds prefill back skips it if it
    is a prefill chunk. Its new tokens are what it lacks, capped by the step's
    threshold, the budget and ``max_model_len - 1 - computed``; zero tokens
    skip it too (``continue``). Otherwise ``_allocate_or_preempt`` starts for
    it (``running_allocate`` / ``running_preempt``).
    """
    q, is_case = pinned(inp, CASE_REQUEST, running_at(s, s.req_index))
    guard = land(_running_guard(s), lnot(s.alloc_active), is_case)
    ntok, comp = at(s.num_tokens, q), at(s.num_computed_tokens, q)
    held = holds_running_request(s, q)
    num_new = ntok - comp
    num_new = ite(land(0 < s.threshold, s.threshold < num_new), s.threshold, num_new)
    num_new = imin(num_new, s.token_budget)
    num_new = imin(num_new, s.max_model_len - 1 - comp)
    skip = lor(held, eq(num_new, 0))
    post = merge(
        skip, s.replace(req_index=s.req_index + 1), s.replace(alloc_active=True, alloc_request=q, alloc_num_new=num_new)
    )
    return Outcome(
        post,
        guard,
        [("running loop: num_new_tokens >= 0", num_new >= 0)],
        {"request": q, "num_new_tokens": num_new, "skipped": skip, "held": held},
    )


def _slots_needed(s: State, q: Any) -> Any:
    """``get_num_blocks_to_allocate`` for the allocating request, which has a table: cdiv(slots) - held, floored at 0."""
    num_new = s.alloc_num_new
    comp = at(s.num_computed_tokens, q)
    need_slot = imin(comp + num_new + s.num_lookahead_tokens, s.max_model_len)
    return imax(cdiv(need_slot, s.shape.block_size) - at(s.num_blocks, q), 0)


def running_allocate(s: State, inp: dict[str, Any]) -> Outcome:
    """``allocate_slots`` succeeds for the allocating request: pop and append blocks, cache full ones, commit (§4.1 step 6)."""
    q, is_case = pinned(inp, CASE_REQUEST, s.alloc_request)
    num_new = s.alloc_num_new
    needed = _slots_needed(s, q)
    guard = land(eq(s.phase, RUNNING_LOOP), s.alloc_active, needed <= s.num_free_blocks, is_case)
    ntok, comp = at(s.num_tokens, q), at(s.num_computed_tokens, q)
    post, popped, rank, c1, _ = pool_get_new_blocks(s, needed)
    post, c2 = kv_append_blocks(post, q, popped, rank, needed)
    post, c3 = kv_cache_blocks(post, q, imin(comp + num_new, ntok))
    post = post.replace(
        num_scheduled=put(post.num_scheduled, q, num_new),
        token_budget=post.token_budget - num_new,
        total_num_scheduled=post.total_num_scheduled + num_new,
        req_index=post.req_index + 1,
        alloc_active=False,
        prefill_in_step=lor(post.prefill_in_step, at(s.is_prefill_chunk, q, False)),
    )
    return Outcome(post, guard, c1 + c2 + c3, {"request": q, "num_new_tokens": num_new, "new_blocks": needed})


def running_preempt(s: State, inp: dict[str, Any]) -> Outcome:
    """``allocate_slots`` fails for the allocating request: preempt one victim (§4.1 step 4).

    The victim is chosen by the policy and removed (with the priority
    repair) and preempted. If it is the allocating request itself, the
    allocation ends: FCFS breaks the running loop; priority (0.33) continues
    with the request that moved into its place.
    """
    sh = s.shape
    q, is_case = pinned(inp, CASE_REQUEST, s.alloc_request)
    victim, is_victim_case = pinned(inp, CASE_VICTIM, select_victim(s))
    # alloc_active implies the running loop (lemma_step); said here so that the proofs pin the phase.
    guard = land(
        eq(s.phase, RUNNING_LOOP), s.alloc_active, _slots_needed(s, q) > s.num_free_blocks, is_case, is_victim_case
    )
    post, checks = preempt_victim(s, victim)
    is_self = eq(victim, q)
    was_scheduled = at(s.num_scheduled, victim) > 0
    post = post.replace(alloc_active=lnot(is_self))
    if not sh.is_priority:
        post = post.replace(running_done=lor(post.running_done, is_self))
    return Outcome(
        post,
        guard,
        checks,
        {
            "request": q,
            "victim": victim,
            "self_preempted": is_self,
            "victim_was_scheduled": land(was_scheduled, sh.is_priority),
            "victim_before_cursor": at(s.running_pos, victim) < s.req_index,
        },
    )


def running_iteration(s: State, inp: dict[str, Any]) -> Outcome:
    """One whole iteration of the running loop: ``running_start``, then ``running_preempt`` until ``running_allocate`` or a self-preemption.

    The composition of the three steps (the inner loop unrolled R + 1 times;
    a check proves that is enough). It is equal to applying the steps one by
    one, which the drift guard uses; proofs at the target bounds are per
    step, this composition is proved at smaller bounds.
    """
    sh = s.shape
    start = running_start(s, inp)
    cur = start.post
    checks = list(start.checks)
    premises: list[Any] = []
    self_preempted: Any = False
    victim_was_scheduled: Any = False
    for _attempt in range(sh.num_reqs + 1):
        alloc = running_allocate(cur, inp)
        pre = running_preempt(cur, inp)
        active = cur.alloc_active
        checks += under(land(active, alloc.guard), alloc.checks)
        checks += under(land(active, pre.guard), pre.checks)
        premises += alloc.premises + pre.premises
        self_preempted = lor(self_preempted, land(active, pre.guard, pre.facts["self_preempted"]))
        victim_was_scheduled = lor(victim_was_scheduled, land(active, pre.guard, pre.facts["victim_was_scheduled"]))
        cur = merge(active, merge(alloc.guard, alloc.post, pre.post), cur)
    checks.append(("allocation loop ends within R + 1 attempts", lnot(cur.alloc_active)))
    return Outcome(
        cur,
        start.guard,
        checks,
        {
            "request": start.facts["request"],
            "num_new_tokens": start.facts["num_new_tokens"],
            "self_preempted": self_preempted,
            "victim_was_scheduled": victim_was_scheduled,
            "skipped": start.facts["skipped"],
        },
        premises,
    )


def end_running_loop(s: State, inp: dict[str, Any]) -> Outcome:
    """The running loop ends (its condition fails or it broke); the waiting loop runs only if nobody was preempted."""
    guard = land(
        eq(s.phase, RUNNING_LOOP),
        lnot(s.alloc_active),
        lor(s.running_done, s.req_index >= s.num_running(), s.token_budget <= 0),
    )
    post = s.replace(phase=WAITING_LOOP, waiting_done=s.num_preemptions > 0)
    return Outcome(post, guard)


def _waiting_plan(s: State, inp: dict[str, Any]) -> dict[str, Any]:
    """The decisions of one ``_schedule_waiting`` iteration (§4.3), before anything changes.

    At the seat cap, break. Take the head; a waiting request holds no blocks
    and has computed nothing (checks), so its prefix hit gives
    ``num_computed_tokens``; a step that holds prefill back breaks at a head
    with more than one token left to compute; the new tokens are the rest,
    capped by the threshold; with chunked prefill off a request over the budget breaks the
    loop; then capped by the budget. ``allocate_slots`` with the hit, the
    lookahead and the full-sequence gate counts the hit blocks that are still
    in the free queue (``ref_cnt == 0``: touching takes them out) against the
    free blocks, and refuses (break) unless both gates fit.
    """
    sh = s.shape
    bs = sh.block_size
    q, is_case = pinned(inp, CASE_REQUEST, waiting_head(s))
    ntok, comp = at(s.num_tokens, q), at(s.num_computed_tokens, q)
    k, hits, present = computed_blocks(s, q)
    num_computed = k * bs
    held = holds_admission(s, num_computed, ntok)
    num_new = ntok - num_computed
    num_new = ite(land(0 < s.threshold, s.threshold < num_new), s.threshold, num_new)
    too_long = land(lnot(s.enable_chunked_prefill), num_new > s.token_budget)
    num_new = imin(num_new, s.token_budget)
    at_cap = s.num_running() >= s.max_num_seqs
    adopted = {b: lor(*hits[b]) for b in sh.blocks}
    # The model sums over the hit list; its blocks differ (a check), so per block is the same.
    evictable_blocks = {b: land(adopted[b], eq(s.ref_cnt[b], 0)) for b in sh.blocks}
    evictable = count(evictable_blocks.values())
    total_computed = imin(num_computed, s.max_model_len)

    def to_allocate(num_tokens: Any) -> Any:
        return imax(cdiv(num_tokens, bs) - k, 0) + evictable

    full_needed = to_allocate(imin(ntok, s.max_model_len))
    full_refused = land(s.reserve_full_sequence, full_needed > s.num_free_blocks)
    need_slot = imin(total_computed + num_new + s.num_lookahead_tokens, s.max_model_len)
    slot_needed = to_allocate(need_slot)
    refused = lor(full_refused, slot_needed > s.num_free_blocks)
    stop = lor(at_cap, held, too_long, refused)
    nfull = fdiv(ntok, bs)
    checks = [
        ("waiting loop: the head holds no blocks", lnot(at(s.has_table, q, False))),
        ("waiting loop: the head has computed nothing (so its prefix hit is looked up)", eq(comp, 0)),
        ("waiting loop: num_new_tokens > 0", limplies(land(lnot(at_cap), lnot(too_long)), num_new > 0)),
    ]
    return {
        "request": q,
        "ntok": ntok,
        "hit_blocks": k,
        "hits": hits,
        "adopted": adopted,
        "num_computed": num_computed,
        "num_new_tokens": num_new,
        "need_slot": need_slot,
        "total_computed": total_computed,
        "evictable": evictable,
        "slot_needed": slot_needed,
        "full_needed": full_needed,
        "stop": stop,
        "held": land(lnot(at_cap), held),
        "prefill": num_computed < ntok - 1,
        "refused": land(lnot(at_cap), lnot(held), lnot(too_long), refused),
        "checks": checks,
        "is_case": is_case,
        "whole_prompt_cached": land(
            eq(ntok - nfull * bs, 0), *(limplies(i < nfull, present[i]) for i in range(sh.num_blocks))
        ),
        "num_free_blocks": s.num_free_blocks,
    }


def _waiting_guard(s: State) -> Any:
    return land(eq(s.phase, WAITING_LOOP), lnot(s.waiting_done), s.token_budget > 0, s.num_waiting() > 0)


def _waiting_facts(plan: dict[str, Any], admitted: Any) -> dict[str, Any]:
    keys = (
        "request",
        "hit_blocks",
        "num_new_tokens",
        "held",
        "whole_prompt_cached",
        "evictable",
        "slot_needed",
        "full_needed",
        "refused",
        "num_free_blocks",
    )
    return {"admitted": admitted, **{k: plan[k] for k in keys}}


def waiting_admit(s: State, inp: dict[str, Any]) -> Outcome:
    """One admission of ``_schedule_waiting``: touch and adopt the hit, pop new blocks, cache, admit (§4.3 steps 9-11)."""
    sh = s.shape
    bs = sh.block_size
    plan = _waiting_plan(s, inp)
    q, num_new, k = plan["request"], plan["num_new_tokens"], plan["hit_blocks"]
    guard = land(_waiting_guard(s), lnot(plan["stop"]), plan["is_case"])
    a, c1 = pool_touch(s, plan["hits"])
    a, c2 = kv_adopt_hits(a, q, plan["hits"], k)
    touched = a
    num_new_blocks = imax(cdiv(plan["need_slot"], bs) - k, 0)
    a, popped, rank, c3, _ = pool_get_new_blocks(a, num_new_blocks)
    # Stepping stones for the proofs (each is also a fact of the model):
    steps = [
        (
            "allocate_slots: the adopted hit blocks are cached",
            land(*(limplies(plan["adopted"][b], s.cached[b]) for b in sh.blocks)),
        ),
        (
            "allocate_slots: the popped blocks are in no table",
            land(*(limplies(popped[b], lnot(s.held[r][b])) for b in sh.blocks for r in sh.slots)),
        ),
        (
            "allocate_slots: the new blocks come after the hit blocks in the table",
            land(*(limplies(popped[b], k <= k + rank[b]) for b in sh.blocks)),
        ),
    ]
    a, c4 = kv_append_blocks(a, q, popped, rank, num_new_blocks)
    a, c5 = kv_cache_blocks(a, q, imin(plan["total_computed"] + num_new, plan["ntok"]))
    a = remove_from_waiting(a, q)
    a = append_running(a, q)
    a = a.replace(
        num_scheduled=put(a.num_scheduled, q, num_new),
        token_budget=a.token_budget - num_new,
        total_num_scheduled=a.total_num_scheduled + num_new,
        status=put(a.status, q, RUNNING),
        num_computed_tokens=put(a.num_computed_tokens, q, plan["num_computed"]),
        prefill_in_step=lor(a.prefill_in_step, plan["prefill"]),
    )
    return Outcome(
        a,
        guard,
        plan["checks"] + c2 + c1 + c3 + steps + c4 + c5,
        _waiting_facts(plan, True),
        abstractions=[hit_abstraction(s, q, k, plan["hits"]), rank_abstraction(touched, rank)],
    )


def waiting_stop(s: State, inp: dict[str, Any]) -> Outcome:
    """The waiting loop breaks: seat cap, a request over the budget with chunking off, or no space (§4.3)."""
    plan = _waiting_plan(s, inp)
    guard = land(_waiting_guard(s), plan["stop"], plan["is_case"])
    return Outcome(s.replace(waiting_done=True), guard, plan["checks"], _waiting_facts(plan, False))


def waiting_admission(s: State, inp: dict[str, Any]) -> Outcome:
    """One whole iteration of the waiting loop: ``waiting_admit`` or ``waiting_stop`` (their composition)."""
    admit = waiting_admit(s, inp)
    stop = waiting_stop(s, inp)
    facts = {k: ite(admit.guard, v, stop.facts[k]) if k != "admitted" else admit.guard for k, v in admit.facts.items()}
    return Outcome(
        merge(admit.guard, admit.post, stop.post),
        lor(admit.guard, stop.guard),
        under(admit.guard, admit.checks),
        facts,
        admit.premises,
    )


def end_schedule(s: State, inp: dict[str, Any]) -> Outcome:
    """The waiting loop ends; the deferral bookkeeping; ``_update_after_schedule`` counts the scheduled tokens as computed (§4.5).

    A step that ran the waiting loop (nobody preempted) without deferring
    records whether it left anyone waiting (``prefill_capacity_bound``; no
    request is in ``deferred_waiting`` here: nothing is stale in a synchronous
    run). A step that scheduled tokens counts as executed; with
    ``prefill_schedule_interval > 1`` one that carried prefill becomes the last
    prefill step. Each scheduled request is a prefill chunk iff it still lacks
    tokens.
    """
    guard = land(eq(s.phase, WAITING_LOOP), lor(s.waiting_done, s.token_budget <= 0, eq(s.num_waiting(), 0)))
    sh = s.shape
    scheduled = [land(s.live(r), s.num_scheduled[r] > 0) for r in sh.slots]
    computed = [
        ite(scheduled[r], s.num_computed_tokens[r] + s.num_scheduled[r], s.num_computed_tokens[r]) for r in sh.slots
    ]
    executed = ite(s.total_num_scheduled > 0, s.num_executed_steps + 1, s.num_executed_steps)
    post = s.replace(
        phase=PENDING,
        num_computed_tokens=computed,
        is_prefill_chunk=[ite(scheduled[r], computed[r] < s.num_tokens[r], s.is_prefill_chunk[r]) for r in sh.slots],
        prefill_capacity_bound=ite(
            land(eq(s.num_preemptions, 0), lnot(s.defer_prefills)), s.num_waiting() > 0, s.prefill_capacity_bound
        ),
        num_executed_steps=executed,
        last_prefill_step=ite(land(s.prefill_schedule_interval > 1, s.prefill_in_step), executed, s.last_prefill_step),
    )
    return Outcome(
        post,
        guard,
        facts={"budget_exhausted": eq(s.token_budget, 0), "total_scheduled": s.max_num_batched_tokens - s.token_budget},
    )


def is_prefill_deferred(s: State, throttle_prefills: Any) -> Any:
    """``Scheduler.is_prefill_deferred``: the step holds prefill back.

    On the coordinator's word (``throttle_prefills``) or, with
    ``prefill_schedule_interval`` N > 1, until N executed steps have passed
    since the last step that carried prefill; never when the last releasing
    step was capacity bound or every running request is a prefill chunk.
    """
    interval = s.prefill_schedule_interval
    held = lor(throttle_prefills, land(interval > 1, (s.num_executed_steps + 1) - s.last_prefill_step < interval))
    all_chunks = land(*(limplies(s.in_running[r], s.is_prefill_chunk[r]) for r in s.shape.slots))
    return land(held, lnot(s.prefill_capacity_bound), lnot(all_chunks))


def begin_step(s: State, inp: dict[str, Any]) -> Outcome:
    """``schedule(throttle_prefills)`` starts: step + 1, a fresh step state, the step's threshold (§4.0; lone request exempt in 0.33) and whether it holds prefill back."""
    sh = s.shape
    lone = s.num_running() + s.num_waiting() <= 1
    defer = is_prefill_deferred(s, inp.get("throttle_prefills", False))
    post = s.replace(
        defer_prefills=defer,
        prefill_in_step=False,
        phase=RUNNING_LOOP,
        step=s.step + 1,
        token_budget=s.max_num_batched_tokens,
        req_index=0,
        threshold=ite(lone, 0, s.long_prefill_token_threshold),
        num_preemptions=0,
        running_done=False,
        waiting_done=False,
        num_scheduled=[0] * sh.num_reqs,
        total_num_scheduled=0,
    )
    return Outcome(post, eq(s.phase, IDLE), facts={"defer_prefills": defer})


def begin_update(s: State, inp: dict[str, Any]) -> Outcome:
    """``update_from_output()`` starts: the pending output is taken (``pending_output = None``)."""
    return Outcome(s.replace(phase=UPDATING), eq(s.phase, PENDING))


def append_token(s: State, inp: dict[str, Any]) -> Outcome:
    """``update_from_output`` for one scheduled request (§5), one sampled token, no drafts.

    A prefill chunk (computed < num_tokens) samples nothing. Otherwise the
    token is appended (a block it completes gets a new hash, assumed to differ
    from the request's earlier hashes), then the stop check (``eos_first``):
    a stop token stops it; reaching ``max_model_len`` or ``max_tokens`` caps
    it; a stopped request is freed (blocks tail first) and leaves ``running``.
    """
    sh = s.shape
    bs = sh.block_size
    q, is_stop, new_hash = inp["slot"], inp["stop_token"], inp["new_hash"]
    ntok, comp = at(s.num_tokens, q), at(s.num_computed_tokens, q)
    old_hashes = row_of(s.hashes, q)
    nfull = fdiv(ntok, bs)
    guard = land(
        eq(s.phase, UPDATING),
        slot_in_range(s, q),
        lor(*(land(eq(q, r), s.live(r)) for r in sh.slots)),
        at(s.num_scheduled, q) > 0,
        *(limplies(i < nfull, lnot(eq(new_hash, old_hashes[i]))) for i in range(sh.num_blocks)),
    )
    samples = comp >= ntok
    n1 = ntok + 1
    completes = fdiv(n1, bs) > nfull
    grown = s.replace(
        num_tokens=put(s.num_tokens, q, n1),
        hashes=[
            [ite(land(eq(q, r), completes, eq(i, nfull)), new_hash, s.hashes[r][i]) for i in range(sh.num_blocks)]
            for r in sh.slots
        ],
    )
    length = lor(n1 >= s.max_model_len, n1 - at(s.num_prompt_tokens, q) >= at(s.max_tokens, q))
    stopped = lor(is_stop, length)
    freed, c1 = kv_free(grown, q)
    freed = remove_from_running(freed.replace(status=put(freed.status, q, DEAD)), q)
    after = merge(stopped, freed, grown)
    post = merge(samples, after, s)
    post = post.replace(num_scheduled=put(post.num_scheduled, q, 0))
    checks = under(land(samples, stopped), c1)
    return Outcome(
        post,
        guard,
        checks,
        {
            "request": q,
            "samples": samples,
            "stopped": land(samples, stopped),
            "length_capped_at_max_model_len": land(
                samples, lnot(is_stop), n1 >= s.max_model_len, n1 - at(s.num_prompt_tokens, q) < at(s.max_tokens, q)
            ),
            "num_tokens_before": ntok,
        },
    )


def end_update(s: State, inp: dict[str, Any]) -> Outcome:
    """``update_from_output()`` ends: every scheduled request was processed; the step's output is gone."""
    sh = s.shape
    guard = land(eq(s.phase, UPDATING), *(limplies(s.live(r), eq(s.num_scheduled[r], 0)) for r in sh.slots))
    post = s.replace(phase=IDLE, num_scheduled=[0] * sh.num_reqs, total_num_scheduled=0, num_preemptions=0)
    return Outcome(post, guard)


def _abort(s: State, inp: dict[str, Any], phases: tuple[int, ...]) -> Outcome:
    """``Scheduler.abort`` -> ``finish_requests([id], FINISHED_ABORTED)`` (§7).

    A live request leaves ``running`` or ``waiting``, is freed (blocks tail
    first) and forgotten. A dead slot is a no-op (already finished). The
    pending output, if any, is untouched.
    """
    sh = s.shape
    q = inp["slot"]
    live = lor(*(land(eq(q, r), s.live(r)) for r in sh.slots))
    was_running = eq(at(s.status, q), RUNNING)
    out = merge(was_running, remove_from_running(s, q), remove_from_waiting(s, q))
    out = out.replace(status=put(out.status, q, DEAD))
    out, checks = kv_free(out, q)
    post = merge(live, out, s)
    guard = land(_phase_is(s, *phases), slot_in_range(s, q))
    return Outcome(post, guard, under(live, checks), {"request": q, "live": live})


def abort_idle(s: State, inp: dict[str, Any]) -> Outcome:
    """Abort between steps (no output pending)."""
    return _abort(s, inp, (IDLE,))


def abort_pending(s: State, inp: dict[str, Any]) -> Outcome:
    """Abort while a step's output is pending (between ``schedule()`` and ``update_from_output()``)."""
    return _abort(s, inp, (PENDING,))


def add_request(s: State, inp: dict[str, Any]) -> Outcome:
    """``Scheduler.add_request`` (§7): a new WAITING request at the tail of ``waiting``.

    The model requires ``1 <= len(prompt) <= max_model_len - 1`` and
    ``max_tokens >= 1``; the prompt's block hashes are inputs, assumed to
    differ pairwise (a chained hash encodes its prefix length).
    """
    sh = s.shape
    q = inp["slot"]
    n = inp["num_prompt_tokens"]
    hashes = inp["hashes"]
    nfull = fdiv(n, sh.block_size)
    guard = land(
        _phase_is(s, IDLE, PENDING),
        slot_in_range(s, q),
        eq(at(s.status, q, 0), DEAD),
        # An id aborted in the pending step is refused until its output is applied.
        eq(at(s.num_scheduled, q), 0),
        1 <= n,
        n <= s.max_model_len - 1,
        inp["max_tokens"] >= 1,
        *(
            limplies(j < nfull, lnot(eq(hashes[i], hashes[j])))
            for i in range(sh.num_blocks)
            for j in range(i + 1, sh.num_blocks)
        ),
    )
    post = s.replace(
        status=put(s.status, q, WAITING),
        num_tokens=put(s.num_tokens, q, n),
        num_prompt_tokens=put(s.num_prompt_tokens, q, n),
        max_tokens=put(s.max_tokens, q, inp["max_tokens"]),
        num_computed_tokens=put(s.num_computed_tokens, q, 0),
        is_prefill_chunk=put(s.is_prefill_chunk, q, False),
        priority=put(s.priority, q, inp["priority"]),
        arrival_time=put(s.arrival_time, q, inp["arrival_time"]),
        hashes=[[ite(eq(q, r), hashes[i], s.hashes[r][i]) for i in range(sh.num_blocks)] for r in sh.slots],
    )
    return Outcome(append_waiting(post, q), guard, facts={"request": q})


# --------------------------------------------------------- block-pool transitions


def _running_slot(s: State, q: Any) -> Any:
    return lor(*(land(eq(q, r), s.live(r), eq(s.status[r], RUNNING)) for r in s.shape.slots))


def get_new_blocks(s: State, inp: dict[str, Any]) -> Outcome:
    """``BlockPool.get_new_blocks(n)`` appended to a RUNNING request's table, evicting cached blocks on reuse."""
    q, n = inp["slot"], inp["num_blocks"]
    post, popped, rank, checks, premises = pool_get_new_blocks(s, n)
    post, more = kv_append_blocks(post, q, popped, rank, n)
    guard = land(slot_in_range(s, q), _running_slot(s, q), 0 <= n, n <= s.num_free_blocks)
    return Outcome(post, guard, checks + more, {}, premises)


def evict_on_reuse(s: State, inp: dict[str, Any]) -> Outcome:
    """``get_new_blocks`` when the front of the free queue is a cached block: it is evicted from the prefix cache."""
    out = get_new_blocks(s, inp)
    front_cached = lor(*(land(s.in_free[b], eq(free_rank(s, b), 0), s.cached[b]) for b in s.shape.blocks))
    return Outcome(out.post, land(out.guard, inp["num_blocks"] >= 1, front_cached), out.checks, {}, out.premises)


def touch(s: State, inp: dict[str, Any]) -> Outcome:
    """``BlockPool.touch`` of a request's prefix hit, adopted as its table (``allocate_slots``, first allocation).

    The request is RUNNING with an empty table and nothing computed, so the
    adoption alone keeps the request-level rules.
    """
    q = inp["slot"]
    k, hits, _ = computed_blocks(s, q)
    post, checks = pool_touch(s, hits)
    post, more = kv_adopt_hits(post, q, hits, k)
    checks = checks + more
    guard = land(
        slot_in_range(s, q),
        _running_slot(s, q),
        eq(at(s.num_blocks, q), 0),
        eq(at(s.num_computed_tokens, q), 0),
        eq(at(s.num_scheduled, q), 0),
    )
    return Outcome(post, guard, checks, {"hit_blocks": k}, abstractions=[hit_abstraction(s, q, k, hits)])


def free_table(s: State, inp: dict[str, Any]) -> Outcome:
    """``KVCacheManager.free`` as ``_preempt_request`` uses it (§4.2), on a RUNNING request between steps.

    The request leaves ``running``, its blocks are freed tail first (the
    free queue's order rules), it becomes PREEMPTED with nothing computed and
    goes back to ``waiting``. (Inside the running loop the same code runs for
    the policy's victim: ``running_preempt``; for a finished request: ``abort``
    and ``append_token``.)
    """
    q = inp["slot"]
    post = remove_from_running(s, q)
    post, checks = preempt_request(post, q)
    guard = land(eq(s.phase, IDLE), slot_in_range(s, q), _running_slot(s, q))
    return Outcome(post, guard, checks, {"request": q})


def cache_full_blocks(s: State, inp: dict[str, Any]) -> Outcome:
    """``KVCacheManager.cache_blocks(request, n)`` for a RUNNING request whose table covers ``n <= num_tokens`` tokens."""
    q, n = inp["slot"], inp["num_tokens"]
    post, checks = kv_cache_blocks(s, q, n)
    guard = land(
        slot_in_range(s, q),
        _running_slot(s, q),
        0 <= n,
        n <= at(s.num_tokens, q),
        n <= at(s.num_blocks, q) * s.shape.block_size,
    )
    return Outcome(post, guard, checks)


# ------------------------------------------------------------------ registry

Inputs = Callable[[Shape, str], dict[str, Any]]


def _no_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {}


def _schedule_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {"throttle_prefills": z3.Bool(f"{tag}.throttle_prefills")}


def _slot_input(shape: Shape, tag: str) -> dict[str, Any]:
    return {"slot": z3.Int(f"{tag}.slot")}


def _slot_n_input(name: str) -> Inputs:
    def make(shape: Shape, tag: str) -> dict[str, Any]:
        return {"slot": z3.Int(f"{tag}.slot"), name: z3.Int(f"{tag}.{name}")}

    return make


def _append_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {
        "slot": z3.Int(f"{tag}.slot"),
        "stop_token": z3.Bool(f"{tag}.stop_token"),
        "new_hash": z3.Int(f"{tag}.new_hash"),
    }


def _add_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {
        "slot": z3.Int(f"{tag}.slot"),
        "num_prompt_tokens": z3.Int(f"{tag}.num_prompt_tokens"),
        "max_tokens": z3.Int(f"{tag}.max_tokens"),
        "priority": z3.Int(f"{tag}.priority"),
        "arrival_time": z3.Int(f"{tag}.arrival_time"),
        "hashes": [z3.Int(f"{tag}.hash[{i}]") for i in range(shape.num_blocks)],
    }


@dataclass(frozen=True)
class Transition:
    """A named transition: its function, how to make symbolic inputs, the model code it mirrors."""

    name: str
    apply: Callable[[State, dict[str, Any]], Outcome]
    inputs: Inputs
    mirrors: str
    split: tuple[str, ...] = ()
    """Slots the proof splits on: input ``slot`` or the derived ``case_request`` / ``case_victim``."""
    actor: tuple[str, ...] = ()
    """The acting slot(s), as case keys: a proof by slot symmetry (``symmetry.py``) keeps only the
    canonical cases (the first acting slot 0; a second one 0 or 1)."""

    def cases(self, shape: Shape) -> list[dict[str, int]]:
        """One dict of Python slot values per case (a single empty case when there is no split)."""
        out: list[dict[str, int]] = [{}]
        for key in self.split:
            out = [{**c, key: r} for c in out for r in shape.slots]
        return out


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition(
            "get_new_blocks",
            get_new_blocks,
            _slot_n_input("num_blocks"),
            "spec/v1/block_pool.py BlockPool.get_new_blocks",
            actor=("slot",),
        ),
        Transition(
            "evict_on_reuse",
            evict_on_reuse,
            _slot_n_input("num_blocks"),
            "spec/v1/block_pool.py _maybe_evict_cached_block",
            actor=("slot",),
        ),
        Transition(
            "touch",
            touch,
            _slot_input,
            "spec/v1/block_pool.py BlockPool.touch; spec/v1/kv_cache.py allocate_slots",
            actor=("slot",),
        ),
        Transition(
            "free",
            free_table,
            _slot_input,
            "spec/v1/kv_cache.py KVCacheManager.free; spec/v1/scheduler.py _preempt_request",
            actor=("slot",),
        ),
        Transition(
            "cache_full_blocks",
            cache_full_blocks,
            _slot_n_input("num_tokens"),
            "spec/v1/kv_cache.py cache_blocks; spec/v1/block_pool.py cache_full_blocks",
            actor=("slot",),
        ),
        Transition(
            "begin_step",
            begin_step,
            _schedule_inputs,
            "spec/v1/scheduler.py schedule (start), is_prefill_deferred",
        ),
        Transition(
            "running_start",
            running_start,
            _no_inputs,
            "spec/v1/scheduler.py _schedule_running (loop body, steps 1-3)",
            actor=("case_request",),
        ),
        Transition(
            "running_allocate",
            running_allocate,
            _no_inputs,
            "spec/v1/scheduler.py _allocate_or_preempt (success), _schedule_running (commit)",
            actor=("case_request",),
        ),
        Transition(
            "running_preempt",
            running_preempt,
            _no_inputs,
            "spec/v1/scheduler.py _allocate_or_preempt (one victim), select_victim, _remove_priority_victim",
            actor=("case_request", "case_victim"),
        ),
        Transition(
            "end_running_loop", end_running_loop, _no_inputs, "spec/v1/scheduler.py schedule (between the loops)"
        ),
        Transition(
            "waiting_admit",
            waiting_admit,
            _no_inputs,
            "spec/v1/scheduler.py _schedule_waiting (admission); spec/v1/kv_cache.py allocate_slots",
            actor=("case_request",),
        ),
        Transition(
            "waiting_stop",
            waiting_stop,
            _no_inputs,
            "spec/v1/scheduler.py _schedule_waiting (break)",
            actor=("case_request",),
        ),
        Transition("end_schedule", end_schedule, _no_inputs, "spec/v1/scheduler.py _update_after_schedule"),
        Transition("begin_update", begin_update, _no_inputs, "spec/v1/scheduler.py update_from_output (start)"),
        Transition(
            "append_token",
            append_token,
            _append_inputs,
            "spec/v1/scheduler.py update_from_output, _append_output_tokens; spec/v1/stop.py",
            actor=("slot",),
        ),
        Transition("end_update", end_update, _no_inputs, "spec/v1/scheduler.py update_from_output (end)"),
        Transition("add_request", add_request, _add_inputs, "spec/v1/scheduler.py add_request", actor=("slot",)),
        Transition("abort", abort_idle, _slot_input, "spec/v1/scheduler.py abort, finish_requests", actor=("slot",)),
        Transition(
            "abort_pending", abort_pending, _slot_input, "spec/v1/scheduler.py abort, finish_requests", actor=("slot",)
        ),
    )
}


COMPOSED: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition(
            "running_iteration",
            running_iteration,
            _no_inputs,
            "spec/v1/scheduler.py _schedule_running + _allocate_or_preempt (one whole iteration)",
        ),
        Transition(
            "waiting_admission",
            waiting_admission,
            _no_inputs,
            "spec/v1/scheduler.py _schedule_waiting (one whole iteration)",
        ),
    )
}
"""Whole loop iterations, composed of the steps above; proved at smaller bounds (``--composed``)."""
