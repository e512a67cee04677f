"""``SchedulingBudget`` and ``PartialPrefillMetadata`` (``vllm/core/scheduler.py``, 0.10.2).

The budget is per request id and idempotent: adding tokens (or seats) for an
id already added is a no-op, subtracting for an id not added is a no-op. The
default path pre-counts every running group's seat before admitting prefills,
and relies on this to count them once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStage


@dataclass
class SchedulingBudget:
    """Tokens (uncached, charged; cached, only reported) and seats of one step."""

    token_budget: int
    max_num_seqs: int
    request_ids_num_batched_tokens: set[str] = field(default_factory=set)
    request_ids_num_curr_seqs: set[str] = field(default_factory=set)
    num_batched_tokens: int = 0
    num_cached_tokens: int = 0
    num_curr_seqs: int = 0

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        """Do ``num_new_tokens`` uncached tokens and ``num_new_seqs`` seats still fit?"""
        assert num_new_tokens >= 0 and num_new_seqs != 0
        return (
            self.num_batched_tokens + num_new_tokens <= self.token_budget
            and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, req_id: str, num_batched_tokens: int, num_cached_tokens: int = 0) -> None:
        """Charge a request's tokens once (later calls for the same id do nothing)."""
        if req_id in self.request_ids_num_batched_tokens:
            return
        assert num_batched_tokens >= 0 and num_cached_tokens >= 0
        self.request_ids_num_batched_tokens.add(req_id)
        self.num_batched_tokens += num_batched_tokens
        self.num_cached_tokens += num_cached_tokens

    def subtract_num_batched_tokens(self, req_id: str, num_batched_tokens: int) -> None:
        """Give back a request's tokens, if charged (cached tokens stay counted)."""
        if req_id in self.request_ids_num_batched_tokens:
            self.request_ids_num_batched_tokens.remove(req_id)
            self.num_batched_tokens -= num_batched_tokens

    def add_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        if req_id in self.request_ids_num_curr_seqs:
            return
        self.request_ids_num_curr_seqs.add(req_id)
        self.num_curr_seqs += num_curr_seqs

    def subtract_num_seqs(self, req_id: str, num_curr_seqs: int) -> None:
        if req_id in self.request_ids_num_curr_seqs:
            self.request_ids_num_curr_seqs.remove(req_id)
            self.num_curr_seqs -= num_curr_seqs


@dataclass
class PartialPrefillMetadata:
    """How many prefills share this step's budget, and how many of them are long."""

    schedulable_prefills: int
    long_prefills: int
    config: V0SchedulerConfig

    def _is_long(self, seq_group: SequenceGroup) -> bool:
        return seq_group.get_num_new_tokens() > self.config.effective_long_prefill_token_threshold

    def can_schedule(self, seq_group: SequenceGroup) -> bool:
        """False for a long prompt once the long quota is used (only with partial prefills > 1)."""
        return not (
            self._is_long(seq_group)
            and self.long_prefills >= self.config.max_long_partial_prefills
            and self.config.max_num_partial_prefills > 1
        )

    def maybe_increment_partial_prefills(self, seq_group: SequenceGroup) -> None:
        if self._is_long(seq_group):
            self.long_prefills += 1

    @classmethod
    def from_queues(
        cls, running: list[SequenceGroup], waiting: list[SequenceGroup], config: V0SchedulerConfig
    ) -> PartialPrefillMetadata:
        """Count running prefills, then peek into waiting up to ``max_num_partial_prefills``."""
        threshold = config.effective_long_prefill_token_threshold
        prefills = long_prefills = waiting_long_prefills = 0
        for sg in running:
            if sg.stage is SequenceStage.PREFILL:
                prefills += 1
                if sg.get_num_new_tokens() > threshold:
                    long_prefills += 1
        for sg in waiting:
            if prefills >= config.max_num_partial_prefills:
                break
            if sg.get_num_new_tokens() > threshold:
                if long_prefills + waiting_long_prefills >= config.max_long_partial_prefills:
                    continue
                waiting_long_prefills += 1
            prefills += 1
        return cls(min(prefills, config.max_num_partial_prefills), long_prefills, config)
