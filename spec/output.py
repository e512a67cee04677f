"""What crosses the scheduler boundary: ``SchedulerOutput`` out, model output in.

Models ``vllm/v1/core/sched/output.py`` (0.33.0, V1 model runner layout) and
the parts of ``ModelRunnerOutput`` / ``EngineCoreOutput`` the scheduler reads
or writes. ``to_canonical()`` gives the language-neutral, sorted form that
traces store and the JSON-lines protocol exchanges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NewRequestData:
    """A request admitted from WAITING this step: all its block ids, hits included.

    ``num_computed_tokens`` is the prefix hit, i.e. the value before this
    step's tokens are counted.
    """

    req_id: str
    prompt_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    num_computed_tokens: int

    def to_canonical(self) -> dict[str, Any]:
        """Return the trace form (the prompt is in the add_request event, so only its length)."""
        return {
            "req_id": self.req_id,
            "block_ids": list(self.block_ids),
            "num_computed_tokens": self.num_computed_tokens,
        }


@dataclass(frozen=True)
class CachedRequestData:
    """A request scheduled this step that the model runner already knows.

    Running requests (in running-loop order) come first, then resumed ones.
    ``new_block_ids`` are only the blocks allocated this step, except for a
    resumed request, which gets all its blocks (they were all allocated anew).
    """

    req_id: str
    resumed: bool
    new_block_ids: tuple[int, ...]
    num_computed_tokens: int
    num_output_tokens: int

    def to_canonical(self) -> dict[str, Any]:
        """Return the trace form."""
        return {
            "req_id": self.req_id,
            "resumed": self.resumed,
            "new_block_ids": list(self.new_block_ids),
            "num_computed_tokens": self.num_computed_tokens,
            "num_output_tokens": self.num_output_tokens,
        }


@dataclass(frozen=True)
class SchedulerOutput:
    """The decision of one ``schedule()`` call.

    ``finished_req_ids`` are the requests finished (stopped or aborted) since
    the previous ``schedule()``; ``preempted_req_ids`` those preempted since
    then, this step's included (None under profiles without the field).
    """

    step: int
    scheduled_new_reqs: tuple[NewRequestData, ...]
    scheduled_cached_reqs: tuple[CachedRequestData, ...]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, tuple[int, ...]]
    finished_req_ids: frozenset[str]
    preempted_req_ids: frozenset[str] | None

    def to_canonical(self) -> dict[str, Any]:
        """Return the sorted, integers-and-strings form traces store.

        Lists of requests keep vLLM's order (admission order, running-loop
        order): the model runner's batch follows it. Sets are sorted.
        """
        # Dict keys need no sorting here: dicts compare equal in any order,
        # and traces are written with sorted keys.
        return {
            "scheduled_new_reqs": [r.to_canonical() for r in self.scheduled_new_reqs],
            "scheduled_cached_reqs": [r.to_canonical() for r in self.scheduled_cached_reqs],
            "num_scheduled_tokens": dict(self.num_scheduled_tokens),
            "total_num_scheduled_tokens": self.total_num_scheduled_tokens,
            "scheduled_spec_decode_tokens": {k: list(v) for k, v in self.scheduled_spec_decode_tokens.items()},
            "finished_req_ids": sorted(self.finished_req_ids),
            "preempted_req_ids": None if self.preempted_req_ids is None else sorted(self.preempted_req_ids),
        }


@dataclass(frozen=True)
class ModelRunnerOutput:
    """What the model produced for one ``SchedulerOutput``.

    ``sampled_token_ids[r]`` is empty for a prefill chunk that did not reach the
    end of the sequence, else the sampled token plus accepted drafts.
    ``draft_token_ids[r]`` are the drafts proposed for the next step (applied
    with vLLM's ``update_draft_token_ids`` after the update).
    """

    sampled_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    draft_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestOutput:
    """One ``EngineCoreOutput``: the tokens a request gained and, when it stopped, why.

    ``finish_reason`` is ``stop`` or ``length``; ``stop_reason`` is the stop
    token id that ended it (None for EOS and length).
    """

    req_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: str | None
    stop_reason: int | None

    def to_canonical(self) -> dict[str, Any]:
        """Return the trace form."""
        return {
            "req_id": self.req_id,
            "new_token_ids": list(self.new_token_ids),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
        }
