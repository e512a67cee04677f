"""The v1 scheduler: one pure step machine over requests and KV blocks.

Models ``vllm/v1/core/sched/scheduler.py`` (0.33.0) for the core, §4-§7 of the
notes. The caller owns time and I/O: request ids, arrival times, sampled tokens
and drafts all come in as arguments; nothing here reads a clock or draws a
random number.

One step is ``schedule()`` followed by one ``update_from_output()`` for it.
By default the two alternate (synchronous scheduling, vLLM's ``EngineCore.step``);
with ``max_concurrent_batches > 1`` up to that many steps are *in flight*
(scheduled, their output not yet applied) and outputs are applied oldest
first, as ``EngineCore.step_with_batch_queue`` does for pipeline parallelism
and async scheduling. The ``-async`` profiles add ``AsyncScheduler``'s output
placeholders. ``add_request`` and ``abort`` may come between any two calls.

``schedule()`` in one paragraph: first the *running loop* walks ``running`` in
order and gives each request up to the tokens it lacks (bounded by the token
budget, the long-prefill threshold and ``max_model_len``), preempting victims
when its blocks do not fit; then, only if nobody was preempted, the *waiting
loop* admits requests from the head of ``waiting`` while budget, seats and
blocks last. Rules that changed across releases are knobs of ``self.profile``.
"""

# Size: one class, because vLLM's Scheduler is one class: schedule(), update_from_output() and the
# preemption paths share the step state and their order is the rule; split, a reader would
# lose the line-by-line correspondence with vllm/v1/core/sched/scheduler.py.

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schedconf.spec.errors import EngineCrash, InvalidEvent, require
from schedconf.spec.output import CachedRequestData, ModelRunnerOutput, NewRequestData, RequestOutput, SchedulerOutput
from schedconf.spec.tokens import MAX_TOKEN_ID, is_arrival_time, is_token_id
from schedconf.spec.v1.block_pool import BlockPool, KVCacheBlock
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.kv_cache import NO_HIT, Allocated, KVCacheManager, NoSpace
from schedconf.spec.v1.profiles import DEFAULT_PROFILE, Profile, check_config_for_profile, get_profile
from schedconf.spec.v1.queues import create_request_queue
from schedconf.spec.v1.request import Request, RequestStatus, SamplingParams
from schedconf.spec.v1.stats import PrefixCacheStats, SpecDecodingStats, render_scheduler_stats
from schedconf.spec.v1.stop import compute_stop_status


@dataclass(frozen=True)
class PreemptionRecord:
    """One preemption: who needed blocks, who was evicted, and the candidates then.

    ``candidates`` is ``running`` at the moment of the choice, in order, as
    ``(request_id, priority, arrival_time)``; the victim-order invariant checks
    the choice against it.
    """

    requester_id: str
    victim_id: str
    policy: str
    candidates: tuple[tuple[str, int, int | float], ...]


