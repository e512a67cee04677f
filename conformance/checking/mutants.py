"""Mutants: the reference model with one rule broken, re-creating real scheduler bugs.

The suite must prove its own power: every mutant here has to be killed by a
campaign (a differential divergence against the reference, or an invariant
violation when the mutant runs on its own). ``--sut mutant:<name>`` runs one as
a system under test. One exception, kept because it shows a gap:
``v0_watermark_ignored`` differs from the v0 model only when a pool of 100+
blocks (watermark ``int(0.01 * num_gpu_blocks)`` >= 1) is nearly full, which
the v0 generator never draws; a hand-made trace kills it
(tests/harness/test_mutants_v0.py).

Each mutant names the real bug family it re-creates. The v1 mutants subclass
``schedconf.spec.v1.scheduler.Scheduler``; the v0 ones (profile ``vllm-0.10``, names
``v0_*``) subclass ``schedconf.spec.v0.scheduler.Scheduler`` or its block manager and
re-create bugs of vLLM's legacy scheduler (``vllm/core/``).

The adapter registry (``conformance/adapters/__init__.py``) names
:func:`make_mutant_sut` by its path and imports this module only when a
``mutant:`` SUT is asked for; this module imports the registry, never the
other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.sut import SutUnsupported, refused_as_input_error
from schedconf.spec.v0.block_manager import AllocStatus, SelfAttnBlockSpaceManager
from schedconf.spec.v0.budget import PartialPrefillMetadata, SchedulingBudget
from schedconf.spec.v0.scheduler import Scheduler as V0Scheduler
from schedconf.spec.v0.scheduler import SchedulerPrefillOutputs, SchedulerRunningOutputs, SchedulerSwappedInOutputs
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.kv_cache import KVCacheManager, PrefixHit
from schedconf.spec.v1.request import Request
from schedconf.spec.v1.scheduler import Scheduler, _StepState


class _PriorityVictimMin(Scheduler):
    def select_victim(self) -> Request:
        if self.policy == "priority":
            return min(self.running, key=lambda r: r.victim_key)
        return super().select_victim()


class _FcfsVictimHead(Scheduler):
    def select_victim(self) -> Request:
        if self.policy == "fcfs":
            return self.running[0]
        return super().select_victim()


class _ComputedNotReset(Scheduler):
    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        computed = request.num_computed_tokens
        super()._preempt_request(request, drop_stale_output)
        request.num_computed_tokens = computed


class _BudgetNotRestored(Scheduler):
    def _remove_priority_victim(self, st: _StepState, victim: Request, req_index: int) -> int:
        budget = st.token_budget
        req_index = super()._remove_priority_victim(st, victim, req_index)
        st.token_budget = budget  # the victim's tokens are not given back
        return req_index


class _UncappedHitKV(KVCacheManager):
    def get_computed_blocks(self, request: Request) -> PrefixHit:
        if not self.enable_caching:
            return super().get_computed_blocks(request)
        blocks = []
        for block_hash in request.block_hashes[: request.num_tokens // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(blocks=blocks, num_tokens=len(blocks) * self.block_size)


class _HeadFirstFreeKV(KVCacheManager):
    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.pool.free_blocks(blocks)  # head first instead of tail first


def _with_kv(kv_class: type[KVCacheManager]) -> type[Scheduler]:
    class _Mutant(Scheduler):
        def __init__(self, config: SchedulerConfig, profile: object = "vllm-0.33") -> None:
            super().__init__(config, profile)  # type: ignore[arg-type]
            self.kv_cache_manager = kv_class(
                self.block_pool, config.block_size, config.max_model_len, config.enable_prefix_caching
            )

    return _Mutant


def _with_knobs(**knobs: object) -> type[Scheduler]:
    class _Mutant(Scheduler):
        def __init__(self, config: SchedulerConfig, profile: object = "vllm-0.33") -> None:
            super().__init__(config, profile)  # type: ignore[arg-type]
            self.profile = replace(self.profile, **knobs)  # type: ignore[arg-type]

    return _Mutant


class _NoFullSequenceGate(Scheduler):
    def __init__(self, config: SchedulerConfig, profile: object = "vllm-0.33") -> None:
        super().__init__(config, profile)  # type: ignore[arg-type]
        self.reserve_full_sequence = False


class _SkippedRequeueFlipped(Scheduler):
    def __init__(self, config: SchedulerConfig, profile: object = "vllm-0.33") -> None:
        super().__init__(config, profile)  # type: ignore[arg-type]
        flipped: Literal["preserve", "reverse"] = (
            "reverse" if self.profile.skipped_requeue_order == "preserve" else "preserve"
        )
        self.profile = replace(self.profile, skipped_requeue_order=flipped)


# ------------------------------------------------------------------ v0 mutants
# Bugs of vLLM's legacy scheduler (vllm/core/scheduler.py, block_manager.py),
# each a small edit of the v0 model in spec/v0/.


class _V0RecomputeKeepsComputed(V0Scheduler):
    """Recompute preemption frees the blocks but keeps the sequence's computed-token state."""

    def _preempt_by_recompute(self, sg: SequenceGroup) -> None:
        for seq in sg.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.WAITING
            self.free_seq(seq)
            # missing: seq.reset_state_for_recompute() (num_computed_tokens = 0, stage PREFILL)


