"""The v0 safety rules proved by the encoding, each written once as ``inv_<name>(s, o)``.

``s`` is a v0 state view (:class:`~schedconf.spec.symbolic.v0.state.StateView`: the
names below), ``o`` an operations backend (``spec/ops.py``: ``ConcreteOps``
on the state read from a ``schedconf.spec.v0`` scheduler, ``Z3Ops`` in the proofs).
The first docstring line is the rule.

They complement the model's own rules (``spec/v0/invariants.py``, over
``spec/v0/view.py``), which the proofs can assume and prove as well
(``model_view.py``): these are stated over the encoding's state (the free
deques' counts, the per-status table rules, ``_schedule_default``'s
no-mixing rule). They are evaluated concretely on the state read from a
live ``schedconf.spec.v0`` scheduler (``bridge.from_scheduler``; the drift guard does
it after every event) and symbolically in the proofs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedconf.spec.symbolic.v0.state import RUNNING, SWAPPED, WAITING


def inv_gpu_block_conservation(s: Any, o: Any) -> Any:
    """Free GPU blocks + referenced GPU blocks = num_gpu_blocks, and the free deque holds num_free blocks."""
    held = o.count(o.lt(0, s.gpu_ref_cnt(b)) for b in s.gpu_blocks)
    return o.and_(
        o.eq(s.num_free_gpu_blocks + held, s.num_gpu_blocks),
        o.eq(o.count(s.gpu_in_free(b) for b in s.gpu_blocks), s.num_free_gpu_blocks),
    )


def inv_cpu_block_conservation(s: Any, o: Any) -> Any:
    """Free CPU blocks + referenced CPU blocks = num_cpu_blocks, and the free deque holds num_free blocks."""
    held = o.count(o.lt(0, s.cpu_ref_cnt(c)) for c in s.cpu_blocks)
    return o.and_(
        o.eq(s.num_free_cpu_blocks + held, s.num_cpu_blocks),
        o.eq(o.count(s.cpu_in_free(c) for c in s.cpu_blocks), s.num_free_cpu_blocks),
    )


def inv_free_iff_unreferenced(s: Any, o: Any) -> Any:
    """A GPU or CPU block is in its free deque iff its ref count is 0."""
    return o.and_(
        o.forall(
            s.gpu_blocks,
            lambda b: o.and_(o.le(0, s.gpu_ref_cnt(b)), o.eq(s.gpu_in_free(b), o.eq(s.gpu_ref_cnt(b), 0))),
            lambda b: f"gpu block {b}",
        ),
        o.forall(
            s.cpu_blocks,
            lambda c: o.and_(o.le(0, s.cpu_ref_cnt(c)), o.eq(s.cpu_in_free(c), o.eq(s.cpu_ref_cnt(c), 0))),
            lambda c: f"cpu block {c}",
        ),
    )


def inv_ref_cnt_matches_tables(s: Any, o: Any) -> Any:
    """Every block's ref count equals the number of block tables holding it (no leak: a dead request holds nothing)."""
    return o.and_(
        o.forall(s.gpu_blocks, lambda b: o.eq(s.gpu_ref_cnt(b), s.gpu_num_holders(b)), lambda b: f"gpu block {b}"),
        o.forall(s.cpu_blocks, lambda c: o.eq(s.cpu_ref_cnt(c), s.cpu_num_holders(c)), lambda c: f"cpu block {c}"),
        o.forall(
            s.requests,
            lambda r: o.implies(
                o.not_(s.is_live(r)), o.and_(o.eq(s.num_gpu_table_blocks(r), 0), o.eq(s.num_cpu_table_blocks(r), 0))
            ),
            lambda r: f"request {r}",
        ),
    )


def inv_status_matches_queue(s: Any, o: Any) -> Any:
    """A WAITING request is in waiting once, a RUNNING one in running once, a SWAPPED one in swapped once; nothing else is queued."""
    return o.and_(
        o.forall(
            s.requests,
            lambda r: o.and_(
                o.eq(s.num_in_waiting(r), o.ite(o.eq(s.status(r), WAITING), 1, 0)),
                o.eq(s.num_in_running(r), o.ite(o.eq(s.status(r), RUNNING), 1, 0)),
                o.eq(s.num_in_swapped(r), o.ite(o.eq(s.status(r), SWAPPED), 1, 0)),
            ),
            lambda r: f"request {r}",
        ),
        o.eq(s.orphans_in_queues, 0),
    )


