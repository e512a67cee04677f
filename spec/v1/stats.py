"""What the scheduler reports about itself after each update: vLLM's ``SchedulerStats``.

Models the parts of ``vllm/v1/metrics/stats.py`` (``SchedulerStats``,
``PrefixCacheStats``) and ``vllm/v1/spec_decode/metrics.py``
(``SpecDecodingStats``) that the core decides, as vLLM 0.32/0.33 report them
with ``log_stats`` on: ``Scheduler.update_from_output`` ends with
``make_stats()``, which hands over the prefix-cache counters gathered since the
previous update (one record per admission that looked the cache up) and the
spec-decode counters of this update, then starts both afresh.

Left out: ``kv_cache_usage`` (a float; ``num_free_blocks`` in the observation
says the same), connector, eviction-event, CUDA-graph and performance stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups of the admissions since the last update.

    A request never preempted counts in ``requests`` / ``queries`` (its tokens
    at admission) / ``hits`` (its prefix hit in tokens); a resumed one in the
    ``preempted_*`` three. ``reset``: ``reset_prefix_cache`` succeeded.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """One admission's lookup (vLLM's ``PrefixCacheStats.record``)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def to_canonical(self) -> dict[str, Any]:
        return {
            "reset": self.reset,
            "requests": self.requests,
            "queries": self.queries,
            "hits": self.hits,
            "preempted_requests": self.preempted_requests,
            "preempted_queries": self.preempted_queries,
            "preempted_hits": self.preempted_hits,
        }


@dataclass
class SpecDecodingStats:
    """Draft verification in one update: one ``observe_draft`` per request with drafts that sampled."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens
        self.num_draft_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's drafts (placeholders of a padded admission included) and how many were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1

    def to_canonical(self) -> dict[str, Any]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "num_draft_tokens_per_pos": list(self.num_draft_tokens_per_pos),
        }


def render_scheduler_stats(
    num_running_reqs: int,
    num_waiting: int,
    num_deferred: int,
    prefix_cache: PrefixCacheStats,
    spec_decoding: SpecDecodingStats | None,
) -> dict[str, Any]:
    """The canonical ``SchedulerStats`` of one update (the trace's ``model_output.expect.stats``).

    vLLM counts the waiting requests a waiting loop skipped and left waiting
    (``deferred_waiting``) apart: ``num_skipped_waiting_reqs``.
    """
    return {
        "num_running_reqs": num_running_reqs,
        "num_waiting_reqs": num_waiting - num_deferred,
        "num_skipped_waiting_reqs": num_deferred,
        "prefix_cache": prefix_cache.to_canonical(),
        "spec_decoding": spec_decoding.to_canonical() if spec_decoding is not None else None,
    }
