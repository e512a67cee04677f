"""What one v0 ``schedule()`` decides, in the canonical form traces store (the v0 contract).

Per scheduled group: the fields of ``SequenceGroupMetadata`` a model runner
reads, then the ``SchedulerOutputs`` fields, then what
``get_and_reset_finished_requests_ids()`` returns right after. Request outputs
reuse the v1 model's ``RequestOutput`` and ``ModelRunnerOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScheduledSeqGroup:
    """One scheduled group: ``ScheduledSequenceGroup`` plus its ``SequenceGroupMetadata``."""

    request_id: str
    token_chunk_size: int
    is_prompt: bool
    do_sample: bool
    block_table: tuple[int, ...]
    computed_block_nums: tuple[int, ...]

    def to_canonical(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "token_chunk_size": self.token_chunk_size,
            "is_prompt": self.is_prompt,
            "do_sample": self.do_sample,
            "block_table": list(self.block_table),
            "computed_block_nums": list(self.computed_block_nums),
        }


@dataclass(frozen=True)
class V0SchedulerOutput:
    """``SchedulerOutputs`` of one step, ids instead of objects; ``step`` is 1-based."""

    step: int
    scheduled_seq_groups: tuple[ScheduledSeqGroup, ...]
    num_prefill_groups: int
    num_batched_tokens: int
    blocks_to_swap_in: tuple[tuple[int, int], ...]
    blocks_to_swap_out: tuple[tuple[int, int], ...]
    blocks_to_copy: tuple[tuple[int, int], ...]
    ignored_seq_groups: tuple[str, ...]
    num_lookahead_slots: int
    running_queue_size: int
    preempted: int
    finished_requests_ids: tuple[str, ...]

    def to_canonical(self) -> dict[str, Any]:
        """Lists in vLLM's order; pairs as 2-element lists."""
        return {
            "scheduled_seq_groups": [g.to_canonical() for g in self.scheduled_seq_groups],
            "num_prefill_groups": self.num_prefill_groups,
            "num_batched_tokens": self.num_batched_tokens,
            "blocks_to_swap_in": [list(p) for p in self.blocks_to_swap_in],
            "blocks_to_swap_out": [list(p) for p in self.blocks_to_swap_out],
            "blocks_to_copy": [list(p) for p in self.blocks_to_copy],
            "ignored_seq_groups": list(self.ignored_seq_groups),
            "num_lookahead_slots": self.num_lookahead_slots,
            "running_queue_size": self.running_queue_size,
            "preempted": self.preempted,
            "finished_requests_ids": list(self.finished_requests_ids),
        }

    def get_group(self, request_id: str) -> ScheduledSeqGroup | None:
        """The scheduled group with this id, if any."""
        for g in self.scheduled_seq_groups:
            if g.request_id == request_id:
                return g
        return None
