"""The exception hierarchy of the reference model.

Three families, each with a stable snake_case ``code`` that traces, reports and
the JSON-lines protocol use verbatim (the table lives in
``conformance/FORMAT.md``):

* :class:`InvalidConfig`: a scheduler configuration that makes no sense
  (``block_size`` of 0, a pool that cannot hold one ``max_model_len`` sequence).
* :class:`InvalidEvent`: the caller broke a precondition of an input event
  (duplicate request id, empty prompt, abort of an id never seen). The model's
  state is unchanged when one is raised.
* :class:`InvariantViolation`: a safety rule of the model failed after a step.
  This means the model (or a mutant of it) is wrong, never the input.

Besides these, :class:`EngineCrash` (a kind of InvalidEvent) models a call at
which the modelled vLLM release's engine core dies; after it the scheduler is
dead and refuses every call.

Divergences between two schedulers are *values*, not exceptions; they live in
``conformance/``.
"""

from __future__ import annotations


class SpecError(Exception):
    """Base class of every error the reference model raises on purpose."""

    code: str = "spec_error"

    def __init__(self, code: str, message: str, **context: object) -> None:
        self.code = code
        self.message = message
        self.context = dict(context)
        super().__init__(self.render())

    def render(self) -> str:
        """Return ``code: message (key=value, ...)`` for humans and logs."""
        ctx = ", ".join(f"{k}={v!r}" for k, v in sorted(self.context.items()))
        return f"{self.code}: {self.message}" + (f" ({ctx})" if ctx else "")


class InvalidConfig(SpecError):
    """A ``SchedulerConfig`` field is out of range or inconsistent."""


class InvalidEvent(SpecError):
    """An input event (add_request, abort, model_output) breaks a precondition."""


class EngineCrash(InvalidEvent):
    """The modelled release's engine core dies at this call: a vLLM bug modelled on purpose.

    ``engine_assertion_padded_admission``: ``schedule()`` reached the point at
    which vLLM 0.32/0.33 fail their own assertion (reports/findings.md,
    divergence 3). ``engine_dead``: any call after that. Unlike the other
    InvalidEvents this is no refusal that changes nothing: the scheduler is
    dead, its state is whatever it was when the engine died, and every later
    call raises ``engine_dead``. It subclasses InvalidEvent so that every
    adapter answers it like an input error, with its code
    (``schedconf.conformance.sut.refused_as_input_error``, the protocol server), and a
    trace can expect it on a ``step`` (``expect_error``).
    """


class IllegalTransition(SpecError):
    """A request status change that ``LEGAL_TRANSITIONS`` does not allow.

    Only a wrong model (or a mutant) can raise this: every transition the
    scheduler makes is checked against the table in ``spec/v1/request.py``.
    """


class InvariantViolation(SpecError):
    """A named invariant failed; ``invariant``, ``step`` and ``subject`` say where."""

    def __init__(self, invariant: str, step: int, subject: str, message: str) -> None:
        self.invariant = invariant
        self.step = step
        self.subject = subject
        super().__init__(
            f"invariant_violation:{invariant}",
            message,
            invariant=invariant,
            step=step,
            subject=subject,
        )


def require(condition: bool, error: type[SpecError], code: str, message: str, **context: object) -> None:
    """Raise ``error(code, message, **context)`` unless ``condition`` holds.

    Used instead of ``assert`` for caller preconditions: ``python -O`` strips
    asserts, and a precondition must never be silently skipped.
    """
    if not condition:
        raise error(code, message, **context)