class _V0SwappedBeforeRunning(V0Scheduler):
    """Swapped groups are resumed before the running groups are scheduled (both policies), even in a step that preempts."""

    def _schedule_running_then_swapped(
        self,
        budget: SchedulingBudget,
        enable_chunking: bool,
        ppm: PartialPrefillMetadata | None = None,
    ) -> tuple[SchedulerRunningOutputs, SchedulerSwappedInOutputs]:
        swapped_in = self._schedule_swapped(budget)
        running_scheduled = self._schedule_running(budget, enable_chunking=enable_chunking, ppm=ppm)
        return running_scheduled, swapped_in


class _V0PrefillWhileSwapped(V0Scheduler):
    """The default policy admits new prefills while groups are swapped out."""

    def _can_admit_prefills(self) -> bool:
        return True


class _V0IgnoredPrefillCharged(V0Scheduler):
    """A prompt finished as ignored keeps the token budget it was about to take."""

    _prefill_budget: SchedulingBudget | None = None

    def _schedule_prefills(
        self, budget: SchedulingBudget, enable_chunking: bool, ppm: PartialPrefillMetadata | None = None
    ) -> SchedulerPrefillOutputs:
        self._prefill_budget = budget
        try:
            return super()._schedule_prefills(budget, enable_chunking, ppm)
        finally:
            self._prefill_budget = None

    def _ignore(self, sg: SequenceGroup, ret: SchedulerPrefillOutputs) -> None:
        super()._ignore(sg, ret)
        budget = self._prefill_budget
        if budget is not None:  # charged, never given back (capped: the step's own assertion holds)
            budget.add_num_batched_tokens(sg.request_id, min(sg.get_len(), budget.remaining_token_budget()))


class _V0WatermarkIgnored(V0Scheduler):
    """Admissions and swap-ins may take the last free blocks: the watermark is 0."""

    def __init__(self, config: Any, profile: str = "vllm-0.10") -> None:
        super().__init__(config, profile)
        self.block_manager.watermark_blocks = 0


class _SwapInIgnoresUnseenTokens(SelfAttnBlockSpaceManager):
    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        # Before vLLM #8824: the blocks to move back (each counts 1), not the slot the unseen
        # (last sampled) token needs, which takes a new block when the last one is full.
        seqs = seq_group.get_seqs(SequenceStatus.SWAPPED)
        num_blocks = sum(len(self.block_tables[seq.seq_id].blocks) for seq in seqs)
        return self._decide(
            self.num_total_gpu_blocks,
            self.gpu_allocator.get_num_free_blocks(),
            num_blocks,
            self.watermark_blocks,
            never_if_below=False,
        )


