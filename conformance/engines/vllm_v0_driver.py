"""Serve vLLM 0.10.2's legacy v0 ``Scheduler`` over the schedconf JSON-lines protocol.

Runs INSIDE the environment built by ``schedconf env vllm 0.10.2``
(``.venvs/vllm-0.10.2``), as ``<venv python> -m schedconf.conformance.engines.vllm_v0_driver``
with the repository root on ``PYTHONPATH`` (``schedconf.conformance.adapters.vllm_v0``
starts it). It imports the standard library, vLLM and
``schedconf.conformance.engines.protocol_checks`` / ``schedconf.conformance.protocol_server``;
never ``spec/``. What it answers is the canonical v0 output of
``spec/v0`` (trace schema ``$defs/v0_scheduler_output``).

Everything that decides is vLLM's own code: ``vllm.core.scheduler.Scheduler``
(with its ``SelfAttnBlockSpaceManager``), ``Sequence`` / ``SequenceGroup``,
``SamplingParams``, the engine's ``SingleStepOutputProcessor`` with its
``StopChecker``. The driver only plays ``LLMEngine``'s part around them
(``engine/llm_engine.py``: ``add_request``, ``step``,
``_process_model_outputs``, ``abort_request``), with the model's sampled
tokens coming from the protocol's ``update``.

``init``
    Profile ``vllm-0.10`` only (``unsupported`` otherwise). The v0 config is
    refused with the protocol's codes in the model's order
    (``spec/v0/config.py``: field set, types, ranges, then vLLM's own
    ``SchedulerConfig._verify_args`` rules and the worker's
    ``raise_if_cache_size_invalid``). Then vLLM's ``SchedulerConfig``
    (``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``enable_chunked_prefill``, ``policy``, ``preemption_mode``, the three
    partial-prefill knobs; a ``ValueError`` of vLLM's that the checks above
    did not foresee is ``unsupported`` with vLLM's words) and ``CacheConfig``
    (``block_size``, ``enable_prefix_caching``; ``num_gpu_blocks`` and
    ``num_cpu_blocks`` set directly, as the engine does after profiling), and
    ``Scheduler(scheduler_config, cache_config, lora_config=None)``. Every
    knob is read back from the built scheduler.
``add_request``
    ``LLMEngine.add_request`` refuses ``priority != 0`` without the priority
    policy and a prompt longer than ``max_model_len`` (``_validate_model_input``:
    strictly longer; a prompt of exactly ``max_model_len`` tokens is accepted
    and the scheduler decides). The protocol's own refusals
    (``protocol_checks.validate_add_request``) come first. Then one
    ``Sequence(seq_id, token_inputs(prompt), block_size, eos_token_id)`` (the
    trace's EOS is the sequence's, as the engine takes the model's), a
    ``SamplingParams(max_tokens, min_tokens, stop_token_ids, ignore_eos)``
    completed by ``update_from_generation_config({}, eos)`` as the engine does,
    and a ``SequenceGroup`` with the trace's ``arrival_time`` and ``priority``,
    given to ``Scheduler.add_seq_group``. Sequence ids count from 0 per ``init``.
    No ``request_id_in_flight``: the engine's update follows the scheduled
    group objects, so an id aborted in the pending step may be added again.
``abort``
    ``Scheduler.abort_seq_group(id)`` (what ``LLMEngine.abort_request`` does);
    an id never added is ``unknown_request_id``; a finished one is a no-op, as
    in vLLM.
``schedule``
    ``Scheduler.schedule()`` then ``get_and_reset_finished_requests_ids()``
    (``LLMEngine.step``'s order), rendered from ``SchedulerOutputs`` and the
    ``SequenceGroupMetadata`` list.
``update``
    Validated with the protocol's codes (one sampled token for each scheduled
    group with ``do_sample`` that is still unfinished, none for any other
    group, no drafts), then ``LLMEngine._process_model_outputs`` for one step
    without async output processing: for each scheduled group in order, skip
    it if already finished (aborted after ``schedule``); else
    ``update_num_computed_tokens(token_chunk_size)`` and, iff ``do_sample``,
    the engine's ``SingleStepOutputProcessor.process_outputs`` (append the
    token, vLLM's ``StopChecker``, ``free_seq`` of a finished sequence); then
    ``free_finished_seq_groups()`` if any group finished. Request outputs:
    one per group that sampled, in scheduled order, then one per group this
    step ignored (``finish_reason`` ``length``, no tokens; the engine emits a
    ``RequestOutput`` for each, after the scheduled ones). That is the
    canonical order of ``spec/v0`` (README.md, "Canonical outputs"):
    ``LLMEngine`` itself lists the groups that finished this step before the
    others. A group that ran a prompt chunk without sampling gets no output
    here (the engine's cumulative ``RequestOutput`` for it carries no new
    token).
``observe``
    ``{"num_free_gpu_blocks", "num_free_cpu_blocks", "block_tables",
    "cpu_block_tables"}``: the block table of each group in ``waiting``,
    ``running`` or ``swapped``, by request id, GPU ones in ``block_tables``,
    CPU ones (ids relative to the CPU pool, 0..M-1) in ``cpu_block_tables``
    (the schema's "each swapped-out request", as the model reports). A group
    vLLM finishes as infeasible while swapped (``_schedule_swapped``, NEVER)
    leaves the queues but vLLM never frees its CPU table: it is not listed,
    and its blocks stay missing from ``num_free_cpu_blocks``.

An exception raised inside vLLM (in ``schedule``, ``abort`` or ``update``)
kills vLLM's engine; the driver answers the ``engine_*`` code the model
uses for that crash (:data:`ENGINE_CRASHES`, told apart by the exception and
the innermost frame of its traceback: e.g. a swap-out without CPU space,
vLLM's ``RuntimeError("Aborted due to the lack of CPU swap space...")`` in
``_swap_out``, is ``engine_swap_space_exhausted``), or ``internal`` for any
other, and every later call ``engine_dead`` until the next ``init``.

The wall clock: the scheduler takes ``now = time.time()`` in ``schedule()``
as the prefix-caching access time of every scheduled sequence (the LRU
evictor orders freed blocks by it) and in ``_passed_delay`` (inert with
``delay_factor = 0``). The driver replaces the ``time`` module that
``vllm/core/scheduler.py`` sees with a logical clock (:class:`LogicalClock`)
so that runs are deterministic; see :data:`LOGICAL_NOW` for its value.

``python -m schedconf.conformance.engines.vllm_v0_driver --self-check [--expect-version V]``
builds one scheduler, runs two steps and prints ``self-check ok: ...``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from schedconf.conformance.engines.protocol_checks import (
    ConfigRule,
    DriverError,
    SutUnsupported,
    at_least,
    get_config_rule,
    is_int,
    is_token_id,
    require,
    validate_add_request,
    validate_config_rules,
    validate_field_types,
)
from schedconf.conformance.engines.self_check import get_self_check_request, run_self_check
from schedconf.conformance.protocol_server import run_driver, take_protocol_stdout

PROFILE = "vllm-0.10"
"""The profile of vLLM 0.10.2's legacy scheduler."""

