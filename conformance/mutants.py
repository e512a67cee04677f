"""Mutants: the reference model with one rule broken, re-creating real scheduler bugs.

The suite must prove its own power: every mutant here has to be killed by a
campaign (a differential divergence against the reference, or an invariant
violation when the mutant runs on its own). ``--sut mutant:<name>`` runs one as
a system under test.

Each mutant names the real bug family it re-creates.

The adapter registry (``conformance/adapters/__init__.py``) names
:func:`make_mutant_sut` by its path and imports this module only when a
``mutant:`` SUT is asked for; this module imports the registry, never the
other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from conformance.adapters import UnknownSut
from conformance.adapters.reference import ReferenceSut
from spec.config import SchedulerConfig
from spec.kv_cache import KVCacheManager, PrefixHit
from spec.request import Request
from spec.scheduler import Scheduler, _StepState


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
    def _preempt_request(self, request: Request) -> None:
        computed = request.num_computed_tokens
        super()._preempt_request(request)
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
            self.kv_cache_manager = kv_class(self.block_pool, config.block_size, config.max_model_len,
                                             config.enable_prefix_caching)
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
        flipped = "reverse" if self.profile.skipped_requeue_order == "preserve" else "preserve"
        self.profile = replace(self.profile, skipped_requeue_order=flipped)


@dataclass(frozen=True)
class Mutant:
    """A named broken model and the real bug it stands for."""

    name: str
    scheduler_class: type[Scheduler]
    bug: str
    profile: str = "vllm-0.33"
    """The profile whose campaigns can reach the broken rule."""


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("priority_victim_min", _PriorityVictimMin,
               "vLLM #41951 family: priority victim chosen with min instead of max"),
        Mutant("fcfs_victim_head", _FcfsVictimHead,
               "FCFS victim taken from the head of running instead of the tail"),
        Mutant("computed_not_reset_on_preempt", _ComputedNotReset,
               "vLLM #5349 family: num_computed_tokens not reset on preemption"),
        Mutant("budget_not_restored", _BudgetNotRestored,
               "vLLM #49097 family: budget not given back when a scheduled victim is preempted"),
        Mutant("prefix_hit_uncapped", _with_kv(_UncappedHitKV),
               "vLLM #11186/#17999: prefix hit not capped below num_tokens"),
        Mutant("skipped_requeue_reversed", _SkippedRequeueFlipped,
               "vLLM #32173: skipped waiting requests re-queued in the other order", profile="vllm-0.11"),
        Mutant("free_head_first", _with_kv(_HeadFirstFreeKV),
               "a request's blocks freed head first instead of tail first"),
        Mutant("no_full_sequence_gate", _NoFullSequenceGate,
               "the full-sequence admission gate missing"),
        Mutant("drafts_kept_after_preempt", _with_knobs(clear_drafts_on_preempt=False),
               "vLLM #31944: draft tokens kept after preemption"),
    )
}


class MutantSut(ReferenceSut):
    """A mutant of the reference model as a system under test."""

    def __init__(self, mutant: Mutant) -> None:
        super().__init__()
        self.mutant = mutant
        self.name = f"mutant:{mutant.name}"

    def start(self, config: dict, profile: str) -> None:
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