class _V0SwapInIgnoresUnseenTokens(V0Scheduler):
    """``can_swap_in`` forgets the block the swapped group's unseen token needs."""

    def __init__(self, config: Any, profile: str = "vllm-0.10") -> None:
        super().__init__(config, profile)
        bm = self.block_manager
        self.block_manager = _SwapInIgnoresUnseenTokens(
            bm.block_size, bm.num_total_gpu_blocks, bm.num_total_cpu_blocks, bm.watermark_blocks, bm.enable_caching
        )


class _V0RunningTokensPrecharged(V0Scheduler):
    """The default policy charges the running decodes' tokens before it admits prefills."""

    def _new_budget(self) -> SchedulingBudget:
        budget = super()._new_budget()
        if not self.config.enable_chunked_prefill:
            for sg in self.running:
                budget.add_num_batched_tokens(sg.request_id, 1)
        return budget


class _MaxTokensSkipMissing(Scheduler):
    """Placeholders not counted against max_tokens: no skip for a request its in-flight steps finish."""

    def _is_sure_to_reach_max_tokens(self, request: Request) -> bool:
        return False


class _StaleOutputAppliedAsFresh(Scheduler):
    """A preemption does not mark the in-flight steps' output stale."""

    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        super()._preempt_request(request, drop_stale_output)
        request.num_stale_output_tokens = 0


class _StaleRequestResumedEarly(Scheduler):
    """The waiting loop resumes a preempted request while its stale output is still in flight."""

    def _schedule_waiting(self, st: _StepState, threshold: int) -> None:
        stale = {r: r.num_stale_output_tokens for r in self.waiting if r.num_stale_output_tokens}
        for r in stale:
            r.num_stale_output_tokens = 0  # invisible to the skip rule
        try:
            super()._schedule_waiting(st, threshold)
        finally:
            for r, n in stale.items():
                r.num_stale_output_tokens = n


class _PlaceholdersKeptOnPreempt(Scheduler):
    """A preemption keeps the request's output placeholders."""

    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        placeholders = request.num_output_placeholders
        super()._preempt_request(request, drop_stale_output)
        request.num_output_placeholders = placeholders


class _InFlightIdReused(Scheduler):
    """An id aborted while a step of it is in flight may be re-added at once."""

    def is_scheduled_in_flight(self, request_id: str) -> bool:
        return False


class _DraftsWithPlaceholdersPending(Scheduler):
    """Async + spec decode: drafts counted without the placeholders of the steps in flight."""

    def get_num_scheduled_spec_tokens(self, request: Request, num_new_tokens: int) -> int:
        return num_new_tokens + request.num_computed_tokens - request.num_tokens


class _DecodeStaggerIgnored(Scheduler):
    """V2 runner + pipeline parallelism: a request decodes again at once, not pipeline_parallel_size steps later."""

    def _schedule_running(self, st: _StepState, threshold: int) -> None:
        for request in self.running:
            request.next_decode_eligible_step = 0
        super()._schedule_running(st, threshold)


class _ThrottleIgnored(Scheduler):
    """schedule(throttle_prefills=True) holds no prefill back."""

    def is_prefill_deferred(self, throttle_prefills: bool) -> bool:
        return super().is_prefill_deferred(False)


class _CapacityEscapeMissing(Scheduler):
    """Prefill deferral keeps holding back though the last releasing step could not drain the waiting queue."""

    def is_prefill_deferred(self, throttle_prefills: bool) -> bool:
        self.prefill_capacity_bound = False
        return super().is_prefill_deferred(throttle_prefills)


