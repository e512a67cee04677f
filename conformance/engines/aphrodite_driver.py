"""Serve Aphrodite Engine's own v1 ``Scheduler`` over the schedconf JSON-lines protocol.

This module runs INSIDE an Aphrodite environment built by ``schedconf env
aphrodite VERSION``, as ``<venv python> -m schedconf.conformance.engines.aphrodite_driver``
with the repository root on ``PYTHONPATH`` (``schedconf.conformance.adapters.aphrodite``
starts it). It imports only the standard library, Aphrodite,
``schedconf.conformance.protocol_server`` and ``schedconf.conformance.engines.vllm_driver`` (the vLLM
driver, used here as a library: it imports nothing of vLLM at module level);
never the reference model.

Aphrodite 0.24.1 is a fork of vLLM's v1 engine, renamed (``vllm`` ->
``aphrodite``, ``VllmConfig`` -> ``AphroditeConfig``, ``VLLM_*`` ->
``APHRODITE_*``): ``aphrodite/v1/core/sched/scheduler.py``,
``kv_cache_manager.py``, ``block_pool.py``, ``request.py`` and
``core/sched/utils.py`` are vLLM's with the names changed. The driver is
therefore the vLLM driver (:class:`schedconf.conformance.engines.vllm_driver.VllmSchedulerSut`,
whose docstring lists every protocol mapping) with the Aphrodite names
plugged in (:class:`_Aphrodite`) and these differences:

Profile
    Aphrodite 0.24.1 tracks vLLM 0.32: its scheduler files, normalised
    (``aphrodite`` -> ``vllm``, formatting and docstrings dropped), differ
    from vLLM 0.32.0's in 555 lines of ``scheduler.py`` against 720 for 0.33.0
    and 1,263 for 0.11.0 (``kv_cache_manager.py`` 90/111/269,
    ``block_pool.py`` 61/94/224); the priority self-preemption ``break`` and
    the absence of the post-spec-update ``cache_blocks`` call are 0.32's.
    Most of the difference is features a scheduler-only config never reaches
    (KV connectors, prefix replay, encoder cache, aux outputs) and newer
    vLLM additions Aphrodite does not have (``max_num_active_seqs``,
    ``long_prefill_token_threshold_adaptive``, ``kv_holding_waiting``).
    The driver answers only ``init`` with profile ``vllm-0.32``
    (:data:`TRACKED_PROFILE`); any other profile is ``unsupported``.
The one scheduling rule that differs on the protocol's configs
    ``long_prefill_token_threshold`` caps every request, also one that is
    alone in running + waiting (``scheduler.py:566`` for running requests,
    ``:924-926`` for waiting ones); vLLM 0.32/0.33 lift the cap for a lone
    request (``num_eligible_reqs > 1``). This is the profile knob
    ``exempt_lone_request_from_threshold = False`` (0.11's value), so strict
    replays against ``vllm-0.32`` diverge there by design.
Platform
    ``APHRODITE_TARGET_DEVICE=cpu`` selects Aphrodite's CPU platform,
    ``APHRODITE_USE_V2_MODEL_RUNNER=0`` the V1 ``SchedulerOutput`` layout.
    The scheduler holds its config as ``aphrodite_config`` (vLLM:
    ``vllm_config``); the knob read-back sees it through a view.
Crash
    vLLM's padded-admission assertion (``assert num_new_tokens == 1 +
    self.num_spec_tokens`` in ``schedule()``) is in Aphrodite too
    (``aphrodite/v1/core/sched/scheduler.py:1102``) and is answered
    ``engine_assertion_padded_admission`` as for vLLM.

Nothing here needs a GPU: Aphrodite's scheduler, KV-cache manager and block
pool are pure Python; no model runner, worker or kernel is started (the
model output comes from the trace), and the model is a folder with one
``config.json`` (no weights).

``python -m schedconf.conformance.engines.aphrodite_driver --self-check [--expect-version V]``
builds one scheduler, runs two steps and prints ``self-check ok: ...``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from schedconf.conformance.engines.self_check import SPEC_DECODE_SELF_CHECK_CONFIG, run_self_check, run_two_steps
from schedconf.conformance.engines.vllm_driver import (
    DriverError,
    SutUnsupported,
    VllmSchedulerSut,
    _Vllm,
    _with_extensions,
)
from schedconf.conformance.protocol_server import run_driver, take_protocol_stdout

DEFAULT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "APHRODITE_USE_V2_MODEL_RUNNER": "0",
    "APHRODITE_NO_USAGE_STATS": "1",
    "APHRODITE_TARGET_DEVICE": "cpu",
}

TRACKED_PROFILE = "vllm-0.32"
OWN_PROFILE = "aphrodite-0.24"
"""Aphrodite's own profile in spec/v1/profiles.py: vllm-0.32 with the lone-request threshold rule."""
"""The vLLM release profile Aphrodite 0.24.1's scheduler tracks (see the module docstring)."""