# Every stable error code, with what it means. FORMAT.md's table is generated
# from this; a test checks that each code the model raises is listed here.
ERROR_CODES: dict[str, str] = {
    # input events
    "duplicate_request_id": "add_request with the id of a live request",
    "empty_prompt": "add_request without prompt tokens",
    "prompt_too_long": "a prompt of max_model_len tokens or more (no room to generate one token); v0: more than max_model_len tokens",
    "invalid_max_tokens": "max_tokens < 1",
    "invalid_min_tokens": "min_tokens outside [0, max_tokens]",
    "invalid_token_id": "a token id that is not an integer in [0, 2**31 - 1] (int32, as vLLM feeds the model)",
    "invalid_request_id": "an empty request id",
    "invalid_field_type": "an add_request field of the wrong type (arrival_time: a finite int or float)",
    "unknown_request_id": "abort of an id that was never added",
    "request_id_in_flight": "add_request with the id of a request aborted while a step that scheduled it is in flight (its model output not yet applied)",
    "output_not_processed": "schedule() while max_concurrent_batches steps (1 by default: the previous step) await their model output",
    "unexpected_model_output": "model output without a pending step, or for a step other than the oldest in flight",
    "unscheduled_step": "model output for a step that was never scheduled",
    "duplicate_model_output": "a second model output for a step whose output was already applied",
    "model_output_out_of_order": "model output for a step while an older step is still in flight (outputs are applied in schedule order)",
    "bad_num_sampled_tokens": "a request completing its sequence may sample at most 1 + its scheduled drafts (none at all is skipped, as vLLM does; not under an -async profile), a prefill chunk none",
    "invalid_finish_status": "finish_requests with a status that is not FINISHED_*",
    "priority_without_priority_policy": "(v0) add_request with a priority other than 0 while the policy is fcfs (LLMEngine.add_request refuses it)",
    "unscheduled_model_output": "sampled tokens for a request not scheduled this step",
    "unscheduled_draft_tokens": "draft tokens for a request not scheduled this step",
    "too_many_draft_tokens": "more draft tokens than num_spec_tokens",
    "drafts_without_spec_decode": "draft tokens while num_spec_tokens is 0",
    "drafts_under_async_scheduling": "draft tokens in a model output under an async profile (AsyncScheduler's drafts stay in the worker; the engine core never hands them to the scheduler)",
    # configuration
    "invalid_config_type": "a config field of the wrong type",
    "unknown_config_field": "a config field the model does not know",
    "unknown_profile": "a release profile that does not exist",
    "invalid_block_size": "block_size < 1",
    "invalid_num_gpu_blocks": "num_gpu_blocks < 2 (block 0 is the null block); v0 (no null block): num_gpu_blocks < 1",
    "invalid_num_cpu_blocks": "(v0) num_cpu_blocks < 0",
    "invalid_preemption_mode": "(v0) a preemption_mode other than null, swap or recompute",
    "missing_config_field": "(v0) a config without one of the required fields",
    "invalid_max_num_partial_prefills": "(v0) max_num_partial_prefills < 1",
    "partial_prefills_without_chunked_prefill": "(v0) max_num_partial_prefills > 1 with chunked prefill disabled",
    "invalid_max_long_partial_prefills": "(v0) max_long_partial_prefills outside [1, max_num_partial_prefills]",
    "invalid_token_budget": "max_num_batched_tokens < 1",
    "invalid_max_num_seqs": "max_num_seqs < 1",
    "invalid_max_model_len": "max_model_len < 1",
    "invalid_threshold": "long_prefill_token_threshold < 0",
    "invalid_max_concurrent_batches": "max_concurrent_batches < 1",
    "invalid_pipeline_parallel_size": "pipeline_parallel_size < 1",
    "invalid_prefill_schedule_interval": "prefill_schedule_interval < 1",
    "pipeline_parallel_not_modelled": "pipeline_parallel_size > 1 under a profile that is not async (the synchronous scheduler's pipeline-parallel payload is not modelled)",
    "invalid_max_num_active_seqs": "max_num_active_seqs not null and outside [1, max_num_seqs] (vLLM refuses it above max_num_seqs)",
    "knob_not_in_release": "a config knob or parameter the profile's release does not have (max_num_active_seqs, long_prefill_token_threshold_adaptive, use_v2_model_runner, reset_prefix_cache's reset_running_requests, schedule's throttle_prefills: 0.32+; prefill_schedule_interval: 0.33+)",
    "in_flight_not_modelled": "max_concurrent_batches > 1 with spec decode on a non-async profile, or under a profile whose release's in-flight rules are not modelled (vllm-0.11, aphrodite-0.24)",
    "invalid_num_spec_tokens": "num_spec_tokens < 0",
    "invalid_num_lookahead_tokens": "num_lookahead_tokens < 0",
    "invalid_policy": "a policy other than fcfs or priority",
    "budget_below_max_model_len": "chunked prefill off and max_num_batched_tokens < max_model_len",
    "pool_below_max_model_len": "the usable blocks cannot hold one max_model_len sequence (v0: block_size * num_gpu_blocks < max_model_len)",
    "threshold_above_max_model_len": "long_prefill_token_threshold > max_model_len (refused by 0.32+; by v0 when max_num_partial_prefills > 1)",
    "budget_below_max_num_seqs": "max_num_batched_tokens < max_num_seqs",
    # engine crashes (terminal: the scheduler refuses every later call with engine_dead)
    "engine_assertion_padded_admission": "(schedule, 0.32/0.33) vLLM's engine core dies on its own assertion: a one-token admission padded to 1 + num_spec_tokens was cut by long_prefill_token_threshold <= num_spec_tokens (a vLLM bug, modelled)",
    "engine_swap_space_exhausted": "(v0 schedule) a swap-out without enough free CPU blocks: vLLM raises RuntimeError (Aborted due to the lack of CPU swap space)",
    "engine_swapped_group_in_waiting": "(v0 schedule) priority preemption in swap mode put a SWAPPED group into waiting; vLLM fails on it when it reaches the head of waiting",
    "engine_abort_swapped_prefix_cache": "(v0 abort) freeing a swapped group with prefix caching: vLLM looks its CPU block ids up in the GPU allocator (KeyError)",
    "engine_computed_blocks_tracker_assertion": "(v0) vLLM's ComputedBlocksTracker asserts on a swapped decode it already dropped (prefix caching with swap)",
    "engine_evictor_stale_entry": "(v0 schedule) vLLM's LRU evictor returns a stale heap entry of a reused block and its allocator asserts",
    "engine_cached_below_computed": "(v0 schedule) prefix caching: vLLM asserts on a non-running prefill (a swapped prefill chunk) that has computed more tokens than it has cached",
    "engine_no_free_blocks": "(v0 schedule) vLLM's block allocator runs out of blocks (NoFreeBlocksError); not expected to be reachable",
    "engine_dead": "any call after an engine crash: the engine core is dead and the trace ends at the crash",
    # protocol only
    "unsupported": "(protocol, init) the scheduler cannot run this config or profile: verdict unknown",
    "internal": "(protocol) an unexpected failure inside the scheduler: recorded as a failure",
}