@dataclass(frozen=True)
class Mutant:
    """A named broken model and the real bug it stands for."""

    name: str
    scheduler_class: type[Any]
    """A subclass of the profile's model: ``schedconf.spec.v1.scheduler.Scheduler`` (v1) or ``schedconf.spec.v0.scheduler.Scheduler``."""
    bug: str
    profile: str = "vllm-0.33"
    """The profile whose campaigns can reach the broken rule (``vllm-0.10``: the v0 model)."""


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "priority_victim_min",
            _PriorityVictimMin,
            "vLLM #41951 family: priority victim chosen with min instead of max",
        ),
        Mutant("fcfs_victim_head", _FcfsVictimHead, "FCFS victim taken from the head of running instead of the tail"),
        Mutant(
            "computed_not_reset_on_preempt",
            _ComputedNotReset,
            "vLLM #5349 family: num_computed_tokens not reset on preemption",
        ),
        Mutant(
            "budget_not_restored",
            _BudgetNotRestored,
            "vLLM #49097 family: budget not given back when a scheduled victim is preempted",
        ),
        Mutant(
            "prefix_hit_uncapped",
            _with_kv(_UncappedHitKV),
            "vLLM #11186/#17999: prefix hit not capped below num_tokens",
        ),
        Mutant(
            "skipped_requeue_reversed",
            _SkippedRequeueFlipped,
            "vLLM #32173: skipped waiting requests re-queued in the other order",
            profile="vllm-0.11",
        ),
        Mutant(
            "free_head_first", _with_kv(_HeadFirstFreeKV), "a request's blocks freed head first instead of tail first"
        ),
        Mutant("no_full_sequence_gate", _NoFullSequenceGate, "the full-sequence admission gate missing"),
        Mutant(
            "drafts_kept_after_preempt",
            _with_knobs(clear_drafts_on_preempt=False),
            "vLLM #31944: draft tokens kept after preemption",
        ),
        Mutant(
            "async_max_tokens_skip_missing",
            _MaxTokensSkipMissing,
            "async scheduling, placeholders not counted against max_tokens (the skip rule of vLLM's "
            "AsyncScheduler path): an extra step scheduled for a request its in-flight steps finish",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "stale_output_applied_as_fresh",
            _StaleOutputAppliedAsFresh,
            "async / PP: output of a step from before a preemption applied as fresh output (the stale-output "
            "handling of vLLM 0.33's _preempt_request missing)",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "stale_request_resumed_early",
            _StaleRequestResumedEarly,
            "async / PP: a preempted request resumed while its stale output is in flight, so that output "
            "lands on the resumed request (vLLM 0.33's waiting-loop skip missing)",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "placeholders_kept_on_preempt",
            _PlaceholdersKeptOnPreempt,
            "async: output placeholders not released when a request leaves running with a step in flight "
            "(preempted): the resumed request is given tokens for outputs that never come",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "async_drafts_with_placeholders_pending",
            _DraftsWithPlaceholdersPending,
            "async + spec decode: drafts scheduled for a request that has placeholders pending (the "
            "'- num_output_placeholders' term of vLLM's scheduled-draft count missing): a decode cut by the "
            "budget or the threshold is handed drafts its tokens do not reach",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "in_flight_id_reused",
            _InFlightIdReused,
            "async / PP: an id aborted while a step of it is in flight re-added at once; vLLM looks outputs "
            "up by id, so the new request would get the old one's tokens (refused by the model)",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "v0_recompute_keeps_computed",
            _V0RecomputeKeepsComputed,
            "vLLM #5349 (fixes #3032) family, v0: recompute preemption leaves the computed-token state "
            "(num_computed_tokens, stage) as it was",
            profile="vllm-0.10",
        ),
        Mutant(
            "decode_stagger_ignored",
            _DecodeStaggerIgnored,
            "vLLM 0.33 async_scheduler.py:51-56 undone: with the V2 runner and pipeline parallelism a request "
            "decodes before the workers' sampled-token ring has its previous token",
            profile="vllm-0.33-async",
        ),
        Mutant(
            "prefill_throttle_ignored",
            _ThrottleIgnored,
            "data-parallel prefill balancing lost (vLLM 0.33 scheduler.py:748-752): a throttled step admits prompts",
        ),
        Mutant(
            "prefill_capacity_escape_missing",
            _CapacityEscapeMissing,
            "the deferral's capacity escape lost (vLLM #44558 family): a backed-up engine holds prefill every "
            "throttled step and its waiting queue grows",
        ),
        Mutant(
            "v0_swapped_before_running",
            _V0SwappedBeforeRunning,
            "v0 step order (vLLM #3853 set it: running, swapped, new; #7874 reordered the running queue): "
            "swapped groups resumed before the running decodes, taking their blocks and budget",
            profile="vllm-0.10",
        ),
        Mutant(
            "v0_prefill_while_swapped",
            _V0PrefillWhileSwapped,
            "vLLM #5578 family, v0: new prefills admitted while groups are swapped out, filling the swap "
            "space (#5578 reports it of the chunked policy, which 0.10.2 keeps); here the default policy's "
            "guard dropped",
            profile="vllm-0.10",
        ),
        Mutant(
            "v0_ignored_prefill_charged",
            _V0IgnoredPrefillCharged,
            "v0, ignored groups leaving state behind (cf. vLLM #18957): the token budget of a prefill "
            "ignored over the prompt limit not released",
            profile="vllm-0.10",
        ),
        Mutant(
            "v0_running_tokens_precharged",
            _V0RunningTokensPrecharged,
            "vLLM #3550 regression, fixed by #3853, v0: running decodes' tokens charged before prefills are admitted",
            profile="vllm-0.10",
        ),
        Mutant(
            "v0_swap_in_ignores_unseen_tokens",
            _V0SwapInIgnoresUnseenTokens,
            "vLLM #8824, v0: can_swap_in ignores the unseen token's block, the swap-in then runs out of blocks",
            profile="vllm-0.10",
        ),
        Mutant(
            "v0_watermark_ignored",
            _V0WatermarkIgnored,
            "v0 watermark ignored (the rule of vLLM #255: new admissions and swap-ins keep watermark_blocks "
            "free); the generator never reaches it",
            profile="vllm-0.10",
        ),
    )
}