PADDED_ADMISSION_ASSERT = "assert num_new_tokens == 1 + self.num_spec_tokens"
SCHEDULER_FILE = "aphrodite/v1/core/sched/scheduler.py"


def _is_padded_admission_assert(exc: BaseException) -> bool:
    """True iff ``exc`` is the padded-admission assertion in Aphrodite's ``schedule()``, and no other failure."""
    import traceback

    if not isinstance(exc, AssertionError):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return (
        last.name == "schedule"
        and last.filename.replace(os.sep, "/").endswith(SCHEDULER_FILE)
        and (last.line or "").strip() == PADDED_ADMISSION_ASSERT
    )


def _scheduler_factory(scheduler_cls: Any) -> Any:
    """Aphrodite's ``Scheduler`` called with the vLLM driver's keyword (``vllm_config`` -> ``aphrodite_config``)."""

    def build(*, vllm_config: Any, **kwargs: Any) -> Any:
        return scheduler_cls(aphrodite_config=vllm_config, **kwargs)

    return build


class _Aphrodite(_Vllm):
    """Aphrodite's names under the attribute names the vLLM driver uses (imported once)."""

    def __init__(self) -> None:  # noqa: PLR0915 - one import per name
        import aphrodite
        import torch
        from aphrodite.config import (
            AphroditeConfig,
            CacheConfig,
            ModelConfig,
            SchedulerConfig,
            SpeculativeConfig,
        )
        from aphrodite.sampling_params import SamplingParams
        from aphrodite.v1.core import kv_cache_utils
        from aphrodite.v1.core.sched.scheduler import Scheduler
        from aphrodite.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from aphrodite.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from aphrodite.v1.request import Request, RequestStatus
        from aphrodite.v1.structured_output import StructuredOutputManager

        self.torch = torch
        self.version: str = aphrodite.__version__
        self.CacheConfig = CacheConfig
        self.ModelConfig = ModelConfig
        self.SchedulerConfig = SchedulerConfig
        self.SpeculativeConfig = SpeculativeConfig
        self.VllmConfig = AphroditeConfig
        self.SamplingParams = SamplingParams
        self.Scheduler = _scheduler_factory(Scheduler)
        self.FullAttentionSpec = FullAttentionSpec
        self.KVCacheConfig = KVCacheConfig
        self.KVCacheGroupSpec = KVCacheGroupSpec
        self.ModelRunnerOutput = ModelRunnerOutput
        self.Request = Request
        self.RequestStatus = RequestStatus
        self.StructuredOutputManager = StructuredOutputManager
        self.DraftTokenIds = DraftTokenIds
        self.kv_cache_utils = kv_cache_utils
        try:
            from aphrodite.v1.core.sched.async_scheduler import AsyncScheduler
        except ImportError:
            AsyncScheduler = None  # noqa: N806
        self.read_scheduler_api(Scheduler, AsyncScheduler, Request, SchedulerConfig)
        from aphrodite.platforms import current_platform

        if getattr(current_platform, "device_type", "") != "cpu":
            raise RuntimeError(f"Aphrodite picked the {current_platform!r} platform; set APHRODITE_TARGET_DEVICE=cpu")

    def profile_name(self) -> str:
        """The vLLM release profile this Aphrodite tracks (not derived from Aphrodite's own version)."""
        return TRACKED_PROFILE

    def hash_fn(self) -> Any:
        """Aphrodite's default prefix-caching hash (sha256), as its engine resolves it."""
        from aphrodite.utils.hashing import get_hash_fn_by_name

        return get_hash_fn_by_name("sha256")