def inv_max_num_seqs(s: Any, o: Any) -> Any:
    """At most max_num_seqs requests are RUNNING."""
    return o.le(s.num_running, s.max_num_seqs)


def inv_token_budget(s: Any, o: Any) -> Any:
    """A step schedules at most max_num_batched_tokens tokens, only for RUNNING requests."""
    return o.and_(
        o.le(s.num_batched_tokens, s.max_num_batched_tokens),
        o.forall(
            s.requests,
            lambda r: o.and_(
                o.le(0, s.num_scheduled_tokens(r)),
                o.implies(o.lt(0, s.num_scheduled_tokens(r)), o.eq(s.status(r), RUNNING)),
            ),
            lambda r: f"request {r}",
        ),
    )


def inv_gpu_table_coverage(s: Any, o: Any) -> Any:
    """A RUNNING request's GPU table covers its seen tokens exactly (ceil(seen / block_size) blocks) and its computed tokens; any other request holds no GPU block."""
    return o.forall(
        s.requests,
        lambda r: o.ite(
            o.eq(s.status(r), RUNNING),
            o.and_(
                o.le(s.num_seen_tokens(r), s.num_gpu_table_blocks(r) * s.block_size),
                o.lt(s.num_gpu_table_blocks(r) * s.block_size - s.block_size, s.num_seen_tokens(r)),
                o.le(s.num_computed_tokens(r), s.num_seen_tokens(r)),
            ),
            o.eq(s.num_gpu_table_blocks(r), 0),
        ),
        lambda r: f"request {r}",
    )


def inv_swapped_on_cpu(s: Any, o: Any) -> Any:
    """A SWAPPED request's CPU table covers its seen tokens exactly and it holds no GPU block; any other request holds no CPU block."""
    return o.forall(
        s.requests,
        lambda r: o.ite(
            o.eq(s.status(r), SWAPPED),
            o.and_(
                o.le(s.num_seen_tokens(r), s.num_cpu_table_blocks(r) * s.block_size),
                o.lt(s.num_cpu_table_blocks(r) * s.block_size - s.block_size, s.num_seen_tokens(r)),
                o.eq(s.num_gpu_table_blocks(r), 0),
            ),
            o.eq(s.num_cpu_table_blocks(r), 0),
        ),
        lambda r: f"request {r}",
    )


def inv_waiting_from_scratch(s: Any, o: Any) -> Any:
    """A WAITING request has computed nothing and holds no block: a recompute preemption restarts it from scratch."""
    return o.forall(
        s.requests,
        lambda r: o.implies(
            o.eq(s.status(r), WAITING),
            o.and_(
                o.eq(s.num_computed_tokens(r), 0),
                o.eq(s.num_gpu_table_blocks(r), 0),
                o.eq(s.num_cpu_table_blocks(r), 0),
            ),
        ),
        lambda r: f"request {r}",
    )


def inv_prefills_alone(s: Any, o: Any) -> Any:
    """_schedule_default never mixes: a step that schedules a prompt schedules no decode, and admits no prompt while a group is swapped."""
    any_prefill = o.or_(*(s.is_scheduled_prefill(r) for r in s.requests))
    return o.implies(
        any_prefill,
        o.and_(
            o.forall(
                s.requests,
                lambda r: o.implies(o.lt(0, s.num_scheduled_tokens(r)), s.is_scheduled_prefill(r)),
                lambda r: f"request {r}",
            ),
            o.eq(s.num_swapped, 0),
        ),
    )


def inv_swap_in_xor_out(s: Any, o: Any) -> Any:
    """A step does not both swap in and swap out (SchedulerOutputs.__post_init__ asserts it)."""
    return o.or_(o.eq(s.num_swapped_in, 0), o.eq(s.num_swapped_out, 0))


Invariant = Callable[[Any, Any], Any]

INVARIANTS: dict[str, Invariant] = {
    fn.__name__.removeprefix("inv_"): fn
    for fn in (
        inv_gpu_block_conservation,
        inv_cpu_block_conservation,
        inv_free_iff_unreferenced,
        inv_ref_cnt_matches_tables,
        inv_status_matches_queue,
        inv_max_num_seqs,
        inv_token_budget,
        inv_gpu_table_coverage,
        inv_swapped_on_cpu,
        inv_waiting_from_scratch,
        inv_prefills_alone,
        inv_swap_in_xor_out,
    )
}


def get_rule(name: str) -> str:
    """The one-line rule of invariant ``name``."""
    return (INVARIANTS[name].__doc__ or "").strip().splitlines()[0]
