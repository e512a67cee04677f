"""The v0 scheduler of vLLM 0.10.2 (``vllm/core/scheduler.py``) for n = 1: a pure step machine.

The caller owns time and I/O: request ids, arrival times and sampled tokens
come in as arguments, and the logical clock is the number of ``schedule()``
calls so far (see README.md, "Logical clock"). One step is ``schedule()``
then exactly one ``update_from_output()``, as ``LLMEngine.step`` does without
async output processing; ``add_request`` and ``abort`` may come between any
two calls.

``schedule()`` dispatches to one of two policies:

* ``_schedule_default`` (chunked prefill off): new prefills first, and only
  if none was admitted, the running decodes (preempting the tail of
  ``running`` when blocks run short), then swapped groups if nobody was
  preempted. Prefill steps starve every decode; no prefill while any group
  is swapped.
* ``_schedule_chunked_prefill``: running decodes and prefill chunks first,
  then swapped groups (if nobody was preempted), then new prefills.

Function names are vLLM's, so that the symbolic encoding can cite them.
"""

# Size: one class, as vLLM 0.10.2's core/scheduler.py is: the running, swapped and waiting passes
# share one budget and their order is the rule.

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schedconf.spec.errors import EngineCrash, InvalidEvent, require
from schedconf.spec.output import ModelRunnerOutput, RequestOutput
from schedconf.spec.tokens import MAX_TOKEN_ID, is_arrival_time, is_token_id
from schedconf.spec.v0.block_allocator import NoFreeBlocksError
from schedconf.spec.v0.block_manager import AllocStatus, SelfAttnBlockSpaceManager
from schedconf.spec.v0.budget import PartialPrefillMetadata, SchedulingBudget
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.output import ScheduledSeqGroup, V0SchedulerOutput
from schedconf.spec.v0.profiles import get_v0_profile
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus, V0SamplingParams
from schedconf.spec.v0.stop import maybe_stop_sequence


@dataclass
class ScheduledSequenceGroup:
    """A group and the tokens it computes this step (1 for a decode)."""

    seq_group: SequenceGroup
    token_chunk_size: int


