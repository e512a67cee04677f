"""The safety rules of the v0 model, each written once as ``inv_<name>(s, o)``.

``s`` is a :class:`~schedconf.spec.v0.view.ConcreteV0View`, ``o`` an operations
backend (``spec/ops.py``). The first docstring line is the rule as reports
print it. ``check_invariants(scheduler)`` runs them all and raises
:class:`InvariantViolation`; the golden runner and the stateful test call it
after every event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedconf.spec.errors import InvariantViolation
from schedconf.spec.ops import ConcreteOps
from schedconf.spec.v0.view import (
    QUEUE_RUNNING,
    QUEUE_SWAPPED,
    QUEUE_WAITING,
    RUNNING,
    SWAPPED,
    WAITING,
    ConcreteV0View,
)


def _is_free_or_held(s: Any, o: Any, b: int) -> Any:
    """Exactly one of: in the free list (ref 0), in the evictor (ref 0), held (ref > 0)."""
    free = o.eq(s.num_in_free_list(b), 1)
    evictable = s.in_evictor(b)
    held = o.lt(0, s.refcount(b))
    return o.and_(
        o.le(s.num_in_free_list(b), 1),
        o.eq(o.count([free, evictable, held]), 1),
    )


def inv_gpu_block_conservation(s: Any, o: Any) -> Any:
    """Every GPU block is exactly one of: free (hashless free list), evictable (evictor), held (ref count > 0)."""
    return o.forall(s.gpu_blocks, lambda b: _is_free_or_held(s, o, b), lambda b: f"GPU block {b}")


def inv_cpu_block_conservation(s: Any, o: Any) -> Any:
    """Every CPU block is exactly one of: free (hashless free list), evictable (evictor), held (ref count > 0)."""
    return o.forall(s.cpu_blocks, lambda b: _is_free_or_held(s, o, b), lambda b: f"CPU block {b}")


def inv_ref_count_matches_tables(s: Any, o: Any) -> Any:
    """Every block's ref count equals the number of block tables holding it; no table outlives its group."""
    return o.and_(
        o.forall(
            [*s.gpu_blocks, *s.cpu_blocks], lambda b: o.eq(s.refcount(b), s.num_holders(b)), lambda b: f"block {b}"
        ),
        o.eq(s.orphan_tables, 0),
    )


def inv_prefix_cache_map(s: Any, o: Any) -> Any:
    """The prefix-cache map points at held or evictable blocks of that content, and every held full block is in it."""
    return o.and_(
        o.forall([*s.gpu_blocks, *s.cpu_blocks], lambda b: s.cache_entry_ok(b), lambda b: f"block {b}"),
        o.forall(s.groups, lambda r: s.full_blocks_cached(r), lambda r: f"request {r}"),
    )


def inv_one_queue(s: Any, o: Any) -> Any:
    """A live group sits in exactly one queue, once, and its status fits it (a SWAPPED group in waiting is vLLM's priority-swap bug)."""

    def fits(r: str) -> Any:
        total = s.queue_count(r, QUEUE_WAITING) + s.queue_count(r, QUEUE_RUNNING) + s.queue_count(r, QUEUE_SWAPPED)
        return o.and_(
            o.eq(total, 1),
            o.implies(o.eq(s.queue_count(r, QUEUE_RUNNING), 1), o.eq(s.status(r), RUNNING)),
            o.implies(o.eq(s.queue_count(r, QUEUE_SWAPPED), 1), o.eq(s.status(r), SWAPPED)),
            o.implies(
                o.eq(s.queue_count(r, QUEUE_WAITING), 1), o.or_(o.eq(s.status(r), WAITING), o.eq(s.status(r), SWAPPED))
            ),
        )

    return o.forall(s.groups, fits, lambda r: f"request {r}")