DEFAULT_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

V0_CONFIG_FIELDS = (
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "policy",
    "preemption_mode",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
    "long_prefill_token_threshold",
)
"""The v0 config of a trace header (spec/v0/config.py, in its field order)."""

ENGINE_CRASHES = (
    # (code, exception class, innermost function, its class ("" = a plain function or any), its file)
    ("engine_swap_space_exhausted", "RuntimeError", "_swap_out", "Scheduler", "vllm/core/scheduler.py"),
    ("engine_swapped_group_in_waiting", "AssertionError", "_schedule_prefills", "Scheduler", "vllm/core/scheduler.py"),
    (
        "engine_swapped_group_in_waiting",
        "IndexError",
        "can_allocate",
        "SelfAttnBlockSpaceManager",
        "vllm/core/block_manager.py",
    ),
    (
        "engine_cached_below_computed",
        "AssertionError",
        "_get_num_new_uncached_and_cached_tokens",
        "Scheduler",
        "vllm/core/scheduler.py",
    ),
    (
        "engine_abort_swapped_prefix_cache",
        "KeyError",
        "mark_blocks_as_accessed",
        "PrefixCachingBlockAllocator",
        "vllm/core/block/prefix_caching_block.py",
    ),
    (
        "engine_computed_blocks_tracker_assertion",
        "AssertionError",
        "remove_seq",
        "ComputedBlocksTracker",
        "vllm/core/block/prefix_caching_block.py",
    ),
    (
        "engine_evictor_stale_entry",
        "AssertionError",
        "_maybe_allocate_evicted_block_id",
        "PrefixCachingBlockAllocator",
        "vllm/core/block/prefix_caching_block.py",
    ),
    ("engine_evictor_stale_entry", "ValueError", "evict", "LRUEvictor", "vllm/core/evictor.py"),
    ("engine_no_free_blocks", "NoFreeBlocksError", "", "", ""),
)
"""An exception vLLM raises inside the scheduler kills its engine. These are the ones the model
names (spec/errors.py, ``engine_*``; spec/v0/README.md, "Engine crashes"), told apart by the
exception's class and the innermost frame of its traceback: function, the class of its ``self``,
file (any frame for ``NoFreeBlocksError``). Any other exception is ``internal``."""

