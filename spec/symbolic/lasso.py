"""Non-termination by a lasso: a scheduler state that comes back with a request still live.

The reference scheduler is deterministic, and so is the model stand-in the
campaigns use once no input arrives (a sampled token is a function of the
request and its position). Between two steps, the scheduler's whole future
is therefore a function of its state: if the state at the start of step
``k + p`` equals the state at the start of step ``k`` (``p > 0``) and some
request is live, the steps ``k .. k + p - 1`` repeat forever and that request
never ends. :func:`get_fingerprint` is that state, every field the scheduler
reads again (queues in order, the free queue in order, block tables, block
hashes and reference counts, the prefix-cache map, each live request's
tokens, counters, drafts and status); the step counter and the statistics are
left out (nothing reads them to decide).

The sampled tokens must not depend on the step number for the argument to
hold: :func:`find_lasso` takes ``respond(output, samples)`` and the caller
vouches for that (``schedconf.conformance.workloads.workload.respond`` with a ``HashOracle``
draws token ``pos`` of a request from ``(seed, request, pos)`` only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedconf.spec.output import ModelRunnerOutput, SchedulerOutput
from schedconf.spec.v1.scheduler import Scheduler


def get_fingerprint(sched: Scheduler) -> tuple[Any, ...]:
    """Every part of the scheduler's state between two steps that its future reads (see module docstring)."""
    pool = sched.block_pool
    kv = sched.kv_cache_manager
    requests = tuple(
        (
            rid,
            r.status.value,
            tuple(r.all_token_ids),
            r.num_computed_tokens,
            tuple(r.spec_token_ids),
            tuple(r.block_hashes),
            r.is_prefill_chunk,
            r.stop_reason,
        )
        for rid, r in sorted(sched.requests.items())
    )
    blocks = tuple((b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks)
    # Per hash, the blocks in insertion order (get_cached_block returns the first inserted).
    cache_map = tuple(sorted((h, tuple(m)) for h, m in pool.cached_block_hash_to_block.items()))
    return (
        tuple(r.request_id for r in sched.running),
        tuple(r.request_id for r in sched.waiting),
        tuple(b.block_id for b in pool.free_block_queue),
        blocks,
        cache_map,
        tuple((rid, tuple(b.block_id for b in bl)) for rid, bl in sorted(kv.req_to_blocks.items())),
        tuple(sorted(kv.num_cached_block.items())),
        requests,
        tuple(sorted(sched.finished_req_ids)),
        tuple(sorted(sched.preempted_req_ids)),
    )


@dataclass(frozen=True)
class Lasso:
    """A state seen at the start of step ``start + 1`` and again at the start of step ``start + period + 1``."""

    start: int
    """Steps run when the state was first seen."""
    period: int
    live: tuple[str, ...]
    """Requests live in the repeated state: none of them ever ends."""


def find_lasso(
    sched: Scheduler, respond: Callable[[SchedulerOutput, dict[str, bool]], ModelRunnerOutput], max_steps: int
) -> Lasso | None:
    """Step ``sched`` (no inputs) until every request ended (None), a state repeats (the lasso), or ``max_steps``."""
    seen: dict[tuple[Any, ...], int] = {}
    for n in range(max_steps + 1):
        if not sched.has_unfinished_requests():
            return None
        fp = get_fingerprint(sched)
        if fp in seen:
            return Lasso(seen[fp], n - seen[fp], tuple(sorted(sched.requests)))
        seen[fp] = n
        output = sched.schedule()
        assert sched.last_step is not None
        sched.update_from_output(output, respond(output, sched.last_step.samples))
    return None