class _SchedulerView:
    """An Aphrodite ``Scheduler`` seen under vLLM's attribute name ``vllm_config`` (read-only use)."""

    def __init__(self, scheduler: Any) -> None:
        self._s = scheduler

    def __getattr__(self, name: str) -> Any:
        if name == "vllm_config":
            return self._s.aphrodite_config
        return getattr(self._s, name)


class AphroditeSchedulerSut(VllmSchedulerSut):
    """One real Aphrodite scheduler at a time, rebuilt on every ``start`` (protocol ``init``)."""

    def __init__(self, api: _Aphrodite | None = None) -> None:
        super().__init__(api or _Aphrodite())
        self.name = f"aphrodite@{self.v.version}"

    def start(self, config: dict[str, Any], profile: str) -> None:
        # aphrodite-0.24 (spec/v1/profiles.py) is vllm-0.32 plus Aphrodite's one rule (the long-prefill
        # cap applies to a lone request too); under vllm-0.32 traces diverge there by design.
        if profile not in (TRACKED_PROFILE, OWN_PROFILE):
            raise SutUnsupported(
                f"Aphrodite {self.v.version}'s scheduler tracks vLLM 0.32 (profiles {OWN_PROFILE}, "
                f"{TRACKED_PROFILE}); it cannot answer for profile {profile!r}"
            )
        super().start(config, TRACKED_PROFILE)

    def _check_knobs(self, s: Any, cfg: dict[str, Any]) -> None:
        super()._check_knobs(_SchedulerView(s), cfg)

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        """``Scheduler.schedule()`` in canonical form (the vLLM driver's), with Aphrodite's assertion recognised.

        ``throttle_prefills`` is passed on: Aphrodite 0.24.1's ``schedule`` takes vLLM 0.32's data-parallel
        prefill throttle (aphrodite/v1/core/sched/scheduler.py:479, 522-526).
        """
        try:
            return super().schedule(throttle_prefills)
        except AssertionError as exc:
            if self.crashed == "internal" and _is_padded_admission_assert(exc):
                self.crashed = "engine_assertion_padded_admission"
                raise DriverError(
                    self.crashed,
                    f"Aphrodite's schedule() failed its assertion {PADDED_ADMISSION_ASSERT!r} "
                    "(a padded admission cut by long_prefill_token_threshold)",
                ) from exc
            raise


# -------------------------------------------------------------------- serve


def serve_stdio() -> int:
    """Run the protocol on stdin/stdout until ``shutdown`` or end of input."""
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    holder: dict[str, Any] = {}
    api = _Aphrodite()

    def factory() -> AphroditeSchedulerSut:
        holder["sut"] = AphroditeSchedulerSut(api)
        return holder["sut"]

    return serve(factory, stdin=_with_extensions(sys.stdin, proto_out, holder), stdout=proto_out)


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(api: _Aphrodite) -> str | None:
        sut = AphroditeSchedulerSut(api)
        first, second = run_two_steps(
            sut, TRACKED_PROFILE, SPEC_DECODE_SELF_CHECK_CONFIG, draft_token_ids={"a": [6, 7]}
        )
        ok = first["num_scheduled_tokens"] == {"a": 10} and second["scheduled_spec_decode_tokens"] == {"a": [6, 7]}
        return None if ok else f"unexpected outputs {first} / {second}"

    return run_self_check(
        "Aphrodite",
        expect_version,
        _Aphrodite,
        exercise,
        lambda api: f"aphrodite {api.version} (profile {TRACKED_PROFILE}), torch {api.torch.__version__}",
    )


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.aphrodite_driver",
        engine="Aphrodite",
        default_env=DEFAULT_ENV,
        description="Serve Aphrodite Engine's v1 scheduler over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
    )


if __name__ == "__main__":
    main()