LOGICAL_NOW = "the 1-based index of this schedule() call since init (spec/v0/README.md, 'Logical clock')"
"""What ``time.time()`` returns inside ``vllm/core/scheduler.py`` (see :class:`LogicalClock`)."""


class LogicalClock:
    """Stands in for the ``time`` module inside ``vllm.core.scheduler``.

    ``time()`` answers the logical "now" (:data:`LOGICAL_NOW`); the other
    functions the module uses (``perf_counter`` for its own metrics) are the
    real ones.
    """

    def __init__(self) -> None:
        self.now = 0

    def time(self) -> float:
        return float(self.now)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def get_engine_crash_code(exc: BaseException) -> str:
    """The ``engine_*`` code of an exception raised inside vLLM (:data:`ENGINE_CRASHES`), else ``internal``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame if tb is not None else None
    function = frame.f_code.co_name if frame else ""
    filename = frame.f_code.co_filename.replace(os.sep, "/") if frame else ""
    owner = type(frame.f_locals["self"]).__name__ if frame and "self" in frame.f_locals else ""
    for code, cls, where, where_owner, where_file in ENGINE_CRASHES:
        if type(exc).__name__ != cls:
            continue
        if not where or (function == where and owner == where_owner and filename.endswith(where_file)):
            return code
    return "internal"


# --------------------------------------------------------------------- vLLM


class _Vllm:
    """The vLLM names the driver uses, imported once (the import takes ~10 s)."""

    def __init__(self) -> None:
        import vllm
        import vllm.core.scheduler as scheduler_module
        from vllm.config import CacheConfig, SchedulerConfig
        from vllm.engine.output_processor.single_step import SingleStepOutputProcessor
        from vllm.engine.output_processor.stop_checker import StopChecker
        from vllm.inputs.data import token_inputs
        from vllm.sampling_params import SamplingParams
        from vllm.sequence import (
            CompletionSequenceGroupOutput,
            Logprob,
            Sequence,
            SequenceGroup,
            SequenceOutput,
            SequenceStatus,
        )
        from vllm.utils import Counter

        self.version: str = vllm.__version__
        self.scheduler_module = scheduler_module
        self.clock = LogicalClock()
        scheduler_module.time = self.clock  # type: ignore[assignment]
        self.Scheduler = scheduler_module.Scheduler
        self.SchedulerConfig = SchedulerConfig
        self.CacheConfig = CacheConfig
        self.SingleStepOutputProcessor = SingleStepOutputProcessor
        self.StopChecker = StopChecker
        self.token_inputs = token_inputs
        self.SamplingParams = SamplingParams
        self.CompletionSequenceGroupOutput = CompletionSequenceGroupOutput
        self.Logprob = Logprob
        self.Sequence = Sequence
        self.SequenceGroup = SequenceGroup
        self.SequenceOutput = SequenceOutput
        self.SequenceStatus = SequenceStatus
        self.Counter = Counter


# ------------------------------------------------------------------- config


V0_CONFIG_RULES: tuple[ConfigRule, ...] = (
    get_config_rule("invalid_block_size"),
    at_least("num_gpu_blocks", 1, "invalid_num_gpu_blocks"),
    at_least("num_cpu_blocks", 0, "invalid_num_cpu_blocks"),
    get_config_rule("invalid_token_budget"),
    get_config_rule("invalid_max_num_seqs"),
    get_config_rule("invalid_max_model_len"),
    get_config_rule("invalid_threshold"),
    # SchedulerConfig._verify_args, in its order.
    get_config_rule("budget_below_max_model_len"),
    get_config_rule("budget_below_max_num_seqs"),
    at_least("max_num_partial_prefills", 1, "invalid_max_num_partial_prefills"),
    (
        ("max_num_partial_prefills", "enable_chunked_prefill"),
        lambda c: c["max_num_partial_prefills"] == 1 or c["enable_chunked_prefill"],
        "partial_prefills_without_chunked_prefill",
        "max_num_partial_prefills > 1 needs chunked prefill",
    ),
    (
        ("max_num_partial_prefills", "long_prefill_token_threshold", "max_model_len"),
        lambda c: c["max_num_partial_prefills"] == 1 or c["long_prefill_token_threshold"] <= c["max_model_len"],
        "threshold_above_max_model_len",
        "long_prefill_token_threshold must be <= max_model_len",
    ),
    (
        ("max_long_partial_prefills", "max_num_partial_prefills"),
        lambda c: 1 <= c["max_long_partial_prefills"] <= c["max_num_partial_prefills"],
        "invalid_max_long_partial_prefills",
        "max_long_partial_prefills must be in [1, max_num_partial_prefills]",
    ),
    # worker.raise_if_cache_size_invalid: the engine does not start (no null block in v0).
    (
        ("max_model_len", "block_size", "num_gpu_blocks"),
        lambda c: c["max_model_len"] <= c["block_size"] * c["num_gpu_blocks"],
        "pool_below_max_model_len",
        "block_size * num_gpu_blocks must be >= max_model_len",
    ),
)
"""The v0 model's range rules in its order (spec/v0/config.py), then vLLM 0.10.2's own."""


def validate_v0_config(config: Any) -> dict[str, Any]:
    """Refuse a v0 config with the protocol's codes, in the model's order (spec/v0/config.py); return a copy.

    The rules after the ranges are vLLM 0.10.2's own: ``SchedulerConfig._verify_args``
    (config/scheduler.py) and the worker's ``raise_if_cache_size_invalid``
    (worker/worker.py: ``block_size * num_gpu_blocks >= max_model_len``, no null block).
    """
    c = validate_field_types(config, V0_CONFIG_FIELDS, missing_code="missing_config_field")
    validate_config_rules(c, V0_CONFIG_RULES)
    return c


# ---------------------------------------------------------------------- SUT


class VllmV0SchedulerSut:
    """One real vLLM 0.10.2 v0 scheduler at a time, rebuilt on every ``start`` (protocol ``init``)."""

    supports_observe = True

    def __init__(self, vllm_api: _Vllm | None = None) -> None:
        self.v = vllm_api or _Vllm()
        self.name = f"vllm-v0@{self.v.version}"
        self.scheduler: Any = None
        self.dead: str | None = None

    # ----------------------------------------------------------------- init

    def start(self, config: dict[str, Any], profile: str) -> None:
        """Build a fresh scheduler for ``config``; the profile must be ``vllm-0.10``."""
        if profile != PROFILE:
            raise SutUnsupported(
                f"this process runs vLLM {self.v.version}'s v0 scheduler (profile {PROFILE}); "
                f"it cannot answer for profile {profile!r}"
            )
        cfg = validate_v0_config(config)
        self.scheduler = None
        self.scheduler = self._build_scheduler(cfg)
        self.config = cfg
        self.dead = None
        self.v.clock.now = 0
        self.seq_counter = self.v.Counter()
        self.stop_checker = self.v.StopChecker(cfg["max_model_len"], lambda seq: None)
        self.output_processor = self.v.SingleStepOutputProcessor(
            self.scheduler.scheduler_config, None, [self.scheduler], self.seq_counter, self.stop_checker
        )
        self.groups: dict[str, Any] = {}  # request id -> its latest SequenceGroup
        self.pending: tuple[list[Any], Any] | None = None  # (metadata list, SchedulerOutputs) awaiting update

    def _build_scheduler(self, cfg: dict[str, Any]) -> Any:
        v = self.v
        try:
            scheduler_config = v.SchedulerConfig(
                max_num_seqs=cfg["max_num_seqs"],
                max_num_batched_tokens=cfg["max_num_batched_tokens"],
                max_model_len=cfg["max_model_len"],
                enable_chunked_prefill=cfg["enable_chunked_prefill"],
                policy=cfg["policy"],
                preemption_mode=cfg["preemption_mode"],
                max_num_partial_prefills=cfg["max_num_partial_prefills"],
                max_long_partial_prefills=cfg["max_long_partial_prefills"],
                long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
            )
            cache_config = v.CacheConfig(
                block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"]
            )
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise SutUnsupported(f"vLLM {v.version} refuses this config: {' '.join(str(exc).split())}") from None
        cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
        cache_config.num_cpu_blocks = cfg["num_cpu_blocks"]
        scheduler = v.Scheduler(scheduler_config, cache_config, None)
        self._check_knobs(scheduler, cfg)
        return scheduler

    def _check_knobs(self, s: Any, cfg: dict[str, Any]) -> None:
        """Read every knob back from the built scheduler."""
        sc, bm = s.scheduler_config, s.block_manager
        threshold = cfg["long_prefill_token_threshold"]
        if cfg["max_num_partial_prefills"] > 1 and threshold == 0:
            threshold = int(cfg["max_model_len"] * 0.04)  # SchedulerConfig.__post_init__
        actual = {
            "block_size": bm.block_size,
            "num_gpu_blocks": bm.num_total_gpu_blocks,
            "num_cpu_blocks": bm.num_total_cpu_blocks,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "max_num_seqs": sc.max_num_seqs,
            "max_model_len": sc.max_model_len,
            "enable_chunked_prefill": sc.chunked_prefill_enabled,
            "enable_prefix_caching": bm.enable_caching,
            "policy": sc.policy,
            "preemption_mode": s.user_specified_preemption_mode,
            "max_num_partial_prefills": sc.max_num_partial_prefills,
            "max_long_partial_prefills": sc.max_long_partial_prefills,
            "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        }
        expected = dict(cfg, long_prefill_token_threshold=threshold)
        changed = {k: (expected[k], a) for k, a in actual.items() if a != expected[k]}
        if sc.delay_factor != 0 or sc.num_lookahead_slots != 0 or s.use_async_output_proc:
            changed["delay_factor/num_lookahead_slots/async"] = (
                0,
                (sc.delay_factor, sc.num_lookahead_slots, s.use_async_output_proc),
            )
        if bm.watermark_blocks != int(0.01 * cfg["num_gpu_blocks"]):
            changed["watermark_blocks"] = (int(0.01 * cfg["num_gpu_blocks"]), bm.watermark_blocks)
        if changed:
            detail = ", ".join(f"{k}: asked {e!r}, got {a!r}" for k, (e, a) in sorted(changed.items()))
            raise SutUnsupported(f"vLLM {self.v.version} built another scheduler than asked: {detail}")

    def _sched(self) -> Any:
        if self.scheduler is None:
            raise RuntimeError("init must come first")
        require(self.dead is None, "engine_dead", f"vLLM's engine died ({self.dead}); it is dead until the next init")
        return self.scheduler

    # --------------------------------------------------------------- inputs

    def _live(self) -> set[str]:
        return {rid for rid, g in self.groups.items() if not g.is_finished()}

    def add_request(self, event: dict[str, Any]) -> None:
        """The protocol's refusals, then LLMEngine.add_request's, then ``Scheduler.add_seq_group``."""
        s = self._sched()
        max_model_len = self.config["max_model_len"]
        try:
            # v0's engine refuses only a prompt LONGER than max_model_len (_validate_model_input). A request
            # re-added under the id of one aborted in the pending step is fine: the engine's update
            # follows the scheduled group objects, not ids (so no request_id_in_flight).
            fields = validate_add_request(event, self._live(), (), max_model_len + 1)
        except DriverError as exc:
            if exc.code == "prompt_too_long":
                raise DriverError(
                    "prompt_too_long",
                    f"prompt of {len(event['prompt_token_ids'])} tokens is longer "
                    f"than max_model_len={max_model_len} (LLMEngine._validate_model_input)",
                ) from None
            raise
        # LLMEngine.add_request: "Got priority ... but Priority scheduling is not enabled."
        require(
            fields["priority"] == 0 or self.config["policy"] == "priority",
            "priority_without_priority_policy",
            "a priority other than 0 needs policy 'priority' (LLMEngine.add_request)",
        )
        v = self.v
        rid, prompt, eos = fields["request_id"], list(fields["prompt_token_ids"]), fields["eos_token_id"]
        seq_id = next(self.seq_counter)
        seq = v.Sequence(seq_id, v.token_inputs(prompt), self.config["block_size"], eos)
        params = v.SamplingParams(
            max_tokens=fields["max_tokens"],
            min_tokens=fields["min_tokens"],
            stop_token_ids=list(fields["stop_token_ids"]),
            ignore_eos=fields["ignore_eos"],
        )
        params.update_from_generation_config({}, eos)
        group = v.SequenceGroup(
            request_id=rid,
            seqs=[seq],
            arrival_time=fields["arrival_time"],
            sampling_params=params,
            priority=fields["priority"],
        )
        s.add_seq_group(group)
        self.groups[rid] = group

    def abort(self, request_id: str) -> None:
        """``Scheduler.abort_seq_group``; an id never added is refused."""
        s = self._sched()
        require(
            isinstance(request_id, str) and request_id in self.groups,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
        )
        self._call_engine(s.abort_seq_group, request_id)

    def _call_engine(self, method: Any, *args: Any) -> Any:
        """Call into vLLM; an exception kills the engine (:data:`ENGINE_CRASHES`): dead until the next init."""
        try:
            return method(*args)
        except Exception as exc:
            self.dead = get_engine_crash_code(exc)
            if self.dead == "internal":
                raise  # the protocol server answers internal, with the traceback on stderr
            raise DriverError(self.dead, f"vLLM's engine died: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------- schedule

    def schedule(self) -> dict[str, Any]:
        """``Scheduler.schedule()`` and ``get_and_reset_finished_requests_ids()``, in canonical form."""
        s = self._sched()
        require(
            self.pending is None,
            "output_not_processed",
            "schedule() called before update_from_output() for the previous step",
        )
        self.v.clock.now += 1
        metadata, outputs, _ = self._call_engine(s.schedule)
        finished = s.get_and_reset_finished_requests_ids()
        self.pending = (metadata, outputs)
        return render_output(metadata, outputs, finished)

    # --------------------------------------------------------------- update

    def _validate_model_output(self, sampled: Any, drafts: Any) -> None:
        """Refuse model output no model could produce for the pending step (protocol codes)."""
        assert self.pending is not None
        metadata, outputs = self.pending
        require(
            isinstance(sampled, dict) and isinstance(drafts, dict),
            "invalid_field_type",
            "sampled_token_ids and draft_token_ids must be objects",
        )
        require(not drafts, "drafts_without_spec_decode", "draft tokens given, but v0 runs no speculative decoding")
        sampling = {md.request_id: md.do_sample for md in metadata}
        for rid, tokens in sampled.items():
            require(
                sampling.get(rid, False),
                "unscheduled_model_output",
                f"sampled tokens for {rid!r}, which was not scheduled to sample this step",
            )
            require(isinstance(tokens, list), "invalid_field_type", "sampled tokens must be a list")
            require(
                len(tokens) <= 1,
                "bad_num_sampled_tokens",
                f"request {rid!r} samples one token per step, got {len(tokens)}",
            )
            for token in tokens:
                require(is_token_id(token), "invalid_token_id", "sampled token ids must be non-negative integers")
        for md, scheduled in zip(metadata, outputs.scheduled_seq_groups):
            if not md.do_sample or scheduled.seq_group.is_finished():
                continue  # a group aborted since the schedule is skipped by the engine (0 or 1 token)
            got = len(sampled.get(md.request_id, ()))
            require(
                got == 1,
                "bad_num_sampled_tokens",
                f"request {md.request_id!r} samples this step and needs exactly 1 token, got {got}",
            )

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]:
        """``LLMEngine._process_model_outputs`` for the pending step; the request outputs in the engine's order."""
        self._sched()
        require(self.pending is not None, "unexpected_model_output", "update without a pending step")
        self._validate_model_output(sampled_token_ids, draft_token_ids)
        (metadata, outputs), self.pending = self.pending, None
        try:
            return self._process_model_outputs(metadata, outputs, sampled_token_ids)
        except Exception as exc:
            self.dead = get_engine_crash_code(exc)
            if self.dead == "internal":
                raise
            raise DriverError(self.dead, f"vLLM's engine died: {type(exc).__name__}: {exc}") from None

    def _process_model_outputs(
        self, metadata: list[Any], outputs: Any, sampled_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]:
        s, v = self.scheduler, self.v
        finished_now: list[int] = []
        sampled_now: list[int] = []
        for i, (md, scheduled) in enumerate(zip(metadata, outputs.scheduled_seq_groups)):
            group = scheduled.seq_group
            if group.is_finished():
                continue  # finished before (aborted after schedule): the engine skips it
            group.update_num_computed_tokens(md.token_chunk_size or 0)
            if md.do_sample:
                token = sampled_token_ids[md.request_id][0]
                sample = v.SequenceOutput(group.first_seq.seq_id, token, {token: v.Logprob(logprob=0.0)})
                self.output_processor.process_outputs(group, [v.CompletionSequenceGroupOutput([sample], None)], False)
                sampled_now.append(i)
            if group.is_finished():
                finished_now.append(i)
        if finished_now:
            s.free_finished_seq_groups()
        # Scheduled order, the canonical order of spec/v0 (LLMEngine itself lists this step's finished groups first).
        result = [render_request_output(outputs.scheduled_seq_groups[i].seq_group, True) for i in sampled_now]
        result += [render_request_output(group, False) for group in outputs.ignored_seq_groups]
        return result

    # -------------------------------------------------------------- observe

    def observe(self) -> dict[str, Any]:
        """Free blocks per device, and the block table of each group in waiting, running or swapped."""
        s = self._sched()
        bm = s.block_manager
        num_gpu = bm.num_total_gpu_blocks
        gpu: dict[str, list[int]] = {}
        cpu: dict[str, list[int]] = {}
        for queue in (s.waiting, s.running, s.swapped):
            for group in queue:
                table = bm.block_tables.get(group.first_seq.seq_id)
                ids = list(table.physical_block_ids) if table is not None else []
                if not ids:
                    continue
                if all(b < num_gpu for b in ids):
                    gpu[group.request_id] = ids
                else:
                    cpu[group.request_id] = [b - num_gpu for b in ids]
        return {
            "num_free_gpu_blocks": bm.get_num_free_gpu_blocks(),
            "num_free_cpu_blocks": bm.get_num_free_cpu_blocks(),
            "block_tables": dict(sorted(gpu.items())),
            "cpu_block_tables": dict(sorted(cpu.items())),
        }

    def close(self) -> None:
        self.scheduler = None


