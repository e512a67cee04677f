"""The safety rules of the scheduler, each written once as ``inv_<name>(s, o)``.

``s`` is a state view (``spec/v1/view.py``), ``o`` an operations backend
(``spec/ops.py``). Each function returns a boolean of its backend: a Python
bool from :class:`ConcreteOps`, a Z3 formula from the symbolic backend. The
first docstring line is the rule, as reports print it.

``check_invariants(scheduler)`` runs them all on the live model and raises
:class:`InvariantViolation` naming the invariant, the step and the subject.
It is meant to run after every event (``add_request``, ``abort``,
``schedule``, ``update_from_output``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedconf.spec.errors import InvariantViolation
from schedconf.spec.ops import ConcreteOps
from schedconf.spec.v1.view import FCFS, PREEMPTED, PRIORITY, RUNNING, WAITING, ConcreteView


def inv_token_budget(s: Any, o: Any) -> Any:
    """A step schedules at most max_num_batched_tokens tokens, its total is the sum of the per-request counts, and the budget left accounts for the rest."""
    return o.and_(
        o.le(s.total_num_scheduled_tokens, s.max_num_batched_tokens),
        o.le(0, s.remaining_token_budget),
        o.eq(s.total_num_scheduled_tokens + s.remaining_token_budget, s.max_num_batched_tokens),
        o.eq(o.sum(s.num_scheduled_tokens(r) for r in s.requests), s.total_num_scheduled_tokens),
    )


def inv_max_num_seqs(s: Any, o: Any) -> Any:
    """At most max_num_seqs requests are RUNNING."""
    return o.le(s.num_running, s.max_num_seqs)


def inv_scheduled_only_running(s: Any, o: Any) -> Any:
    """Only RUNNING requests are scheduled (or ones preempted since, whose scheduled tokens are then stale), and never a negative number of tokens."""
    return o.forall(
        s.requests,
        lambda r: o.and_(
            o.le(0, s.num_scheduled_tokens(r)),
            o.implies(
                o.lt(0, s.num_scheduled_tokens(r)),
                o.or_(
                    o.eq(s.status(r), RUNNING),
                    o.and_(o.eq(s.status(r), PREEMPTED), o.le(s.num_scheduled_tokens(r), s.num_stale_output_tokens(r))),
                ),
            ),
        ),
        lambda r: f"request {r}",
    )


def inv_block_conservation(s: Any, o: Any) -> Any:
    """Free blocks + held blocks + the null block = num_gpu_blocks."""
    num_held = o.count(o.lt(0, s.ref_cnt(b)) for b in s.blocks)
    return o.and_(
        o.eq(s.num_free_blocks + num_held + 1, s.num_gpu_blocks),
        o.eq(o.count(s.in_free_queue(b) for b in s.blocks), s.num_free_blocks),
    )


def inv_free_iff_unreferenced(s: Any, o: Any) -> Any:
    """A block is in the free queue iff its ref_cnt is 0 (no block is both free and held)."""
    return o.forall(
        s.blocks,
        lambda b: o.and_(o.le(0, s.ref_cnt(b)), o.eq(s.in_free_queue(b), o.eq(s.ref_cnt(b), 0))),
        lambda b: f"block {b}",
    )


def inv_ref_cnt_matches_tables(s: Any, o: Any) -> Any:
    """Every block's ref_cnt equals the number of block tables holding it; nobody holds the null block."""
    return o.and_(
        o.forall(s.blocks, lambda b: o.eq(s.ref_cnt(b), s.num_holders(b)), lambda b: f"block {b}"),
        o.eq(s.num_holders(s.null_block), 0),
        o.eq(s.orphan_tables, 0),
    )


def inv_no_double_hold(s: Any, o: Any) -> Any:
    """No request holds the same block twice."""
    return o.forall(s.hold_pairs, lambda p: o.le(s.hold_count(p), 1), lambda p: f"request {p[0]} block {p[1]}")


def inv_block_table_coverage(s: Any, o: Any) -> Any:
    """A RUNNING request's blocks cover its computed tokens; a waiting one holds no block and has computed nothing."""
    return o.forall(
        s.requests,
        lambda r: o.ite(
            o.eq(s.status(r), RUNNING),
            o.le(s.num_computed_tokens(r), s.num_blocks(r) * s.block_size),
            o.and_(o.eq(s.num_blocks(r), 0), o.eq(s.num_computed_tokens(r), 0)),
        ),
        lambda r: f"request {r}",
    )


def inv_computed_range(s: Any, o: Any) -> Any:
    """0 <= num_computed_tokens <= num_tokens + num_spec_tokens + num_output_placeholders (drafts and, under async scheduling, tokens of steps in flight are computed optimistically)."""
    return o.forall(
        s.requests,
        lambda r: o.and_(
            o.le(0, s.num_computed_tokens(r)),
            o.le(s.num_computed_tokens(r), s.num_tokens(r) + s.num_spec_tokens + s.num_output_placeholders(r)),
        ),
        lambda r: f"request {r}",
    )


