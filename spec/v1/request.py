"""Requests, their statuses and the table of legal status transitions.

Models ``vllm/v1/request.py`` (0.33.0) for the core: a request is a prompt,
the tokens sampled so far, and how many of them have KV in the cache
(``num_computed_tokens``). There is no prefill or decode phase: each step the
scheduler lets ``num_computed_tokens`` catch up with ``num_tokens_with_spec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from schedconf.spec.errors import IllegalTransition
from schedconf.spec.hashing import extend_block_hashes


class RequestStatus(Enum):
    """Where a request is in its life. Member order carries no meaning here.

    DEVIATION(vllm 0.33.0): vLLM's ``RequestStatus`` is an ``IntEnum`` whose
    order defines ``is_finished`` (``status > PREEMPTED``); we use an explicit
    set instead. The blocked waiting statuses (grammar, remote KV, streaming),
    ``FINISHED_IGNORED``, ``FINISHED_ERROR`` and ``FINISHED_REPETITION`` are
    outside the core and not modelled.
    """

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    FINISHED_STOPPED = "FINISHED_STOPPED"
    FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED = "FINISHED_ABORTED"

    @property
    def is_finished(self) -> bool:
        """True for the three FINISHED_* statuses."""
        return self in FINISHED_STATUSES

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason vLLM reports: ``stop``, ``length`` or ``abort``."""
        return FINISH_REASONS.get(self)


FINISHED_STATUSES = frozenset(
    {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_ABORTED}
)

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}

# Every status change the scheduler may make. Anything else is a bug in the
# model and raises IllegalTransition.
LEGAL_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    # admitted by the waiting loop; finished from outside while queued (finish_requests: aborted, or
    # any other finished status the engine gives, as vLLM's own tests stop waiting requests)
    RequestStatus.WAITING: frozenset(
        {
            RequestStatus.RUNNING,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH_CAPPED,
        }
    ),
    # preempted by the running loop; stopped by update_from_output; aborted
    RequestStatus.RUNNING: frozenset(
        {
            RequestStatus.PREEMPTED,
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_ABORTED,
        }
    ),
    # resumed by the waiting loop; finished from outside while queued (finish_requests); the two stop
    # statuses also by update_from_output under vllm-0.11, whose un-repaired priority victim still
    # receives the output of the step that preempted it (§4.1 table).
    RequestStatus.PREEMPTED: frozenset(
        {
            RequestStatus.RUNNING,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH_CAPPED,
        }
    ),
    RequestStatus.FINISHED_STOPPED: frozenset(),
    RequestStatus.FINISHED_LENGTH_CAPPED: frozenset(),
    RequestStatus.FINISHED_ABORTED: frozenset(),
}


@dataclass(frozen=True)
class SamplingParams:
    """The stop rules of one request (the part of vLLM's SamplingParams the scheduler reads).

    ``eos_token_id`` is None when the request has no EOS or ``ignore_eos`` is
    set: vLLM clears it in ``update_from_generation_config`` (§5.1).
    """

    max_tokens: int
    min_tokens: int = 0
    eos_token_id: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def effective_eos_token_id(self) -> int | None:
        """The EOS id that stops the request, or None under ``ignore_eos``."""
        return None if self.ignore_eos else self.eos_token_id


@dataclass(eq=False)
class Request:
    """One request. Compared by identity, like vLLM's ``Request``.

    ``block_hashes`` holds the chained hash of every *full* block of
    ``all_token_ids``; it is extended as tokens are appended (§9.1).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    priority: int
    arrival_time: int | float
    """Any finite number; the priority order compares it as is (no truncation)."""
    block_size: int
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_preemptions: int = 0
    is_prefill_chunk: bool = False
    stop_reason: int | None = None
    num_output_placeholders: int = 0
    """Async scheduling: output tokens (1 + drafts per step) scheduled but not yet returned."""
    num_in_flight_tokens: int = 0
    """Tokens of steps scheduled whose model output has not been applied yet (0.33)."""
    num_stale_output_tokens: int = 0
    """Of ``num_in_flight_tokens``, those scheduled before the last preemption:
    their output is delivered (tokens appended) without touching the counters
    the preemption reset (§6)."""
    next_decode_eligible_step: int = 0
    """V2 model runner, pipeline parallelism, async (0.32+ ``AsyncScheduler``): the running loop
    skips the request before this step (vLLM's ``next_decode_eligible_step``)."""
    drop_stale_output: bool = False
    """The stale output is dropped instead of delivered: set by a preemption of
    ``reset_prefix_cache(reset_running_requests=True)``, whose requests may
    resume at once and resample those positions (§6)."""

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size)

    @property
    def max_tokens(self) -> int:
        """``sampling_params.max_tokens``: the cap on output tokens."""
        return self.sampling_params.max_tokens

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt; fixed for the life of the request."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Number of tokens sampled so far (kept across preemptions)."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs: the sequence a resumed request must re-prefill."""
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus the draft tokens proposed for the next step."""
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        """True once the request reached a FINISHED_* status."""
        return self.status.is_finished

    @property
    def sort_key(self) -> tuple[int, int | float, str]:
        """Priority-queue order (§1 ``Request.__lt__``): priority, arrival, id."""
        return (self.priority, self.arrival_time, self.request_id)

    @property
    def victim_key(self) -> tuple[int, int | float]:
        """Priority preemption key (§4.1): ``max`` of (priority, arrival_time).

        No request-id tie-break: ``max`` returns the first maximal request in
        ``running`` order.
        """
        return (self.priority, self.arrival_time)

    def transition(self, new_status: RequestStatus) -> None:
        """Move to ``new_status``, which LEGAL_TRANSITIONS must allow."""
        if new_status not in LEGAL_TRANSITIONS[self.status]:
            raise IllegalTransition(
                "illegal_transition",
                f"request {self.request_id}: {self.status.value} -> {new_status.value} is not a legal transition",
                request_id=self.request_id,
            )
        self.status = new_status

    def append_output_token_id(self, token_id: int) -> None:
        """Append one sampled token and hash the block it completes, if any."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if len(self.all_token_ids) % self.block_size == 0:
            extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size)