# ---------------------------------------------------------------- rendering


def render_output(metadata: list[Any], outputs: Any, finished_requests_ids: list[str]) -> dict[str, Any]:
    """The canonical v0 output of one ``schedule()`` (trace schema ``$defs/v0_scheduler_output``)."""
    groups = []
    for md, scheduled in zip(metadata, outputs.scheduled_seq_groups):
        assert md.request_id == scheduled.seq_group.request_id and len(md.block_tables) == 1
        (table,) = md.block_tables.values()
        groups.append(
            {
                "request_id": md.request_id,
                "token_chunk_size": md.token_chunk_size,
                "is_prompt": bool(md.is_prompt),
                "do_sample": bool(md.do_sample),
                "block_table": list(table),
                "computed_block_nums": list(md.computed_block_nums or []),
            }
        )
    return {
        "scheduled_seq_groups": groups,
        "num_prefill_groups": outputs.num_prefill_groups,
        "num_batched_tokens": outputs.num_batched_tokens,
        "blocks_to_swap_in": [list(p) for p in outputs.blocks_to_swap_in],
        "blocks_to_swap_out": [list(p) for p in outputs.blocks_to_swap_out],
        "blocks_to_copy": [list(p) for p in outputs.blocks_to_copy],
        "ignored_seq_groups": [g.request_id for g in outputs.ignored_seq_groups],
        "num_lookahead_slots": outputs.num_lookahead_slots,
        "running_queue_size": outputs.running_queue_size,
        "preempted": outputs.preempted,
        "finished_requests_ids": list(finished_requests_ids),
    }