@dataclass
class SchedulerStats:
    """Counters over the scheduler's life, for campaign reports (never for decisions)."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_admissions: int = 0
    num_prefix_hit_admissions: int = 0
    num_prefix_hit_tokens: int = 0
    num_chunked_prefill_steps: int = 0
    num_budget_exhausted_steps: int = 0
    num_spec_decode_steps: int = 0


@dataclass
class _StepState:
    """What one ``schedule()`` call accumulates before building its output."""

    token_budget: int
    scheduled_new_reqs: list[Request] = field(default_factory=list)
    scheduled_resumed_reqs: list[Request] = field(default_factory=list)
    scheduled_running_reqs: list[Request] = field(default_factory=list)
    preempted_reqs: list[Request] = field(default_factory=list)
    req_to_new_blocks: dict[str, list[KVCacheBlock]] = field(default_factory=dict)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    preemptions: list[PreemptionRecord] = field(default_factory=list)
    prefill_scheduled: bool = False
    prefill_admitted: bool = False
    """A waiting request was admitted with more than one token left to compute (0.33 cadence)."""
    defer_prefills: bool = False
    """This step holds prefill back (the throttle or the local cadence)."""


@dataclass(frozen=True)
class StepRecord:
    """What the last ``schedule()`` did, kept for the invariants and the renderers."""

    step: int
    output: SchedulerOutput
    preemptions: tuple[PreemptionRecord, ...]
    samples: dict[str, bool]
    """Per scheduled request: does this step reach the end of its sequence (and so sample)?"""
    remaining_token_budget: int
    """The token budget left when the step was decided."""
    defer_prefills: bool = False
    """The step held prefill back (``throttle_prefills`` or the 0.33 local cadence)."""


class Scheduler:
    """The reference v1 scheduler for one config and one release profile."""

    def __init__(self, config: SchedulerConfig, profile: str | Profile = DEFAULT_PROFILE) -> None:
        self.config = config
        self.profile = get_profile(profile)
        check_config_for_profile(config, self.profile)
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.policy = config.policy
        self.reserve_full_sequence = (
            self.profile.reserve_full_sequence_at_admission
            if config.scheduler_reserve_full_isl is None
            else config.scheduler_reserve_full_isl
        )
        self.block_pool = BlockPool(
            num_gpu_blocks=config.num_gpu_blocks,
            enable_caching=config.enable_prefix_caching,
            free_uncached_to_front=self.profile.free_uncached_blocks_to_front,
        )
        self.kv_cache_manager = KVCacheManager(
            self.block_pool, config.block_size, config.max_model_len, config.enable_prefix_caching
        )
        # Every request not yet freed, by id.
        self.requests: dict[str, Request] = {}
        # Every id ever added (aborting an id never seen is an input error).
        self.seen_request_ids: set[str] = set()
        self.waiting = create_request_queue(config.policy)
        # Admission order; the running loop walks it front to back.
        self.running: list[Request] = []
        # Finished / preempted since the previous schedule(); handed to its output.
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        self.current_step = 0
        # Steps scheduled whose model output is not applied yet, oldest first.
        self.in_flight: deque[StepRecord] = deque()
        self.last_step: StepRecord | None = None
        self.stats = SchedulerStats()
        # vLLM's per-update SchedulerStats (0.32+, spec/v1/stats.py): the prefix-cache
        # lookups since the last update, and the stats the last update reported.
        self.prefix_cache_stats = PrefixCacheStats()
        self.last_scheduler_stats: dict[str, Any] | None = None
        # Waiting requests a waiting loop skipped (stale output in flight) and
        # that were not admitted or finished since: vLLM's deferred_waiting,
        # which its stats count apart from the other waiting requests.
        self.deferred_waiting: set[Request] = set()
        # Prefill throttling (0.32+) and the local prefill cadence (0.33): did the last step that
        # ran the waiting loop without deferring leave more waiting requests than deferred ones?
        self.prefill_capacity_bound = False
        # Steps that scheduled tokens (schedule() calls count in current_step), and the last of
        # them that carried prefill; a full interval back, so the first step is never held.
        self.num_executed_steps = 0
        self.last_prefill_step = -self.config.prefill_schedule_interval
        # The code of the engine crash that killed this scheduler (None: alive).
        self.crashed: str | None = None

    # ------------------------------------------------------------------ inputs

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        *,
        priority: int = 0,
        arrival_time: int | float = 0,
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        min_tokens: int = 0,
    ) -> None:
        """Queue a new request as WAITING at the tail of ``waiting`` (§7).

        Raises InvalidEvent (state unchanged) for a field of the wrong type, a
        duplicate live id, an empty or too long prompt (vLLM's input processor
        needs ``prompt_len <= max_model_len - 1`` so one token can be
        generated), ``max_tokens < 1``, ``min_tokens`` outside ``[0,
        max_tokens]``, a token id outside ``[0, MAX_TOKEN_ID]``, or the id of a
        request aborted in the step whose model output is still pending.
        ``arrival_time`` is any finite int or float (vLLM's is a float).
        """
        self._require_alive()
        # Field types first: a prompt and stop ids are sequences, ignore_eos a boolean.
        for name, value in (("prompt_token_ids", prompt_token_ids), ("stop_token_ids", stop_token_ids)):
            require(
                not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__"),
                InvalidEvent,
                "invalid_field_type",
                f"{name} must be a list of token ids",
                request_id=request_id,
                field=name,
            )
        require(
            isinstance(ignore_eos, bool),
            InvalidEvent,
            "invalid_field_type",
            "ignore_eos must be a boolean",
            request_id=request_id,
            field="ignore_eos",
        )
        prompt = tuple(prompt_token_ids)
        stops = tuple(stop_token_ids)
        require(
            isinstance(request_id, str) and request_id != "",
            InvalidEvent,
            "invalid_request_id",
            "request id must be a non-empty string",
            request_id=request_id,
        )
        require(
            request_id not in self.requests,
            InvalidEvent,
            "duplicate_request_id",
            f"request {request_id!r} is already known to the scheduler",
            request_id=request_id,
        )
        require(len(prompt) > 0, InvalidEvent, "empty_prompt", "the prompt has no tokens", request_id=request_id)
        require(
            len(prompt) < self.max_model_len,
            InvalidEvent,
            "prompt_too_long",
            f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len={self.max_model_len}",
            request_id=request_id,
            prompt_len=len(prompt),
        )
        for name, number in (("max_tokens", max_tokens), ("min_tokens", min_tokens), ("priority", priority)):
            require(
                isinstance(number, int) and not isinstance(number, bool),
                InvalidEvent,
                "invalid_field_type",
                f"{name} must be an integer",
                request_id=request_id,
                field=name,
            )
        require(
            is_arrival_time(arrival_time),
            InvalidEvent,
            "invalid_field_type",
            "arrival_time must be a finite number (int or float; not a boolean, NaN or infinity)",
            request_id=request_id,
            field="arrival_time",
        )
        require(
            max_tokens >= 1,
            InvalidEvent,
            "invalid_max_tokens",
            "max_tokens must be >= 1",
            request_id=request_id,
            max_tokens=max_tokens,
        )
        require(
            0 <= min_tokens <= max_tokens,
            InvalidEvent,
            "invalid_min_tokens",
            "min_tokens must be in [0, max_tokens]",
            request_id=request_id,
            min_tokens=min_tokens,
        )
        for token in (*prompt, *stops, *(() if eos_token_id is None else (eos_token_id,))):
            require(
                is_token_id(token),
                InvalidEvent,
                "invalid_token_id",
                f"token ids must be integers in [0, {MAX_TOKEN_ID}]",
                request_id=request_id,
                token=token,
            )
        # DEVIATION(vllm 0.33.0): vLLM looks outputs up by id, so a request
        # re-added under the id of one aborted (or finished) while a step that
        # scheduled it is in flight would receive that step's sampled tokens
        # and its in-flight counters. We refuse the re-add until every such
        # step's model output has been applied.
        require(
            not self.is_scheduled_in_flight(request_id),
            InvalidEvent,
            "request_id_in_flight",
            f"request {request_id!r} was aborted while a step that scheduled it is in flight; "
            f"apply that step's model output first",
            request_id=request_id,
        )
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(
                max_tokens=max_tokens,
                min_tokens=min_tokens,
                eos_token_id=eos_token_id,
                ignore_eos=ignore_eos,
                stop_token_ids=stops,
            ),
            priority=priority,
            arrival_time=arrival_time,
            block_size=self.block_size,
        )
        self.waiting.add_request(request)
        self.requests[request_id] = request
        self.seen_request_ids.add(request_id)

    def abort(self, request_id: str) -> list[str]:
        """Abort one request: ``finish_requests([request_id], FINISHED_ABORTED)``.

        Aborting an id never added raises InvalidEvent; aborting one that has
        already finished does nothing (the race vLLM tolerates).
        """
        self._require_alive()
        require(
            request_id in self.seen_request_ids,
            InvalidEvent,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
            request_id=request_id,
        )
        return self.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[str]:
        """Finish live requests from outside (§7): dequeue, set status, free blocks.

        ``request_ids`` is one id (a ``str``, as vLLM wraps it into a list), an
        iterable of ids, or None for every live request (0.33). Unknown and
        already-finished ids are skipped. Returns the ids finished, which
        appear in the next ``SchedulerOutput.finished_req_ids``.

        Any finished status goes on any live request, as in vLLM: a WAITING or
        PREEMPTED request may be stopped (FINISHED_STOPPED, _LENGTH_CAPPED) by
        the engine as well as aborted (vLLM's own
        ``test_get_num_unfinished_requests`` stops waiting requests); it
        leaves its queue, its blocks are freed and its id is in the next
        ``finished_req_ids``. Raises InvalidEvent ``invalid_finish_status``,
        with nothing changed, for a status that is not FINISHED_* (vLLM
        asserts it).

        DEVIATION(vllm 0.33.0): vLLM iterates the ids as a ``set`` (string hash
        order), so with several ids the free-queue order is not reproducible;
        we free in the order given (``None``: the order requests were added).
        Traces abort one id per event.
        """
        self._require_alive()
        require(
            isinstance(finished_status, RequestStatus) and finished_status.is_finished,
            InvalidEvent,
            "invalid_finish_status",
            f"finish_requests needs a FINISHED_* status, got {finished_status!r}",
            status=finished_status,
        )
        if request_ids is None:
            ids: list[str] = list(self.requests)
        elif isinstance(request_ids, str):
            ids = [request_ids]
        else:
            ids = list(request_ids)
        valid: list[Request] = []
        for request_id in ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished or request in valid:
                continue
            valid.append(request)
        running_to_remove = {r for r in valid if r.status is RequestStatus.RUNNING}
        waiting_to_remove = {r for r in valid if r.status is not RequestStatus.RUNNING}
        if running_to_remove:
            self.running = [r for r in self.running if r not in running_to_remove]
        if waiting_to_remove:
            self.waiting.remove_requests(waiting_to_remove)
            self.deferred_waiting -= waiting_to_remove
        for request in valid:
            request.transition(finished_status)
            self._free_request(request)
        return [r.request_id for r in valid]

    # --------------------------------------------------------------- schedule

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Decide this step's batch (§4): running loop, then maybe the waiting loop.

        ``throttle_prefills`` is vLLM's data-parallel prefill balancing: the
        coordinator sets it on steps off its prefill cadence (profile knob
        ``prefill_throttle``). Raises EngineCrash
        ``engine_assertion_padded_admission`` where the profile's release dies
        (see ``_schedule_waiting``); the scheduler is dead afterwards.
        """
        self._require_alive()
        require(
            isinstance(throttle_prefills, bool),
            InvalidEvent,
            "invalid_field_type",
            "throttle_prefills must be a boolean",
            field="throttle_prefills",
        )
        require(
            not throttle_prefills or self.profile.prefill_throttle,
            InvalidEvent,
            "knob_not_in_release",
            f"throttle_prefills is not a parameter of {self.profile.name}'s schedule()",
            profile=self.profile.name,
        )
        require(
            len(self.in_flight) < self.config.max_concurrent_batches,
            InvalidEvent,
            "output_not_processed",
            f"schedule() called while {len(self.in_flight)} step(s) await their model output "
            f"(oldest: step {self.in_flight[0].step if self.in_flight else None}; "
            f"max_concurrent_batches={self.config.max_concurrent_batches})",
            step=self.current_step,
        )
        self.current_step += 1
        st = _StepState(token_budget=self.config.max_num_batched_tokens)
        st.defer_prefills = self.is_prefill_deferred(throttle_prefills)
        threshold = self.get_long_prefill_token_threshold()

        self._schedule_running(st, threshold)
        # No admission in a step that preempted: the freed blocks go to the
        # requests already running first.
        if not st.preempted_reqs:
            self._schedule_waiting(st, threshold)
            if not st.defer_prefills:
                # A releasing step records whether it could not drain the queue.
                self.prefill_capacity_bound = len(self.waiting) > len(self.deferred_waiting)
        if st.num_scheduled_tokens:
            self.num_executed_steps += 1
        if self.config.prefill_schedule_interval > 1 and (st.prefill_scheduled or st.prefill_admitted):
            self.last_prefill_step = self.num_executed_steps

        output = self._make_output(st)
        self._update_after_schedule(output)
        self.last_step = StepRecord(
            step=self.current_step,
            output=output,
            preemptions=tuple(st.preemptions),
            samples={rid: not self.requests[rid].is_prefill_chunk for rid in output.num_scheduled_tokens},
            remaining_token_budget=st.token_budget,
            defer_prefills=st.defer_prefills,
        )
        self.in_flight.append(self.last_step)
        self._count_step(st, output)
        return output

    @property
    def pending_output(self) -> SchedulerOutput | None:
        """The newest in-flight step's output (the last schedule()'s), or None when none is in flight."""
        return self.in_flight[-1].output if self.in_flight else None

    def is_scheduled_in_flight(self, request_id: str) -> bool:
        """True if a step still in flight scheduled tokens for ``request_id``."""
        return any(request_id in record.output.num_scheduled_tokens for record in self.in_flight)

    def get_output_to_apply(self, step: int | None = None) -> SchedulerOutput:
        """The output the next ``update_from_output`` applies: that of ``step``
        (refused as :meth:`get_in_flight_output` does), or with None the oldest
        in flight (``unexpected_model_output`` when none is)."""
        if step is not None:
            return self.get_in_flight_output(step)
        self._require_alive()
        require(
            bool(self.in_flight),
            InvalidEvent,
            "unexpected_model_output",
            "model output without a step in flight",
            step=self.current_step,
        )
        return self.in_flight[0].output

    def get_in_flight_output(self, step: int) -> SchedulerOutput:
        """The output of ``step`` if its model output is the one to apply next.

        Raises InvalidEvent, nothing changed: ``unscheduled_step`` (never
        scheduled), ``duplicate_model_output`` (its output was applied already),
        ``model_output_out_of_order`` (an older step is still in flight: vLLM's
        engine applies outputs in schedule order).
        """
        self._require_alive()
        require(
            isinstance(step, int) and not isinstance(step, bool) and 1 <= step <= self.current_step,
            InvalidEvent,
            "unscheduled_step",
            f"model output for step {step!r}, which was never scheduled (last step: {self.current_step})",
            step=step,
        )
        in_flight = [record.step for record in self.in_flight]
        require(
            step in in_flight,
            InvalidEvent,
            "duplicate_model_output",
            f"model output for step {step}, whose output was already applied",
            step=step,
        )
        require(
            step == in_flight[0],
            InvalidEvent,
            "model_output_out_of_order",
            f"model output for step {step} while step {in_flight[0]} is still in flight "
            f"(outputs are applied in schedule order)",
            step=step,
            oldest=in_flight[0],
        )
        return self.in_flight[0].output

    def _require_alive(self) -> None:
        """Refuse every call once the engine has crashed (``engine_dead``)."""
        require(
            self.crashed is None,
            EngineCrash,
            "engine_dead",
            f"the engine core died in step {self.current_step} ({self.crashed}); it takes no more calls",
            step=self.current_step,
            crash=self.crashed,
        )

    def get_long_prefill_token_threshold(self) -> int:
        """The step's effective long-prefill threshold (§4.0 step 4); 0 means none.

        A lone request (running + waiting == 1) is not capped (0.33): it has
        nobody to starve. With ``long_prefill_token_threshold_adaptive`` the cap
        is floored at a fair share of the budget.
        """
        threshold = self.config.long_prefill_token_threshold
        num_eligible_reqs = len(self.running) + len(self.waiting)
        if self.profile.exempt_lone_request_from_threshold and num_eligible_reqs <= 1:
            return 0
        if threshold > 0 and self.config.long_prefill_token_threshold_adaptive and num_eligible_reqs > 0:
            threshold = max(threshold, self.config.max_num_batched_tokens // num_eligible_reqs)
        return threshold

    def is_prefill_deferred(self, throttle_prefills: bool) -> bool:
        """Does this step hold prefill back? (0.33.0 ``scheduler.py:748-791``.)

        Only while some running request is not a prefill chunk (a decode would
        fill the step) and the last releasing step was not capacity bound: on
        the coordinator's word (``throttle_prefills``), or, with
        ``prefill_schedule_interval`` N > 1, until N executed steps have passed
        since the last step that carried prefill.
        """
        interval = self.config.prefill_schedule_interval
        held = throttle_prefills or (interval > 1 and (self.num_executed_steps + 1) - self.last_prefill_step < interval)
        return held and not self.prefill_capacity_bound and not all(r.is_prefill_chunk for r in self.running)

    def _schedule_running(self, st: _StepState, threshold: int) -> None:
        """The running loop (§4.1): top up each running request, preempting on no space."""
        req_index = 0
        while req_index < len(self.running) and st.token_budget > 0:
            request = self.running[req_index]
            if self._is_sure_to_reach_max_tokens(request):
                req_index += 1
                continue
            if self.current_step < request.next_decode_eligible_step:
                # V2 runner + pipeline parallelism + async: pipeline_parallel_size steps between
                # a request's decodes (the workers' sampled-token ring).
                req_index += 1
                continue
            if st.defer_prefills and request.is_prefill_chunk:
                # Held prefill: decodes still fill the step.
                req_index += 1
                continue
            # Placeholders count as tokens to compute: under async scheduling a
            # decode is scheduled again before its previous output returns.
            num_new_tokens = (
                request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            )
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            num_new_tokens = min(num_new_tokens, st.token_budget)
            # Keep the position of the token sampled after this step below
            # max_model_len (matters with drafts).
            num_new_tokens = min(num_new_tokens, self.max_model_len - 1 - request.num_computed_tokens)
            if num_new_tokens < 0:
                # Computed past its tokens (empty output with drafts, _reject_drafts):
                # 0.32/0.33 clamp the count at 0 and skip the request.
                assert request.num_computed_tokens > request.num_tokens_with_spec + request.num_output_placeholders, (
                    f"request {request.request_id} is past max_model_len"
                )
                num_new_tokens = 0
            if num_new_tokens == 0:
                # continue, not break: later requests may still run.
                req_index += 1
                continue

            result = self._allocate_or_preempt(st, request, num_new_tokens, req_index)
            if isinstance(result, NoSpace) or result is None:
                if (
                    self.policy == "priority"
                    and request.status is RequestStatus.PREEMPTED
                    and self.profile.priority_self_preemption == "continue"
                ):
                    # It preempted itself; the requests after it shifted into
                    # its slot and may still fit (0.33).
                    continue
                break
            allocated, req_index = result

            st.scheduled_running_reqs.append(request)
            st.prefill_scheduled |= request.is_prefill_chunk
            st.req_to_new_blocks[request.request_id] = allocated.new_blocks
            st.num_scheduled_tokens[request.request_id] = num_new_tokens
            st.token_budget -= num_new_tokens
            req_index += 1
            self._schedule_drafts(st, request, num_new_tokens)

    def _is_sure_to_reach_max_tokens(self, request: Request) -> bool:
        """Async skip rule (§4.1 step 1): the steps in flight already reach ``max_tokens``.

        ``num_computed_tokens + 1`` is the position sampled after the in-flight
        steps; minus ``placeholders - 1`` drafts that may all be rejected, it is
        what the request surely holds once they return.
        """
        return (
            request.num_output_placeholders > 0
            and request.num_computed_tokens + 2 - request.num_output_placeholders
            >= request.num_prompt_tokens + request.max_tokens
        )

    def _allocate_or_preempt(
        self, st: _StepState, request: Request, num_new_tokens: int, req_index: int
    ) -> tuple[Allocated, int] | NoSpace | None:
        """Allocate ``request``'s slots, preempting victims until it fits (§4.1 step 4).

        Returns the allocation and the (possibly moved) cursor, or the last
        NoSpace / None when ``request`` preempted itself.
        """
        while True:
            result = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, num_lookahead_tokens=self.config.num_lookahead_tokens
            )
            if isinstance(result, Allocated):
                return result, req_index
            victim = self.select_victim()
            st.preemptions.append(
                PreemptionRecord(
                    requester_id=request.request_id,
                    victim_id=victim.request_id,
                    policy=self.policy,
                    candidates=tuple((r.request_id, r.priority, r.arrival_time) for r in self.running),
                )
            )
            if self.policy == "priority":
                req_index = self._remove_priority_victim(st, victim, req_index)
            else:
                # The FCFS victim is the tail, never behind the cursor: nothing
                # to repair. (vLLM pops the tail; removing the chosen victim is
                # the same and keeps a wrong choice visible to the checks.)
                self.running.remove(victim)
            self._preempt_request(victim)
            st.preempted_reqs.append(victim)
            if victim is request:
                return None

    def select_victim(self) -> Request:
        """The request to preempt (§4.1): FCFS takes the tail of ``running``;
        priority takes the first request with the maximal (priority, arrival_time),
        i.e. the least important, latest arrived one."""
        if self.policy == "priority":
            return max(self.running, key=lambda r: r.victim_key)
        return self.running[-1]

    def _remove_priority_victim(self, st: _StepState, victim: Request, req_index: int) -> int:
        """Remove a priority victim from ``running`` and repair the step state.

        The repair is the profile's ``priority_victim_repair`` (§4.1 table).
        Returns the cursor, moved back when the victim stood before it.
        """
        victim_index = self.running.index(victim)
        del self.running[victim_index]
        repair = self.profile.priority_victim_repair
        was_scheduled = victim in st.scheduled_running_reqs
        if repair == "index" and victim_index < req_index:
            req_index -= 1
        if repair == "scheduled_only" and was_scheduled:
            req_index -= 1
        if was_scheduled:
            st.scheduled_running_reqs.remove(victim)
            if repair != "none":
                # Give back the victim's tokens and forget what it was given.
                st.token_budget += st.num_scheduled_tokens.pop(victim.request_id)
                st.req_to_new_blocks.pop(victim.request_id)
                st.scheduled_spec_decode_tokens.pop(victim.request_id, None)
        return req_index

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget the prefix cache (vLLM's ``Scheduler.reset_prefix_cache``); True if it was reset.

        Refused (False, nothing changed) while any request holds blocks. With
        ``reset_running_requests`` every running request is preempted first,
        tail first (so under FCFS they return to the head of ``waiting`` in
        their running order), and the output of their steps still in flight is
        dropped rather than delivered: they may resume at once.
        """
        self._require_alive()
        require(
            isinstance(reset_running_requests, bool),
            InvalidEvent,
            "invalid_field_type",
            "reset_running_requests must be a boolean",
            field="reset_running_requests",
        )
        require(
            not reset_running_requests or self.profile.has_0_32_scheduler_knobs,
            InvalidEvent,
            "knob_not_in_release",
            f"reset_running_requests is not a parameter of {self.profile.name}'s reset_prefix_cache",
            profile=self.profile.name,
        )
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop(), drop_stale_output=True)
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset:
            self.prefix_cache_stats.reset = True
        return reset

    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        """Preempt a running request by recompute (§4.2).

        Its blocks go back to the pool (tail first), ``num_computed_tokens``
        drops to 0, its drafts are dropped (0.12+), and it goes to the head of
        ``waiting`` (FCFS) or back by its key (priority). It keeps its outputs
        and will re-prefill prompt + outputs when resumed.
        """
        self.kv_cache_manager.free(request)
        request.transition(RequestStatus.PREEMPTED)
        request.num_computed_tokens = 0
        if self.profile.clear_drafts_on_preempt:
            request.spec_token_ids = []
        # Steps still in flight become stale: their tokens are delivered later
        # without touching the counters reset here (§6), or dropped (a reset's
        # preemption; an undrained dropped share stays dropped). Assigned, not
        # added: num_in_flight_tokens already holds any undrained stale share.
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.preempted_req_ids.add(request.request_id)

    def _schedule_drafts(self, st: _StepState, request: Request, num_new_tokens: int) -> None:
        """Hand this step's share of the request's drafts to the output (§4.1 step 7).

        The drafts scheduled are those the step's tokens reach past
        ``num_tokens``: ``num_new_tokens + num_computed_tokens - num_tokens``.
        """
        if not request.spec_token_ids:
            return
        num_scheduled_spec = self.get_num_scheduled_spec_tokens(request, num_new_tokens)
        if num_scheduled_spec > 0:
            st.scheduled_spec_decode_tokens[request.request_id] = request.spec_token_ids[:num_scheduled_spec]
        if self.profile.clear_drafts_when_scheduled:
            request.spec_token_ids = []
        elif num_scheduled_spec > 0:
            del request.spec_token_ids[num_scheduled_spec:]

    def get_num_scheduled_spec_tokens(self, request: Request, num_new_tokens: int) -> int:
        """How many of ``request``'s drafts this step's ``num_new_tokens`` reach (§4.1 step 7).

        The tokens past ``num_tokens`` and past the placeholders of its steps
        in flight (each of which will become a real token or be rolled back):
        ``num_new_tokens + num_computed_tokens - num_tokens - num_output_placeholders``.
        """
        return num_new_tokens + request.num_computed_tokens - request.num_tokens - request.num_output_placeholders

    def _schedule_waiting(self, st: _StepState, threshold: int) -> None:
        """The waiting loop (§4.3): admit from the head while budget, seats and blocks last.

        Allocation failure ends the loop (no preemption for a waiting request).
        """
        skipped: list[Request] = []
        while st.token_budget > 0 and self.waiting:
            # Admission cap: max_num_active_seqs (default max_num_seqs) requests may run at once.
            if len(self.running) >= (self.config.max_num_active_seqs or self.config.max_num_seqs):
                break
            request = self.waiting.peek_request()
            if request.num_stale_output_tokens and not request.drop_stale_output:
                # Output of a step from before its preemption is still in
                # flight: resuming now could resample a position that output
                # will deliver (0.33). Skipped until it drains.
                skipped.append(self.waiting.pop_request())
                self.deferred_waiting.add(request)
                continue
            looked_up = request.num_computed_tokens == 0
            if looked_up:
                hit = self.kv_cache_manager.get_computed_blocks(request)
            else:
                # Only a request holding KV while waiting gets here (remote KV
                # loads in vLLM; under vllm-0.11 an un-repaired priority victim).
                hit = NO_HIT
            num_computed_tokens = request.num_computed_tokens if request.num_computed_tokens else hit.num_tokens
            if st.defer_prefills and num_computed_tokens < request.num_tokens - 1:
                # Held prefill: nobody with prompt left to compute is admitted this step
                # (one token left, as after a full prefix hit, still is).
                break
            # num_tokens, not num_prompt_tokens: a resumed request re-prefills its outputs.
            num_new_tokens = request.num_tokens - num_computed_tokens

            pad_spec_decode = False
            if self._should_pad_to_spec_size(st, num_new_tokens, num_computed_tokens):
                padded = 1 + self.config.num_spec_tokens
                if num_computed_tokens + padded + 1 <= self.max_model_len:
                    if padded > st.token_budget:
                        break  # prefer not scheduling to scheduling unpadded
                    num_new_tokens = padded
                    pad_spec_decode = True

            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            if not self.config.enable_chunked_prefill and num_new_tokens > st.token_budget:
                if self.profile.chunking_off_overflow == "break":
                    break  # strict FCFS: nobody passes a request that does not fit
                skipped.append(self.waiting.pop_request())
                continue
            num_new_tokens = min(num_new_tokens, st.token_budget)
            assert num_new_tokens > 0

            lookahead = self.config.num_lookahead_tokens
            if request.num_computed_tokens == 0 and not self.profile.lookahead_for_fresh_requests:
                lookahead = 0
            result = self.kv_cache_manager.allocate_slots(
                request,
                num_new_tokens,
                hit=hit,
                num_lookahead_tokens=lookahead,
                full_sequence_must_fit=self.reserve_full_sequence,
            )
            if isinstance(result, NoSpace):
                break

            self.waiting.pop_request()
            self.deferred_waiting.discard(request)
            self.running.append(request)
            if request.status is RequestStatus.WAITING:
                st.scheduled_new_reqs.append(request)
            else:
                st.scheduled_resumed_reqs.append(request)
            st.req_to_new_blocks[request.request_id] = list(self.kv_cache_manager.get_blocks(request.request_id))
            st.num_scheduled_tokens[request.request_id] = num_new_tokens
            st.token_budget -= num_new_tokens
            request.transition(RequestStatus.RUNNING)
            request.num_computed_tokens = num_computed_tokens
            st.prefill_admitted |= num_computed_tokens < request.num_tokens - 1
            if pad_spec_decode:
                self._check_padded_admission(request, num_new_tokens)
                st.scheduled_spec_decode_tokens[request.request_id] = [-1] * self.config.num_spec_tokens
            self.stats.num_admissions += 1
            if looked_up and self.config.enable_prefix_caching:
                # Recorded at admission, so lookups of requests left waiting do not count.
                self.prefix_cache_stats.record(request.num_tokens, hit.num_tokens, request.num_preemptions > 0)
            if hit.num_tokens:
                self.stats.num_prefix_hit_admissions += 1
                self.stats.num_prefix_hit_tokens += hit.num_tokens

        if skipped:
            self.waiting.prepend_requests(skipped, self.profile.skipped_requeue_order)

    def _check_padded_admission(self, request: Request, num_new_tokens: int) -> None:
        """vLLM's ``assert num_new_tokens == 1 + self.num_spec_tokens`` on a padded admission.

        NOTE(vllm 0.33.0 scheduler.py:1579, 0.32.0 :1372): a vLLM bug modelled
        on purpose. The padding (``:1318``) comes before the long-prefill
        threshold (``:1332``), so a threshold ``0 < T <= num_spec_tokens`` cuts a
        padded admission to ``T`` (the budget cannot cut it: a padding that does
        not fit the budget ends the loop instead; the ``max_model_len`` check
        comes before the padding, and chunked prefill off cannot stop it: ``T`` is
        below the padding that fit). The request is already popped, running
        and holding its new blocks when the assertion fails, and vLLM's engine
        core dies in ``schedule()``: the scheduler dies here too
        (``engine_assertion_padded_admission``, then ``engine_dead``). An
        admission whose blocks do not fit ends the loop before the assertion.
        """
        if num_new_tokens == 1 + self.config.num_spec_tokens:
            return
        self.crashed = "engine_assertion_padded_admission"
        raise EngineCrash(
            "engine_assertion_padded_admission",
            f"step {self.current_step}: request {request.request_id!r} was padded to "
            f"{1 + self.config.num_spec_tokens} tokens and cut to {num_new_tokens} by "
            f"long_prefill_token_threshold={self.config.long_prefill_token_threshold}; vLLM fails "
            f"assert num_new_tokens == 1 + num_spec_tokens and its engine core dies",
            request_id=request.request_id,
            step=self.current_step,
            num_new_tokens=num_new_tokens,
            num_spec_tokens=self.config.num_spec_tokens,
            long_prefill_token_threshold=self.config.long_prefill_token_threshold,
        )

    def _should_pad_to_spec_size(self, st: _StepState, num_new_tokens: int, num_computed_tokens: int) -> bool:
        """The 0.32+ padding rule (§4.3 step 8.2): a one-token admission joins a
        decode batch at the uniform spec-decode size, so the batch keeps one shape."""
        return (
            self.profile.pad_new_decodes_to_spec_size
            and self.config.num_spec_tokens > 0
            and num_new_tokens == 1
            and not st.prefill_scheduled
            and (bool(st.scheduled_running_reqs) or num_computed_tokens > 0)
        )

    def _make_output(self, st: _StepState) -> SchedulerOutput:
        """Build the SchedulerOutput (§4.4) from the step state, before counters move.

        With ``use_v2_model_runner`` the resumed requests are listed after the
        new ones, as new requests with all their blocks (0.32+ V2 layout).
        """
        resumed_reqs = st.scheduled_resumed_reqs
        new_listed = st.scheduled_new_reqs
        if self.config.use_v2_model_runner:
            new_listed, resumed_reqs = [*st.scheduled_new_reqs, *resumed_reqs], []
        new_reqs = tuple(
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                block_ids=tuple(b.block_id for b in st.req_to_new_blocks[r.request_id]),
                num_computed_tokens=r.num_computed_tokens,
            )
            for r in new_listed
        )
        cached = tuple(
            CachedRequestData(
                req_id=r.request_id,
                resumed=resumed,
                new_block_ids=tuple(b.block_id for b in st.req_to_new_blocks[r.request_id]),
                num_computed_tokens=r.num_computed_tokens,
                num_output_tokens=r.num_output_tokens + r.num_output_placeholders,
            )
            for reqs, resumed in ((st.scheduled_running_reqs, False), (resumed_reqs, True))
            for r in reqs
        )
        return SchedulerOutput(
            step=self.current_step,
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(st.num_scheduled_tokens),
            total_num_scheduled_tokens=sum(st.num_scheduled_tokens.values()),
            scheduled_spec_decode_tokens={k: tuple(v) for k, v in st.scheduled_spec_decode_tokens.items()},
            finished_req_ids=frozenset(self.finished_req_ids),
            preempted_req_ids=frozenset(self.preempted_req_ids) if self.profile.report_preempted_req_ids else None,
        )

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        """Count the scheduled tokens as computed right away (§4.5).

        Optimistic: rejected drafts are rolled back by ``update_from_output``.
        Then the finished / preempted sets start afresh for the next step.
        """
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.requests[request_id]
            request.num_computed_tokens += num_tokens
            request.num_in_flight_tokens += num_tokens
            request.is_prefill_chunk = (
                request.num_computed_tokens < request.num_tokens + request.num_output_placeholders
            )
            if self.profile.async_scheduling and not request.is_prefill_chunk:
                # AsyncScheduler: the step will sample 1 token plus its drafts,
                # and the worker will propose drafts for the next step, which
                # the scheduler never sees: k placeholders (-1) stand for them.
                request.num_output_placeholders += 1 + len(output.scheduled_spec_decode_tokens.get(request_id, ()))
                if self.config.num_spec_tokens:
                    request.spec_token_ids = [-1] * self.config.num_spec_tokens
                if self.config.use_v2_model_runner and self.profile.pp_decode_stagger:
                    # The next decode waits pipeline_parallel_size steps.
                    request.next_decode_eligible_step = self.current_step + self.config.pipeline_parallel_size
        self.finished_req_ids = set()
        self.preempted_req_ids = set()

    def _count_step(self, st: _StepState, output: SchedulerOutput) -> None:
        """Update the campaign counters for one schedule() call."""
        self.stats.num_steps += 1
        self.stats.num_preemptions += len(st.preempted_reqs)
        if st.token_budget == 0:
            self.stats.num_budget_exhausted_steps += 1
        if output.scheduled_spec_decode_tokens:
            self.stats.num_spec_decode_steps += 1
        if any(self.requests[r].is_prefill_chunk for r in output.num_scheduled_tokens):
            self.stats.num_chunked_prefill_steps += 1

    # ------------------------------------------------------------------ update

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        """Apply the model's output for the oldest in-flight step (§5), then its drafts (§7).

        Per scheduled request, in schedule order: release its in-flight tokens
        (and, if it was preempted since, their stale share), roll back rejected
        drafts, append sampled tokens one by one with the stop check, free the
        request if it stopped. Then store the drafts proposed for the next step.
        Returns one RequestOutput per request that gained tokens or stopped.
        Stale output (from before a preemption) is delivered: its tokens are
        appended and may stop the request, but no counter moves (§6).
        """
        self._require_alive()
        require(
            bool(self.in_flight) and scheduler_output is self.in_flight[0].output,
            InvalidEvent,
            "unexpected_model_output",
            "update_from_output() needs the output of the oldest step in flight, once",
            step=self.current_step,
        )
        self._validate_model_output(scheduler_output, model_output)
        self.in_flight.popleft()

        outputs: list[RequestOutput] = []
        stopped_running: set[Request] = set()
        stopped_preempted: set[Request] = set()
        spec_decoding: SpecDecodingStats | None = None
        for request_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue  # aborted (or stopped by an earlier step's output) while the step ran
            request.num_in_flight_tokens -= num_scheduled
            is_stale = request.num_stale_output_tokens > 0
            if is_stale:
                request.num_stale_output_tokens -= num_scheduled
                assert request.num_stale_output_tokens >= 0
                if request.drop_stale_output:
                    continue  # a reset's preemption: its positions are resampled
            generated = list(model_output.sampled_token_ids.get(request_id, ()))
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id, ())
            if drafts and generated:  # stale output counts too (vLLM observes before the stale check)
                spec_decoding = spec_decoding or SpecDecodingStats(self.config.num_spec_tokens)
                spec_decoding.observe_draft(len(drafts), max(len(generated) - 1, 0))
            if not is_stale:
                # A stale rejection count predates the preemption's reset.
                self._reject_drafts(
                    request, scheduler_output.scheduled_spec_decode_tokens.get(request_id, ()), generated
                )
            status_before = request.status
            new_token_ids, stopped = generated, False
            if generated:
                had_placeholders = request.num_output_placeholders > 0
                new_token_ids, stopped = self._append_output_tokens(request, generated, is_stale)
                if status_before is RequestStatus.RUNNING and not is_stale:
                    if self.profile.cache_blocks_after_spec_update:
                        if self.config.num_spec_tokens > 0 or had_placeholders:
                            # 0.33, the base class: only tokens whose output has been applied are final.
                            self.kv_cache_manager.cache_blocks(
                                request, request.num_computed_tokens - request.num_in_flight_tokens
                            )
                    elif self.profile.async_scheduling:
                        # 0.32: AsyncScheduler._update_request_with_output caches for
                        # every running request, up to computed - placeholders.
                        self.kv_cache_manager.cache_blocks(
                            request, request.num_computed_tokens - request.num_output_placeholders
                        )
            if stopped:
                self._free_request(request)
                (stopped_running if status_before is RequestStatus.RUNNING else stopped_preempted).add(request)
            if new_token_ids or stopped:
                outputs.append(
                    RequestOutput(
                        req_id=request_id,
                        new_token_ids=tuple(new_token_ids),
                        finish_reason=request.status.finish_reason,
                        stop_reason=request.stop_reason,
                    )
                )
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            self.waiting.remove_requests(stopped_preempted)
            self.deferred_waiting -= stopped_preempted
        if not self.profile.async_scheduling:
            # vLLM's engine core hands drafts over only without async
            # scheduling (EngineCore.post_step); under AsyncScheduler they stay
            # in the worker (non-empty ones are refused, empty ones change nothing).
            self._update_draft_token_ids(model_output.draft_token_ids)
        self._make_stats(spec_decoding)
        return outputs

    def _make_stats(self, spec_decoding: SpecDecodingStats | None) -> None:
        """End an update as vLLM's ``make_stats`` does: report, then start the prefix-cache counters afresh.

        Only for the releases whose stats are modelled (0.32+); None otherwise.
        """
        if not self.config.log_stats:
            self.last_scheduler_stats = None  # make_stats returns None without log_stats
        elif self.profile.has_0_32_scheduler_knobs:
            self.last_scheduler_stats = render_scheduler_stats(
                len(self.running), len(self.waiting), len(self.deferred_waiting), self.prefix_cache_stats, spec_decoding
            )
        self.prefix_cache_stats = PrefixCacheStats()

    def _validate_model_output(self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput) -> None:
        """Refuse model output that no model could have produced for this step.

        A scheduled request whose tokens reach the end of its sequence samples
        1 token plus up to one per scheduled draft; a prefill chunk that stops
        short samples nothing. Drafts need spec decode, at most
        ``num_spec_tokens`` of them, for requests of this step.
        """
        record = self.in_flight[0]
        scheduled = scheduler_output.num_scheduled_tokens
        for request_id, tokens in model_output.sampled_token_ids.items():
            require(
                request_id in scheduled,
                InvalidEvent,
                "unscheduled_model_output",
                f"sampled tokens for {request_id!r}, which was not scheduled this step",
                request_id=request_id,
                step=record.step,
            )
            for token in tokens:
                require(
                    is_token_id(token),
                    InvalidEvent,
                    "invalid_token_id",
                    f"sampled token ids must be integers in [0, {MAX_TOKEN_ID}]",
                    request_id=request_id,
                    token=token,
                )
        for request_id in scheduled:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            num_drafts = len(scheduler_output.scheduled_spec_decode_tokens.get(request_id, ()))
            got = len(model_output.sampled_token_ids.get(request_id, ()))
            if record.samples[request_id]:
                # An empty list is what vLLM skips: no token, no stop, no output
                # (update_from_output guards on ``if new_token_ids``).
                require(
                    got <= 1 + num_drafts,
                    InvalidEvent,
                    "bad_num_sampled_tokens",
                    f"request {request_id!r} reached the end of its sequence and may sample "
                    f"0 to {1 + num_drafts} tokens, got {got}",
                    request_id=request_id,
                    step=record.step,
                )
                # DEVIATION(vllm 0.33.0): under AsyncScheduler an empty list
                # would leave the step's placeholder unresolved forever (vLLM
                # resolves one per returned token), and no model runner returns
                # one for a request that samples: refused.
                require(
                    got > 0 or not self.profile.async_scheduling,
                    InvalidEvent,
                    "bad_num_sampled_tokens",
                    f"request {request_id!r} samples in step {record.step} under async scheduling "
                    f"and must return at least one token",
                    request_id=request_id,
                    step=record.step,
                )
                # With drafts scheduled, an empty list is accepted as vLLM
                # accepts it; what it does to the request is _reject_drafts'.
            else:
                require(
                    got == 0,
                    InvalidEvent,
                    "bad_num_sampled_tokens",
                    f"request {request_id!r} ran a prefill chunk and samples nothing, got {got} tokens",
                    request_id=request_id,
                    step=record.step,
                )
        for request_id, drafts in model_output.draft_token_ids.items():
            require(
                self.config.num_spec_tokens > 0,
                InvalidEvent,
                "drafts_without_spec_decode",
                "draft tokens given but num_spec_tokens is 0",
                request_id=request_id,
            )
            require(
                not (drafts and self.profile.async_scheduling),
                InvalidEvent,
                "drafts_under_async_scheduling",
                f"draft tokens for {request_id!r} under {self.profile.name}: AsyncScheduler's drafts stay "
                "in the worker (vLLM's engine core never hands them to the scheduler)",
                request_id=request_id,
            )
            require(
                request_id in scheduled,
                InvalidEvent,
                "unscheduled_draft_tokens",
                f"draft tokens for {request_id!r}, which was not scheduled this step",
                request_id=request_id,
            )
            require(
                len(drafts) <= self.config.num_spec_tokens,
                InvalidEvent,
                "too_many_draft_tokens",
                f"{len(drafts)} drafts exceed num_spec_tokens={self.config.num_spec_tokens}",
                request_id=request_id,
            )
            for token in drafts:
                require(
                    is_token_id(token),
                    InvalidEvent,
                    "invalid_token_id",
                    f"draft token ids must be integers in [0, {MAX_TOKEN_ID}]",
                    request_id=request_id,
                    token=token,
                )

    def _reject_drafts(self, request: Request, drafts: tuple[int, ...], generated: list[int]) -> None:
        """Roll ``num_computed_tokens`` back over rejected drafts (§5 step 3).

        The model samples one token per accepted draft plus one; every draft
        beyond ``len(generated) - 1`` was rejected and its KV slot is reused.
        """
        if not drafts:
            return
        if self.profile.guard_empty_output_rejection:
            if not generated:
                # 0.32/0.33 skip the rejection on empty output: num_computed_tokens
                # stays past the request's tokens, the drafts counted as computed.
                # Its next num_new_tokens is then 0 (its new drafts fill the gap)
                # or negative, clamped to 0 (_reserve_prefill_lookahead): the
                # request is skipped by every later step, RUNNING and holding its
                # blocks and its seat, until it is finished from outside. The
                # model follows (_schedule_running's clamp).
                return
            num_rejected = len(drafts) - (len(generated) - 1)
            if request.num_computed_tokens > 0:
                request.num_computed_tokens -= num_rejected
            if request.num_output_placeholders > 0:
                # Async: the rejected drafts' placeholders are resolved too.
                request.num_output_placeholders -= num_rejected
        else:
            # <=0.11: empty output accepts -1 drafts and rolls back one token
            # more than was drafted; the last token is recomputed.
            request.num_computed_tokens -= len(drafts) - (len(generated) - 1)

    def _append_output_tokens(
        self, request: Request, generated: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        """Append sampled tokens one by one, stopping at the first stop (§5 step 4).

        Tokens after the stopping one are discarded, and (0.33)
        ``num_computed_tokens`` forgets them. Under async scheduling every
        returned token resolves one placeholder (0.32: only those kept, see
        ``resolve_trimmed_placeholders``). Stale output (§6) changes neither counter.
        """
        result, stopped = generated, False
        for i, token in enumerate(generated, 1):
            request.append_output_token_id(token)
            status = compute_stop_status(request, self.max_model_len, self.profile.stop_check_order)
            if status is not None:
                if self.profile.trim_computed_on_stop and not is_stale:
                    request.num_computed_tokens -= len(generated) - i
                request.transition(status)
                result, stopped = generated[:i], True
                break
        if not is_stale and request.num_output_placeholders > 0:
            resolved = generated if self.profile.resolve_trimmed_placeholders else result
            request.num_output_placeholders -= len(resolved)
            assert request.num_output_placeholders >= 0
        return result, stopped

    def _update_draft_token_ids(self, draft_token_ids: dict[str, tuple[int, ...]]) -> None:
        """Store the drafts proposed for the next step (§7 update_draft_token_ids).

        Finished requests are skipped; under 0.33, drafts after a prefill chunk
        are dropped (the chunk sampled nothing to draft from).
        """
        for request_id, drafts in draft_token_ids.items():
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if self.profile.ignore_drafts_for_prefill_chunks and request.is_prefill_chunk:
                request.spec_token_ids = []
                continue
            request.spec_token_ids = list(drafts)

    def _free_request(self, request: Request) -> None:
        """Forget a finished request: free its blocks, report its id next step."""
        assert request.is_finished
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    # ----------------------------------------------------------------- queries

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        """True while finished ids wait to be reported by the next schedule()."""
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        """True while there is work: an engine loop steps until this is False.

        After the last request finishes this stays True for one more, empty
        step, whose output carries the finished ids (§7).
        """
        return self.has_unfinished_requests() or self.has_finished_requests()

    def observe(self) -> dict[str, Any]:
        """Return the state a strict comparison looks at, in canonical form.

        Free queue front (evicted first) to back, block tables, queue orders,
        and each live request's counters.
        """
        return {
            "free_block_queue": [b.block_id for b in self.block_pool.free_block_queue],
            "num_free_blocks": self.block_pool.get_num_free_blocks(),
            "running": [r.request_id for r in self.running],
            "waiting": [r.request_id for r in self.waiting],
            "block_tables": {
                rid: [b.block_id for b in blocks] for rid, blocks in sorted(self.kv_cache_manager.req_to_blocks.items())
            },
            "requests": {
                rid: {
                    "status": r.status.value,
                    "num_computed_tokens": r.num_computed_tokens,
                    "num_tokens": r.num_tokens,
                    "num_output_tokens": r.num_output_tokens,
                }
                for rid, r in sorted(self.requests.items())
            },
        }