def inv_in_flight_accounting(s: Any, o: Any) -> Any:
    """A request's in-flight tokens are exactly those the steps still in flight scheduled for it, its stale share is part of them, and its output placeholders are never negative nor more than the in-flight steps may sample for it (1 plus its scheduled drafts per step in which it samples)."""
    return o.forall(
        s.requests,
        lambda r: o.and_(
            o.eq(s.num_in_flight_tokens(r), s.num_in_flight_scheduled(r)),
            o.le(0, s.num_stale_output_tokens(r)),
            o.le(s.num_stale_output_tokens(r), s.num_in_flight_tokens(r)),
            o.le(0, s.num_output_placeholders(r)),
            o.le(s.num_output_placeholders(r), s.num_in_flight_samples(r)),
        ),
        lambda r: f"request {r}",
    )


def inv_prefix_hit_capped(s: Any, o: Any) -> Any:
    """A request scheduled in the step had computed fewer than num_tokens (+ its output placeholders, async) tokens before it: prefix hits stop below num_tokens."""
    return o.forall(
        s.requests,
        lambda r: o.implies(
            o.lt(0, s.num_scheduled_tokens(r)),
            o.lt(s.num_computed_tokens(r) - s.num_scheduled_tokens(r), s.num_tokens(r) + s.num_output_placeholders(r)),
        ),
        lambda r: f"request {r}",
    )


def inv_preempted_from_scratch(s: Any, o: Any) -> Any:
    """A PREEMPTED request has computed nothing and holds no block: it restarts from scratch."""
    return o.forall(
        s.requests,
        lambda r: o.implies(
            o.eq(s.status(r), PREEMPTED),
            o.and_(o.eq(s.num_computed_tokens(r), 0), o.eq(s.num_blocks(r), 0)),
        ),
        lambda r: f"request {r}",
    )


def inv_hash_map_consistency(s: Any, o: Any) -> Any:
    """A block carries a hash iff the prefix-cache map indexes it under that hash."""
    return o.forall(s.blocks, lambda b: o.eq(s.is_cached(b), s.is_indexed(b)), lambda b: f"block {b}")


def inv_prefix_chain(s: Any, o: Any) -> Any:
    """A cached block at position i of a request's table carries the request's i-th block hash."""
    return o.forall(
        s.table_positions,
        lambda p: o.implies(s.position_is_cached(p), s.position_hash_matches(p)),
        lambda p: f"request {p[0]} table position {p[1]}",
    )


def inv_status_matches_queue(s: Any, o: Any) -> Any:
    """A RUNNING request is in running once; a WAITING or PREEMPTED one is in waiting once; nothing else is queued."""
    return o.and_(
        o.forall(
            s.requests,
            lambda r: o.and_(
                o.eq(s.num_in_running(r), o.ite(o.eq(s.status(r), RUNNING), 1, 0)),
                o.eq(
                    s.num_in_waiting(r),
                    o.ite(o.or_(o.eq(s.status(r), WAITING), o.eq(s.status(r), PREEMPTED)), 1, 0),
                ),
            ),
            lambda r: f"request {r}",
        ),
        o.eq(s.orphans_in_queues, 0),
    )


def inv_deferred_step_carries_no_prefill(s: Any, o: Any) -> Any:
    """A step that held prefill back schedules each request at most one token plus its drafts: decodes, and admissions with one token left."""
    return o.implies(
        s.deferred_prefills,
        o.forall(
            s.requests,
            lambda r: o.le(s.num_scheduled_tokens(r), 1 + s.num_spec_tokens),
            lambda r: f"request {r}",
        ),
    )


def inv_victim_order(s: Any, o: Any) -> Any:
    """FCFS preempts the tail of running; priority preempts the first request with the maximal (priority, arrival)."""

    def is_right_victim(p: Any) -> Any:
        keys = p.candidate_keys
        v = p.victim_pos
        fcfs_ok = o.eq(v, len(keys) - 1)
        priority_ok = o.and_(
            *(o.lex_lt(keys[c], keys[v]) for c in range(v)),
            *(o.lex_le(keys[c], keys[v]) for c in range(v, len(keys))),
        )
        return o.ite(o.eq(p.policy, PRIORITY), priority_ok, o.ite(o.eq(p.policy, FCFS), fcfs_ok, False))

    return o.forall(s.preemptions, is_right_victim, lambda p: f"preemption of candidate #{p.victim_pos}")


Invariant = Callable[[Any, Any], Any]

INVARIANTS: dict[str, Invariant] = {
    fn.__name__.removeprefix("inv_"): fn
    for fn in (
        inv_token_budget,
        inv_max_num_seqs,
        inv_scheduled_only_running,
        inv_block_conservation,
        inv_free_iff_unreferenced,
        inv_ref_cnt_matches_tables,
        inv_no_double_hold,
        inv_block_table_coverage,
        inv_computed_range,
        inv_in_flight_accounting,
        inv_prefix_hit_capped,
        inv_preempted_from_scratch,
        inv_hash_map_consistency,
        inv_prefix_chain,
        inv_status_matches_queue,
        inv_victim_order,
        inv_deferred_step_carries_no_prefill,
    )
}


def get_rule(name: str) -> str:
    """The one-line rule of invariant ``name`` (its docstring's first line)."""
    return (INVARIANTS[name].__doc__ or "").strip().splitlines()[0]


def check_invariants(scheduler: Any, names: list[str] | None = None) -> None:
    """Evaluate every invariant on the live model; raise on the first that fails."""
    view = ConcreteView(scheduler)
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