def render_request_output(group: Any, sampled: bool) -> dict[str, Any]:
    """One request output (trace schema ``request_output``): the token sampled this step, if any."""
    seq = group.first_seq
    reason = seq.status.get_finished_reason(seq.status) if seq.is_finished() else None
    stop = seq.stop_reason
    return {
        "req_id": group.request_id,
        "new_token_ids": [seq.get_last_token_id()] if sampled else [],
        "finish_reason": reason,
        "stop_reason": stop if stop is None or is_int(stop) else str(stop),
    }


# -------------------------------------------------------------------- serve


def serve_stdio() -> int:
    """Run the protocol on stdin/stdout until ``shutdown`` or end of input."""
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    api = _Vllm()
    return serve(lambda: VllmV0SchedulerSut(api), stdin=sys.stdin, stdout=proto_out)


SELF_CHECK_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 8,
    "num_cpu_blocks": 4,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "preemption_mode": None,
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
}


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(api: _Vllm) -> str | None:
        sut = VllmV0SchedulerSut(api)
        sut.start(dict(SELF_CHECK_CONFIG), PROFILE)
        sut.add_request(get_self_check_request(max_tokens=2))
        first = sut.schedule()
        out1 = sut.update_from_output({"a": [5]}, {})
        second = sut.schedule()
        out2 = sut.update_from_output({"a": [6]}, {})
        # 10 prompt tokens in blocks of 4 -> blocks 0, 1, 2; the decode of token 5 (11th slot) stays in block 2.
        ok = (
            first["scheduled_seq_groups"]
            == [
                {
                    "request_id": "a",
                    "token_chunk_size": 10,
                    "is_prompt": True,
                    "do_sample": True,
                    "block_table": [0, 1, 2],
                    "computed_block_nums": [],
                }
            ]
            and second["scheduled_seq_groups"][0]["token_chunk_size"] == 1
            and out1 == [{"req_id": "a", "new_token_ids": [5], "finish_reason": None, "stop_reason": None}]
            and out2 == [{"req_id": "a", "new_token_ids": [6], "finish_reason": "length", "stop_reason": None}]
        )
        return None if ok else f"unexpected outputs {first} {out1} / {second} {out2}"

    return run_self_check(
        "vLLM", expect_version, _Vllm, exercise, lambda api: f"vllm {api.version} v0 scheduler ({PROFILE})"
    )


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.vllm_v0_driver",
        engine="vLLM",
        default_env=DEFAULT_ENV,
        description="Serve vLLM 0.10.2's legacy v0 scheduler over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
    )


if __name__ == "__main__":
    main()