def get_mutant_names(kind: str) -> list[str]:
    """The names of the mutants of one scheduler kind (``"v1"`` or ``"v0"``, by their profile), sorted."""
    from schedconf.spec.schedulers import get_scheduler_kind

    return sorted(name for name, m in MUTANTS.items() if get_scheduler_kind(m.profile) == kind)


class MutantSut(ReferenceSut):
    """A mutant of the reference model as a system under test."""

    def __init__(self, mutant: Mutant) -> None:
        super().__init__()
        self.mutant = mutant
        self.name = f"mutant:{mutant.name}"

    def start(self, config: dict, profile: str) -> None:
        """The reference of the profile, then the mutant in its place; a trace of the other kind is unsupported."""
        from schedconf.spec.schedulers import get_scheduler_kind

        with refused_as_input_error():
            kind = get_scheduler_kind(profile)
        if kind != get_scheduler_kind(self.mutant.profile):
            raise SutUnsupported(
                f"mutant {self.mutant.name} is a {get_scheduler_kind(self.mutant.profile)} model; "
                f"profile {profile} runs the {kind} scheduler"
            )
        super().start(config, profile)
        assert self.scheduler is not None
        self.scheduler = self.mutant.scheduler_class(self.scheduler.config, profile)


def make_mutant_sut(name: str) -> MutantSut:
    """``mutant:<name>`` for the adapter registry."""
    key = name.removeprefix("mutant:")
    if key not in MUTANTS:
        raise UnknownSut(f"unknown mutant {key!r}; known: {', '.join(sorted(MUTANTS))}")
    return MutantSut(MUTANTS[key])


MutantFactory = Callable[[str], MutantSut]