@dataclass
class SchedulerRunningOutputs:
    """What ``_schedule_running`` decided."""

    decode_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    prefill_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    swapped_out: list[SequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SchedulerSwappedInOutputs:
    """What ``_schedule_swapped`` decided."""

    decode_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    prefill_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    infeasible_seq_groups: list[SequenceGroup] = field(default_factory=list)


@dataclass
class SchedulerPrefillOutputs:
    """What ``_schedule_prefills`` decided."""

    seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    ignored_seq_groups: list[SequenceGroup] = field(default_factory=list)


@dataclass(frozen=True)
class PreemptionRecord:
    """One preemption: who needed room, the victim, and ``running`` (ids) just before the victim was taken."""

    requester_id: str
    victim_id: str
    kind: str  # "running" (_schedule_running) or "priority" (_schedule_priority_preemption)
    mode: str  # "recompute" or "swap"
    candidates: tuple[str, ...]


@dataclass
class StepRecord:
    """What the last ``schedule()`` did, for the invariants and the update."""

    output: V0SchedulerOutput
    groups: list[tuple[SequenceGroup, ScheduledSeqGroup]]
    ignored: list[SequenceGroup]
    preemptions: list[PreemptionRecord]
    num_uncached_tokens: int
    num_curr_seqs: int


class Scheduler:
    """The reference v0 scheduler for one config (profile ``vllm-0.10``)."""

    def __init__(self, config: V0SchedulerConfig, profile: str = "vllm-0.10") -> None:
        self.profile = get_v0_profile(profile)
        self.config = config
        self.block_manager = SelfAttnBlockSpaceManager(
            config.block_size,
            config.num_gpu_blocks,
            config.num_cpu_blocks,
            config.watermark_blocks,
            config.enable_prefix_caching,
        )
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self._finished_requests_ids: list[str] = []
        self.partial_prefill_budget_lookup_list = [config.max_num_batched_tokens] + [
            config.max_num_batched_tokens // i for i in range(1, config.max_num_partial_prefills + 1)
        ]
        self.seen_request_ids: set[str] = set()
        self.next_seq_id = 0
        self.current_step = 0
        self.num_cumulative_preemption = 0
        self.pending: StepRecord | None = None
        self.last_step: StepRecord | None = None
        self._preemptions: list[PreemptionRecord] = []
        self.crashed: str | None = None
        # Swapped groups ignored by can_swap_in NEVER: vLLM drops them without freeing their blocks.
        self.leaked_seq_groups: list[SequenceGroup] = []

    # ------------------------------------------------------------ engine life

    def _require_alive(self) -> None:
        if self.crashed is not None:
            raise EngineCrash(
                "engine_dead", f"the engine died at an earlier call ({self.crashed})", crashed=self.crashed
            )

    def _crash(self, exc: EngineCrash) -> EngineCrash:
        self.crashed = exc.code
        return exc

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
        """Queue a new group as WAITING at the tail of ``waiting`` (``add_seq_group``).

        Refused (InvalidEvent, nothing changed) as the v1 model refuses, except
        that a prompt of exactly ``max_model_len`` tokens is accepted: the v0
        engine (``LLMEngine._validate_model_input``) refuses only longer ones;
        and a priority other than 0 needs policy ``priority``
        (``LLMEngine.add_request``).
        """
        self._require_alive()
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
            self._find_live(request_id) is None,
            InvalidEvent,
            "duplicate_request_id",
            f"request {request_id!r} is already queued",
            request_id=request_id,
        )
        require(len(prompt) > 0, InvalidEvent, "empty_prompt", "the prompt has no tokens", request_id=request_id)
        require(
            len(prompt) <= self.config.max_model_len,
            InvalidEvent,
            "prompt_too_long",
            f"prompt of {len(prompt)} tokens is longer than max_model_len={self.config.max_model_len}",
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
        # LLMEngine.add_request: "Got priority ... but Priority scheduling is not enabled."
        require(
            priority == 0 or self.config.policy == "priority",
            InvalidEvent,
            "priority_without_priority_policy",
            "a priority other than 0 needs policy 'priority'",
            request_id=request_id,
            priority=priority,
        )
        require(
            is_arrival_time(arrival_time),
            InvalidEvent,
            "invalid_field_type",
            "arrival_time must be a finite number",
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
        group = SequenceGroup(
            request_id=request_id,
            seq_id=self.next_seq_id,
            prompt_token_ids=prompt,
            sampling_params=V0SamplingParams(max_tokens, min_tokens, eos_token_id, ignore_eos, stops),
            priority=priority,
            arrival_time=arrival_time,
        )
        self.next_seq_id += 1
        self.seen_request_ids.add(request_id)
        self.waiting.append(group)

    def _find_live(self, request_id: str) -> SequenceGroup | None:
        for queue in (self.waiting, self.running, self.swapped):
            for sg in queue:
                if sg.request_id == request_id:
                    return sg
        return None

    def abort(self, request_id: str) -> list[str]:
        """Abort a request (``abort_seq_group``); returns the ids aborted (none if it already finished).

        Raises InvalidEvent ``unknown_request_id`` for an id never added, and
        EngineCrash where vLLM crashes while freeing (README.md, "Engine crashes").
        """
        self._require_alive()
        require(
            request_id in self.seen_request_ids,
            InvalidEvent,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
            request_id=request_id,
        )
        try:
            return self.abort_seq_group([request_id])
        except EngineCrash as exc:
            raise self._crash(exc) from None

    def abort_seq_group(self, request_ids: list[str]) -> list[str]:
        """Remove matching groups from waiting, running, swapped (in that order) and free them."""
        wanted = set(request_ids)
        aborted: list[str] = []
        for queue in (self.waiting, self.running, self.swapped):
            matches = [sg for sg in queue if sg.request_id in wanted]
            for sg in matches:
                queue.remove(sg)
                self._finished_requests_ids.append(sg.request_id)
                aborted.append(sg.request_id)
                if not sg.is_finished():
                    sg.status = SequenceStatus.FINISHED_ABORTED
                    self.free_seq(sg)
        return aborted

    # --------------------------------------------------------------- schedule

    def schedule(self) -> V0SchedulerOutput:
        """Decide this step (``Scheduler.schedule``) and build the per-group metadata.

        The logical time ``now`` of this call is its 1-based index. Raises
        EngineCrash where vLLM's scheduler crashes (README.md).
        """
        self._require_alive()
        require(
            self.pending is None,
            InvalidEvent,
            "output_not_processed",
            f"schedule() called before update_from_output() for step {self.current_step}",
            step=self.current_step,
        )
        self.current_step += 1
        self._preemptions = []
        try:
            return self._schedule_and_build()
        except EngineCrash as exc:
            raise self._crash(exc) from None
        except NoFreeBlocksError:  # pragma: no cover - a vLLM crash we did not expect to reach
            raise self._crash(EngineCrash("engine_no_free_blocks", "vLLM's allocator ran out of blocks")) from None

    def _schedule_and_build(self) -> V0SchedulerOutput:
        now = self.current_step
        outputs, budget = self._schedule()
        groups: list[tuple[SequenceGroup, ScheduledSeqGroup]] = []
        for scheduled in outputs["scheduled_seq_groups"]:
            sg, chunk = scheduled.seq_group, scheduled.token_chunk_size
            block_table = self.block_manager.get_block_table(sg)
            self.block_manager.access_all_blocks_in_seq(sg, now)
            computed = self.block_manager.get_common_computed_block_ids(sg) if self.config.enable_prefix_caching else []
            is_prompt = sg.is_prefill()
            do_sample = not (is_prompt and chunk + sg.num_computed_tokens < sg.get_len())
            groups.append(
                (sg, ScheduledSeqGroup(sg.request_id, chunk, is_prompt, do_sample, tuple(block_table), tuple(computed)))
            )
        if groups:
            self.block_manager.mark_blocks_as_computed()
        output = V0SchedulerOutput(
            step=self.current_step,
            scheduled_seq_groups=tuple(g for _, g in groups),
            num_prefill_groups=outputs["num_prefill_groups"],
            num_batched_tokens=budget.num_batched_tokens + budget.num_cached_tokens,
            blocks_to_swap_in=tuple(outputs["blocks_to_swap_in"]),
            blocks_to_swap_out=tuple(outputs["blocks_to_swap_out"]),
            blocks_to_copy=tuple(outputs["blocks_to_copy"]),
            ignored_seq_groups=tuple(sg.request_id for sg in outputs["ignored_seq_groups"]),
            num_lookahead_slots=0,
            running_queue_size=len(self.running),
            preempted=outputs["preempted"],
            finished_requests_ids=tuple(self.get_and_reset_finished_requests_ids()),
        )
        record = StepRecord(
            output,
            groups,
            list(outputs["ignored_seq_groups"]),
            list(self._preemptions),
            budget.num_batched_tokens,
            budget.num_curr_seqs,
        )
        self.pending = self.last_step = record
        return output

    def _schedule(self) -> tuple[dict[str, Any], SchedulingBudget]:
        if self.config.enable_chunked_prefill:
            return self._schedule_chunked_prefill()
        return self._schedule_default()

    def _new_budget(self) -> SchedulingBudget:
        return SchedulingBudget(self.config.max_num_batched_tokens, self.config.max_num_seqs)

    def _schedule_default(self) -> tuple[dict[str, Any], SchedulingBudget]:
        """Prefills first; decodes (and swap-ins) only in a step without prefills."""
        budget = self._new_budget()
        # Pre-count the running groups' seats so prefills cannot overfill max_num_seqs.
        for sg in self.running:
            budget.add_num_seqs(sg.request_id, sg.get_max_num_running_seqs())
        prefills = SchedulerPrefillOutputs()
        running_scheduled = SchedulerRunningOutputs()
        swapped_in = SchedulerSwappedInOutputs()
        if self._can_admit_prefills():
            prefills = self._schedule_prefills(budget, enable_chunking=False)
        if not prefills.seq_groups and self.config.policy == "priority":
            self._schedule_priority_preemption(budget)
        if not prefills.seq_groups:
            running_scheduled, swapped_in = self._schedule_running_then_swapped(budget, enable_chunking=False)
        assert budget.num_batched_tokens <= self.config.max_num_batched_tokens
        assert budget.num_curr_seqs <= self.config.max_num_seqs
        self.waiting.extendleft(running_scheduled.preempted)
        self.running.extend(s.seq_group for s in prefills.seq_groups)
        self.running.extend(s.seq_group for s in running_scheduled.decode_seq_groups)
        self.running.extend(s.seq_group for s in swapped_in.decode_seq_groups)
        self.swapped.extend(running_scheduled.swapped_out)
        assert not running_scheduled.prefill_seq_groups and not swapped_in.prefill_seq_groups
        scheduled = [*prefills.seq_groups, *running_scheduled.decode_seq_groups, *swapped_in.decode_seq_groups]
        return {
            "scheduled_seq_groups": scheduled,
            "num_prefill_groups": len(prefills.seq_groups),
            "blocks_to_swap_in": swapped_in.blocks_to_swap_in,
            "blocks_to_swap_out": running_scheduled.blocks_to_swap_out,
            "blocks_to_copy": running_scheduled.blocks_to_copy + swapped_in.blocks_to_copy,
            "ignored_seq_groups": prefills.ignored_seq_groups + swapped_in.infeasible_seq_groups,
            "preempted": len(running_scheduled.preempted) + len(running_scheduled.swapped_out),
        }, budget

    def _can_admit_prefills(self) -> bool:
        """``_schedule_default``'s guard: no new prefill while any group is swapped out."""
        return not self.swapped

    def _schedule_running_then_swapped(
        self,
        budget: SchedulingBudget,
        enable_chunking: bool,
        ppm: PartialPrefillMetadata | None = None,
    ) -> tuple[SchedulerRunningOutputs, SchedulerSwappedInOutputs]:
        """Both policies: the running groups first, then swap-ins, only in a step that preempted nobody."""
        running_scheduled = self._schedule_running(budget, enable_chunking=enable_chunking, ppm=ppm)
        swapped_in = SchedulerSwappedInOutputs()
        if not running_scheduled.preempted and not running_scheduled.swapped_out:
            swapped_in = self._schedule_swapped(budget)
        return running_scheduled, swapped_in

    def _schedule_chunked_prefill(self) -> tuple[dict[str, Any], SchedulingBudget]:
        """Running (decodes and prefill chunks) first, then swapped, then new prefills."""
        budget = self._new_budget()
        ppm = PartialPrefillMetadata.from_queues(list(self.running), list(self.waiting), self.config)
        running_scheduled, swapped_in = self._schedule_running_then_swapped(budget, enable_chunking=True, ppm=ppm)
        prefills = self._schedule_prefills(budget, enable_chunking=True, ppm=ppm)
        assert budget.num_batched_tokens <= self.config.max_num_batched_tokens
        assert budget.num_curr_seqs <= self.config.max_num_seqs
        self.waiting.extendleft(running_scheduled.preempted)
        self.running.extend(s.seq_group for s in swapped_in.decode_seq_groups)
        self.running.extend(s.seq_group for s in swapped_in.prefill_seq_groups)
        self.running.extend(s.seq_group for s in running_scheduled.decode_seq_groups)
        self.running.extend(self._order_finishing_prefills_first(running_scheduled.prefill_seq_groups))
        self.running.extend(s.seq_group for s in prefills.seq_groups)
        self.swapped.extend(running_scheduled.swapped_out)
        scheduled = [
            *prefills.seq_groups,
            *running_scheduled.prefill_seq_groups,
            *swapped_in.prefill_seq_groups,
            *running_scheduled.decode_seq_groups,
            *swapped_in.decode_seq_groups,
        ]
        num_prefill_groups = (
            len(prefills.seq_groups) + len(swapped_in.prefill_seq_groups) + len(running_scheduled.prefill_seq_groups)
        )
        return {
            "scheduled_seq_groups": scheduled,
            "num_prefill_groups": num_prefill_groups,
            "blocks_to_swap_in": swapped_in.blocks_to_swap_in,
            "blocks_to_swap_out": running_scheduled.blocks_to_swap_out,
            "blocks_to_copy": running_scheduled.blocks_to_copy + swapped_in.blocks_to_copy,
            "ignored_seq_groups": prefills.ignored_seq_groups + swapped_in.infeasible_seq_groups,
            "preempted": len(running_scheduled.preempted) + len(running_scheduled.swapped_out),
        }, budget

    @staticmethod
    def _order_finishing_prefills_first(scheduled: list[ScheduledSequenceGroup]) -> list[SequenceGroup]:
        """Prefill chunks that finish their prompt this step, then the others."""
        finishing = [s.seq_group for s in scheduled if s.seq_group.get_num_uncomputed_tokens() == s.token_chunk_size]
        others = [s.seq_group for s in scheduled if s.seq_group.get_num_uncomputed_tokens() != s.token_chunk_size]
        return finishing + others

    # ------------------------------------------------------------- the loops

    def _schedule_running(
        self, budget: SchedulingBudget, enable_chunking: bool, ppm: PartialPrefillMetadata | None = None
    ) -> SchedulerRunningOutputs:
        """Walk ``running`` front to back; preempt from the tail when blocks run short."""
        ret = SchedulerRunningOutputs()
        queue = self.running
        while queue:
            sg = queue[0]
            num_running_tokens, _ = self._get_num_new_uncached_and_cached_tokens(
                sg, SequenceStatus.RUNNING, enable_chunking, budget, ppm
            )
            if num_running_tokens == 0:
                break  # no budget left: stop the whole loop
            queue.popleft()
            while not self.block_manager.can_append_slots(sg):
                budget.subtract_num_batched_tokens(sg.request_id, num_running_tokens)
                budget.subtract_num_seqs(sg.request_id, sg.get_max_num_running_seqs())
                candidates = tuple(g.request_id for g in queue)
                if queue:
                    victim, cont_loop = queue.pop(), True  # the tail: lowest priority
                else:
                    victim, cont_loop = sg, False  # nobody left: preempt itself
                mode = self._preempt(victim, ret.blocks_to_swap_out)
                self._preemptions.append(
                    PreemptionRecord(sg.request_id, victim.request_id, "running", mode, candidates)
                )
                (ret.preempted if mode == "recompute" else ret.swapped_out).append(victim)
                if not cont_loop:
                    break
            else:
                self._append_slots(sg, ret.blocks_to_copy)
                if sg.is_prefill():
                    ret.prefill_seq_groups.append(ScheduledSequenceGroup(sg, num_running_tokens))
                else:
                    ret.decode_seq_groups.append(ScheduledSequenceGroup(sg, 1))
                budget.add_num_batched_tokens(sg.request_id, num_running_tokens)
                if enable_chunking:
                    budget.add_num_seqs(sg.request_id, sg.get_max_num_running_seqs())
        return ret

    def _schedule_swapped(self, budget: SchedulingBudget) -> SchedulerSwappedInOutputs:
        """Swap groups back in from the head of ``swapped`` while blocks, tokens and seats last.

        vLLM calls it without chunking in both policies.
        """
        ret = SchedulerSwappedInOutputs()
        queue = self.swapped
        while queue:
            sg = queue[0]
            is_prefill = sg.is_prefill()
            status = self.block_manager.can_swap_in(sg)
            if status is AllocStatus.LATER:
                break
            if status is AllocStatus.NEVER:
                sg.status = SequenceStatus.FINISHED_IGNORED
                # vLLM never frees an infeasible swapped group: its CPU blocks leak.
                self.leaked_seq_groups.append(sg)
                ret.infeasible_seq_groups.append(sg)
                queue.popleft()
                continue
            num_new_seqs = sg.get_max_num_running_seqs()
            uncached, cached = self._get_num_new_uncached_and_cached_tokens(sg, SequenceStatus.SWAPPED, False, budget)
            if uncached == 0 or not budget.can_schedule(uncached, num_new_seqs):
                self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.SWAPPED)
                break
            queue.popleft()
            self._swap_in(sg, ret.blocks_to_swap_in)
            self._append_slots(sg, ret.blocks_to_copy)
            if is_prefill:
                ret.prefill_seq_groups.append(ScheduledSequenceGroup(sg, uncached + cached))
            else:
                ret.decode_seq_groups.append(ScheduledSequenceGroup(sg, 1))
            budget.add_num_batched_tokens(sg.request_id, uncached, cached)
            budget.add_num_seqs(sg.request_id, num_new_seqs)
        return ret

    def _get_prompt_limit(self) -> int:
        """``max_model_len`` with chunked prefill, else ``min(max_model_len, max_num_batched_tokens)``."""
        if self.config.enable_chunked_prefill:
            return self.config.max_model_len
        return min(self.config.max_model_len, self.config.max_num_batched_tokens)

    def _schedule_prefills(
        self, budget: SchedulingBudget, enable_chunking: bool, ppm: PartialPrefillMetadata | None = None
    ) -> SchedulerPrefillOutputs:
        """Admit groups from the head of ``waiting`` while budget, seats and blocks last."""
        ret = SchedulerPrefillOutputs()
        if budget.remaining_token_budget() == 0:
            return ret
        queue = self.waiting
        leftover: deque[SequenceGroup] = deque()
        while queue:
            sg = queue[0]
            waiting_seqs = sg.get_seqs(SequenceStatus.WAITING)
            if len(waiting_seqs) != 1:
                raise EngineCrash(
                    "engine_swapped_group_in_waiting",
                    "vLLM asserts that a waiting group has one WAITING sequence; priority "
                    "preemption in swap mode put a SWAPPED group into waiting",
                    request_id=sg.request_id,
                )
            if ppm is not None and not ppm.can_schedule(sg):
                leftover.appendleft(sg)
                queue.popleft()
                continue
            uncached, cached = self._get_num_new_uncached_and_cached_tokens(
                sg, SequenceStatus.WAITING, enable_chunking, budget, ppm
            )
            num_new_tokens = uncached + cached
            if not enable_chunking:
                assert num_new_tokens == sg.get_len()
            if num_new_tokens > self._get_prompt_limit():
                self._ignore(sg, ret)
                continue
            status = self.block_manager.can_allocate(sg)
            if status is AllocStatus.LATER:
                self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.WAITING)
                break
            if status is AllocStatus.NEVER:
                self._ignore(sg, ret)
                continue
            if budget.num_batched_tokens >= self.config.max_num_batched_tokens:
                self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.WAITING)
                break
            num_new_seqs = sg.get_max_num_running_seqs()
            if uncached == 0 or not budget.can_schedule(uncached, num_new_seqs):
                self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.WAITING)
                break
            queue.popleft()
            self._allocate_and_set_running(sg)
            if ppm is not None:
                ppm.maybe_increment_partial_prefills(sg)
            ret.seq_groups.append(ScheduledSequenceGroup(sg, num_new_tokens))
            budget.add_num_batched_tokens(sg.request_id, uncached, cached)
            budget.add_num_seqs(sg.request_id, num_new_seqs)
        queue.extendleft(leftover)
        return ret

    def _ignore(self, sg: SequenceGroup, ret: SchedulerPrefillOutputs) -> None:
        """FINISHED_IGNORED: a prompt over the limit, or one the GPU pool can NEVER hold."""
        sg.status = SequenceStatus.FINISHED_IGNORED
        self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.FINISHED_IGNORED)
        ret.ignored_seq_groups.append(sg)
        self.waiting.popleft()

    def _schedule_priority_preemption(self, budget: SchedulingBudget) -> int:
        """Sort running and waiting by priority; preempt running groups worse than the waiting head.

        The head examined is ``waiting[0]`` BEFORE sorting (FCFS order of
        arrival into waiting); the queues are re-sorted at the end.
        """
        running_queue = deque(sorted(self.running, key=SequenceGroup.get_priority))
        swap_out_discarded: list[tuple[int, int]] = []  # vLLM drops these mappings
        count = 0
        if self.waiting:
            sg = self.waiting.popleft()
            num_new_seqs = sg.get_max_num_running_seqs()
            uncached, _ = self._get_num_new_uncached_and_cached_tokens(sg, SequenceStatus.WAITING, False, budget)
            while running_queue and running_queue[-1].get_priority() > sg.get_priority():
                if not sg.get_seqs(SequenceStatus.WAITING):
                    raise EngineCrash(
                        "engine_swapped_group_in_waiting",
                        "vLLM's can_allocate indexes the WAITING sequences of a SWAPPED group "
                        "that priority preemption put into waiting",
                        request_id=sg.request_id,
                    )
                if (
                    uncached > 0
                    and self.block_manager.can_allocate(sg) is AllocStatus.OK
                    and budget.can_schedule(uncached, num_new_seqs)
                ):
                    break
                candidates = tuple(g.request_id for g in running_queue)
                victim = running_queue.pop()
                victim_tokens, _ = self._get_num_new_uncached_and_cached_tokens(
                    victim, SequenceStatus.RUNNING, False, budget
                )
                budget.subtract_num_batched_tokens(victim.request_id, victim_tokens)
                budget.subtract_num_seqs(victim.request_id, victim.get_max_num_running_seqs())
                mode = self._preempt(victim, swap_out_discarded)
                self._preemptions.append(
                    PreemptionRecord(sg.request_id, victim.request_id, "priority", mode, candidates)
                )
                self.waiting.appendleft(victim)
                count += 1
            self.waiting.appendleft(sg)
            self.remove_seq_from_computed_blocks_tracker(sg, SequenceStatus.WAITING)
        self.waiting = deque(sorted(self.waiting, key=SequenceGroup.get_priority))
        self.running = running_queue
        return count

    # ------------------------------------------------------------ token counts

    def _get_num_new_uncached_and_cached_tokens(
        self,
        sg: SequenceGroup,
        status: SequenceStatus,
        enable_chunking: bool,
        budget: SchedulingBudget,
        ppm: PartialPrefillMetadata | None = None,
    ) -> tuple[int, int]:
        """(uncached, cached) tokens to schedule; a full prefix hit still recomputes one token."""
        uncached = cached = 0
        seqs = sg.get_seqs(status)
        for seq in seqs:
            if not seq.is_prefill():
                uncached += 1
                continue
            all_new = seq.get_len() - seq.num_computed_tokens
            if not self.config.enable_prefix_caching:
                uncached += all_new
                continue
            num_cached_seq = self.block_manager.get_num_cached_tokens(seq)
            if num_cached_seq < seq.num_computed_tokens and not (
                seq.is_prefill() and seq.status is SequenceStatus.RUNNING and self.config.enable_chunked_prefill
            ):
                # vLLM's sanity assertion: only a running chunked prefill may have computed past its cached count.
                raise EngineCrash(
                    "engine_cached_below_computed",
                    "vLLM asserts that a sequence has no fewer cached than computed tokens unless it "
                    "is a running chunked prefill (a prefill chunk swapped out trips it)",
                    request_id=seq.request_id,
                )
            cached_new = max(0, num_cached_seq - seq.num_computed_tokens)
            uncached += all_new - cached_new
            cached += cached_new
        if uncached == 0 and cached > 0:
            uncached, cached = 1, cached - 1
        if enable_chunking and len(seqs) == 1:
            uncached = self._chunk_new_tokens_to_schedule(budget, uncached, ppm)
        return uncached, cached

    def _chunk_new_tokens_to_schedule(
        self, budget: SchedulingBudget, num_new_tokens: int, ppm: PartialPrefillMetadata | None
    ) -> int:
        """Cut to the remaining budget and the prefill slot (block-aligned with prefix caching)."""
        remaining = budget.remaining_token_budget()
        slot = remaining if ppm is None else self.partial_prefill_budget_lookup_list[ppm.schedulable_prefills]
        if self.config.enable_prefix_caching:
            bs = self.config.block_size
            remaining = (min(remaining, slot) // bs) * bs
        return min(num_new_tokens, remaining, slot)

    # ------------------------------------------------------ state transitions

    def _allocate_and_set_running(self, sg: SequenceGroup) -> None:
        self.block_manager.allocate(sg)
        sg.status = SequenceStatus.RUNNING

    def _append_slots(self, sg: SequenceGroup, blocks_to_copy: list[tuple[int, int]]) -> None:
        for seq in sg.get_seqs(SequenceStatus.RUNNING):
            blocks_to_copy.extend(self.block_manager.append_slots(seq))

    def _preempt(self, sg: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]) -> str:
        """Recompute unless the user asked for swap (n = 1: vLLM's own rule picks recompute)."""
        user = self.config.preemption_mode
        if user is None:
            mode = "recompute" if sg.get_max_num_running_seqs() == 1 else "swap"
        else:
            mode = "swap" if user == "swap" else "recompute"
        self.num_cumulative_preemption += 1
        if mode == "recompute":
            self._preempt_by_recompute(sg)
        else:
            self._swap_out(sg, blocks_to_swap_out)
        return mode

    def _preempt_by_recompute(self, sg: SequenceGroup) -> None:
        seqs = sg.get_seqs(SequenceStatus.RUNNING)
        assert len(seqs) == 1
        for seq in seqs:
            seq.status = SequenceStatus.WAITING
            self.free_seq(seq)
            seq.reset_state_for_recompute()

    def _swap_out(self, sg: SequenceGroup, blocks_to_swap_out: list[tuple[int, int]]) -> None:
        if not self.block_manager.can_swap_out(sg):
            raise EngineCrash(
                "engine_swap_space_exhausted",
                "Aborted due to the lack of CPU swap space (vLLM raises RuntimeError)",
                request_id=sg.request_id,
            )
        blocks_to_swap_out.extend(self.block_manager.swap_out(sg))
        for seq in sg.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED

    def _swap_in(self, sg: SequenceGroup, blocks_to_swap_in: list[tuple[int, int]]) -> None:
        blocks_to_swap_in.extend(self.block_manager.swap_in(sg))
        for seq in sg.get_seqs(SequenceStatus.SWAPPED):
            seq.status = SequenceStatus.RUNNING

    def free_seq(self, seq: SequenceGroup) -> None:
        self.block_manager.free(seq)

    def remove_seq_from_computed_blocks_tracker(self, sg: SequenceGroup, status: SequenceStatus | None) -> None:
        for seq in sg.get_seqs(status):
            self.block_manager.remove_seq_from_computed_blocks_tracker(seq)

    def free_finished_seq_groups(self) -> None:
        """Drop finished groups from ``running`` (in its order), report and free them."""
        remaining: deque[SequenceGroup] = deque()
        for sg in self.running:
            if sg.is_finished():
                self._finished_requests_ids.append(sg.request_id)
                self.free_seq(sg)
            else:
                remaining.append(sg)
        self.running = remaining

    def get_and_reset_finished_requests_ids(self) -> list[str]:
        ids, self._finished_requests_ids = self._finished_requests_ids, []
        return ids

    # ------------------------------------------------------------------ update

    def update_from_output(
        self, scheduler_output: V0SchedulerOutput, model_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        """Apply the model output as ``LLMEngine._process_model_outputs`` does (no async).

        Per scheduled group in order (groups aborted since the schedule are
        skipped): count ``token_chunk_size`` computed tokens, append the
        sampled token if the group samples, run the stop checker, free the
        sequence if it finished; then ``free_finished_seq_groups()``. Returns
        one output per group that sampled (scheduled order), then one per
        group ignored by the step (finish_reason ``length``, no tokens).
        """
        self._require_alive()
        record = self.pending
        require(
            record is not None and scheduler_output is record.output,
            InvalidEvent,
            "unexpected_model_output",
            "update_from_output() needs the output of the last schedule() call, once",
            step=self.current_step,
        )
        assert record is not None
        self._validate_model_output(record, model_output)
        self.pending = None
        outputs: list[RequestOutput] = []
        finished_now = False
        try:
            for sg, meta in record.groups:
                if sg.is_finished():
                    continue
                sg.update_num_computed_tokens(meta.token_chunk_size)
                if not meta.do_sample:
                    continue
                token = model_output.sampled_token_ids[sg.request_id][0]
                sg.append_token_id(token)
                maybe_stop_sequence(sg, self.config.max_model_len)
                if sg.is_finished():
                    self.free_seq(sg)
                    finished_now = True
                outputs.append(RequestOutput(sg.request_id, (token,), sg.status.finish_reason, sg.stop_reason))
            if finished_now:
                self.free_finished_seq_groups()
        except EngineCrash as exc:  # pragma: no cover - freeing a finished running group never crashes
            raise self._crash(exc) from None
        for sg in record.ignored:
            outputs.append(RequestOutput(sg.request_id, (), sg.status.finish_reason, None))
        return outputs

    def _validate_model_output(self, record: StepRecord, model_output: ModelRunnerOutput) -> None:
        """One sampled token per live sampling group, none for anybody else; no drafts."""
        for request_id in model_output.draft_token_ids:
            raise InvalidEvent(
                "drafts_without_spec_decode", "the v0 model has no speculative decoding", request_id=request_id
            )
        by_id = {meta.request_id: (sg, meta) for sg, meta in record.groups}
        for request_id, tokens in model_output.sampled_token_ids.items():
            entry = by_id.get(request_id)
            require(
                entry is not None and entry[1].do_sample,
                InvalidEvent,
                "unscheduled_model_output",
                f"sampled tokens for {request_id!r}, which was not scheduled to sample this step",
                request_id=request_id,
                step=record.output.step,
            )
            require(
                len(tokens) <= 1,
                InvalidEvent,
                "bad_num_sampled_tokens",
                f"request {request_id!r} samples one token per step, got {len(tokens)}",
                request_id=request_id,
                step=record.output.step,
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
        for sg, meta in record.groups:
            if meta.do_sample and not sg.is_finished():
                got = len(model_output.sampled_token_ids.get(meta.request_id, ()))
                require(
                    got == 1,
                    InvalidEvent,
                    "bad_num_sampled_tokens",
                    f"request {meta.request_id!r} samples this step and needs exactly 1 token, got {got}",
                    request_id=meta.request_id,
                    step=record.output.step,
                )

    # ----------------------------------------------------------------- queries

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def has_unfinished_seqs(self) -> bool:
        return self.get_num_unfinished_seq_groups() > 0

    def has_unfinished_requests(self) -> bool:
        """``LLMEngine.has_unfinished_requests``: any group waiting, running or swapped."""
        return self.has_unfinished_seqs()

    def has_requests(self) -> bool:
        """True while an engine loop should step: unfinished groups, or finished ids not yet reported."""
        return self.has_unfinished_seqs() or bool(self._finished_requests_ids)

    def observe(self) -> dict[str, Any]:
        """The v0 observation of the contract: free blocks and block tables (CPU ids relative)."""
        bm = self.block_manager
        offset = self.config.num_gpu_blocks
        gpu_tables: dict[str, list[int]] = {}
        cpu_tables: dict[str, list[int]] = {}
        for queue in (self.waiting, self.running, self.swapped):
            for sg in queue:
                table = bm.block_tables.get(sg.seq_id)
                if table is None:
                    continue
                ids = table.physical_block_ids
                if ids and ids[0] >= offset:
                    cpu_tables[sg.request_id] = [b - offset for b in ids]
                else:
                    gpu_tables[sg.request_id] = list(ids)
        return {
            "num_free_gpu_blocks": bm.get_num_free_gpu_blocks(),
            "num_free_cpu_blocks": bm.get_num_free_cpu_blocks(),
            "block_tables": dict(sorted(gpu_tables.items())),
            "cpu_block_tables": dict(sorted(cpu_tables.items())),
        }

    def get_evictor_order(self) -> list[int] | None:
        """GPU blocks in eviction order (prefix caching), None without prefix caching."""
        allocator = self.block_manager.gpu_allocator
        evictor = getattr(allocator, "evictor", None)
        return None if evictor is None else evictor.get_eviction_order()

    def get_queues(self) -> dict[str, Any]:
        """Queue orders and per-group counters (golden files, debugging)."""

        def describe(sg: SequenceGroup) -> dict[str, Any]:
            return {
                "status": sg.status.name,
                "stage": sg.stage.name,
                "num_computed_tokens": sg.num_computed_tokens,
                "len": sg.get_len(),
                "outputs": sg.get_output_len(),
            }

        return {
            "waiting": [sg.request_id for sg in self.waiting],
            "running": [sg.request_id for sg in self.running],
            "swapped": [sg.request_id for sg in self.swapped],
            "groups": {sg.request_id: describe(sg) for q in (self.waiting, self.running, self.swapped) for sg in q},
        }
