"""Sequence groups of one sequence (n = 1): statuses, stages and token counters.

Models ``vllm/sequence.py`` (0.10.2) for what the scheduler reads. With n = 1 a
``SequenceGroup`` and its ``Sequence`` are one object here; ``get_seqs(status)``
keeps vLLM's filtering so that code paths that select sequences by status
(a SWAPPED group found in ``waiting``, for one) behave as vLLM's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class SequenceStatus(IntEnum):
    """vLLM's ``SequenceStatus``; ``is_finished`` is ``status > SWAPPED`` there and here."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @property
    def is_finished(self) -> bool:
        """True for the four FINISHED_* statuses."""
        return self > SequenceStatus.SWAPPED

    @property
    def finish_reason(self) -> str | None:
        """``SequenceStatus.get_finished_reason``: stop, length (also for IGNORED) or abort."""
        return {
            SequenceStatus.FINISHED_STOPPED: "stop",
            SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
            SequenceStatus.FINISHED_ABORTED: "abort",
            SequenceStatus.FINISHED_IGNORED: "length",
        }.get(self)


class SequenceStage(IntEnum):
    """``SequenceStage``: PREFILL until every token is computed, then DECODE."""

    PREFILL = 0
    DECODE = 1


@dataclass(frozen=True)
class V0SamplingParams:
    """The stop rules of one request (the part of ``SamplingParams`` the engine reads)."""

    max_tokens: int
    min_tokens: int = 0
    eos_token_id: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclass(eq=False)
class SequenceGroup:
    """One request and its only sequence. Compared by identity, like vLLM's.

    ``seq_id`` is a counter the scheduler hands out (vLLM's ``seq_counter``);
    the block manager's trackers are keyed by it.
    """

    request_id: str
    seq_id: int
    prompt_token_ids: tuple[int, ...]
    sampling_params: V0SamplingParams
    priority: int
    arrival_time: int | float
    status: SequenceStatus = SequenceStatus.WAITING
    stage: SequenceStage = SequenceStage.PREFILL
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    stop_reason: int | None = None

    # -- Sequence / SequenceData
    def get_token_ids(self) -> list[int]:
        """Prompt then outputs: what a (re-)prefill computes."""
        return [*self.prompt_token_ids, *self.output_token_ids]

    def get_len(self) -> int:
        """``get_len``: prompt plus outputs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_output_len(self) -> int:
        """Number of sampled tokens (kept across preemptions)."""
        return len(self.output_token_ids)

    def get_num_uncomputed_tokens(self) -> int:
        """``get_len() - num_computed_tokens``."""
        return self.get_len() - self.num_computed_tokens

    def get_num_new_tokens(self) -> int:
        """1 while decoding, else the uncomputed tokens (``Sequence.get_num_new_tokens``)."""
        return 1 if self.stage is SequenceStage.DECODE else self.get_num_uncomputed_tokens()

    def is_prefill(self) -> bool:
        """The stage is PREFILL."""
        return self.stage is SequenceStage.PREFILL

    def is_finished(self) -> bool:
        """The status is a FINISHED_* one."""
        return self.status.is_finished

    def get_seqs(self, status: SequenceStatus | None = None) -> list[SequenceGroup]:
        """``SequenceGroup.get_seqs``: the one sequence if it has ``status`` (or any status for None)."""
        return [self] if status is None or self.status is status else []

    def get_max_num_running_seqs(self) -> int:
        """1, or 0 once finished (single-sequence groups)."""
        return 0 if self.is_finished() else 1

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """Count computed tokens; DECODE once none is left (finished groups are skipped)."""
        if self.is_finished():
            return
        self.num_computed_tokens += num_new_computed_tokens
        assert self.num_computed_tokens <= self.get_len()
        if self.get_num_uncomputed_tokens() == 0:
            self.stage = SequenceStage.DECODE

    def reset_state_for_recompute(self) -> None:
        """Recompute preemption: nothing computed, back to PREFILL; outputs are kept."""
        self.num_computed_tokens = 0
        self.stage = SequenceStage.PREFILL

    def append_token_id(self, token_id: int) -> None:
        """Append one sampled token."""
        self.output_token_ids.append(token_id)

    def get_priority(self) -> tuple[int, int | float]:
        """``Scheduler._get_priority``: (priority, arrival_time), lower first."""
        return (self.priority, self.arrival_time)