def inv_blocks_on_the_right_device(s: Any, o: Any) -> Any:
    """A RUNNING group holds only GPU blocks, a SWAPPED one only CPU blocks, a WAITING one none."""
    return o.forall(
        s.groups,
        lambda r: o.and_(
            o.implies(o.eq(s.status(r), RUNNING), o.eq(s.num_cpu_blocks_held(r), 0)),
            o.implies(o.eq(s.status(r), SWAPPED), o.eq(s.num_gpu_blocks_held(r), 0)),
            o.implies(o.eq(s.status(r), WAITING), o.eq(s.num_blocks(r), 0)),
        ),
        lambda r: f"request {r}",
    )


def inv_table_fits_tokens(s: Any, o: Any) -> Any:
    """A group with blocks has ceil(slots / block_size) blocks for its slots, which miss at most the last sampled token."""
    return o.forall(
        s.groups,
        lambda r: o.implies(
            o.lt(0, s.num_blocks(r)),
            o.and_(
                o.eq(s.num_blocks(r), -(-s.num_full_slots(r) // s.block_size)),
                o.le(s.num_tokens(r) - 1, s.num_full_slots(r)),
                o.le(s.num_full_slots(r), s.num_tokens(r)),
            ),
        ),
        lambda r: f"request {r}",
    )


def inv_computed_range(s: Any, o: Any) -> Any:
    """0 <= num_computed_tokens <= len; a WAITING group has computed nothing."""
    return o.forall(
        s.groups,
        lambda r: o.and_(
            o.le(0, s.num_computed_tokens(r)),
            o.le(s.num_computed_tokens(r), s.num_tokens(r)),
            o.implies(o.eq(s.status(r), WAITING), o.eq(s.num_computed_tokens(r), 0)),
        ),
        lambda r: f"request {r}",
    )


def inv_step_budget(s: Any, o: Any) -> Any:
    """A step charges at most max_num_batched_tokens uncached tokens, seats at most max_num_seqs groups, reports the sum of its chunks, and never swaps in and out at once."""
    return o.and_(
        o.le(s.num_uncached_tokens, s.max_num_batched_tokens),
        o.le(s.num_curr_seqs, s.max_num_seqs),
        o.le(s.num_scheduled_groups, s.max_num_seqs),
        o.eq(s.sum_chunks, s.num_batched_tokens),
        o.not_(s.swap_in_and_out),
    )


def inv_victim_order(s: Any, o: Any) -> Any:
    """A victim is the tail of running (itself when running is empty); priority preemption takes the tail of running sorted by (priority, arrival)."""

    def right(p: Any) -> Any:
        if p.candidates:
            return o.eq(p.victim_id, p.candidates[-1])
        return o.eq(p.victim_id, p.requester_id)

    return o.forall(s.preemptions, right, lambda p: f"preemption of {p.victim_id} for {p.requester_id}")


Invariant = Callable[[Any, Any], Any]

INVARIANTS: dict[str, Invariant] = {
    fn.__name__.removeprefix("inv_"): fn
    for fn in (
        inv_gpu_block_conservation,
        inv_cpu_block_conservation,
        inv_ref_count_matches_tables,
        inv_prefix_cache_map,
        inv_one_queue,
        inv_blocks_on_the_right_device,
        inv_table_fits_tokens,
        inv_computed_range,
        inv_step_budget,
        inv_victim_order,
    )
}


def get_rule(name: str) -> str:
    """The one-line rule of invariant ``name``."""
    return (INVARIANTS[name].__doc__ or "").strip().splitlines()[0]


def check_invariants(scheduler: Any, names: list[str] | None = None) -> None:
    """Evaluate every invariant on the live v0 model; raise on the first that fails."""
    view = ConcreteV0View(scheduler)
    for name in names or INVARIANTS:
        ops = ConcreteOps()
        if not INVARIANTS[name](view, ops):
            subject = " / ".join(reversed(ops.failures)) or "the step as a whole"
            raise InvariantViolation(
                invariant=name,
                step=view.step,
                subject=subject,
                message=f"{get_rule(name)} Violated by {subject} at step {view.step}.",
            )
