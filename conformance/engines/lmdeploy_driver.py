"""Serve LMDeploy's own PyTorch-engine ``Scheduler`` over the schedconf JSON-lines protocol.

Runs INSIDE the environment built by ``schedconf env lmdeploy VERSION``
(``.venvs/lmdeploy-VERSION``, the PyPI wheel ``lmdeploy``, installed with
``--no-deps``), as ``<venv python> -m schedconf.conformance.engines.lmdeploy_driver``
with the repository root on ``PYTHONPATH`` (``schedconf.conformance.adapters.lmdeploy``
starts it). It imports the standard library, numpy, torch (CPU), LMDeploy's
own modules and ``schedconf.conformance.protocol_server``; never ``spec/``.

What runs is LMDeploy's code, not a copy of it:

* ``lmdeploy.pytorch.paging.Scheduler`` (admission, prefix-cache trie, block
  manager, recompute eviction) with its ``SchedulerConfig`` / ``CacheConfig``;
* ``lmdeploy.pytorch.engine.inputs_maker.InputsMakerAsync``, the engine-loop
  object that decides each step (``do_prefill_default`` /
  ``do_prefill_chunked``, ``_ForwardInputsTask``: prefill vs decode, long-prompt
  chunks, ``schedule_running`` for decode, ``update_running_seqs``,
  ``preempt_invalid_decode_seqs``); it builds its real ``ModelInputs`` /
  ``ModelInputsDelta`` (torch CPU tensors) from which the schedule is read;
* the AR strategies: ``AREngineStrategy`` (prefill_interval / prealloc),
  ``ARSequenceStrategy`` (``SchedulerSequenceDefault``, ``update_running``: how
  a sampled token advances a sequence), ``ARModelAgentStrategy``
  (``make_stopping_criteria`` + ``ARStoppingCriteria.step``: the stop rule the
  model agent applies on the GPU), and ``SamplingParam.from_gen_config``.

What is bypassed (it needs a GPU, a model or a server):

* ``lmdeploy/__init__.py`` and ``lmdeploy/pytorch/engine/__init__.py`` are not
  run (they import the pipeline / the whole ``Engine``); the packages are
  registered with their real ``__path__`` and the submodules imported from the
  installed files.
* The executor / model agent: ``InputsMakerAsync._send_next_inputs_impl``
  (inputs_maker.py:1329-1345) is replayed without ``executor.forward_async``
  (the same calls: ``do_prefill()``, ``_make_forward_inputs()``,
  ``_forward_kind()``, ``scheduler.tick()``).
* sampling: the protocol's ``update`` supplies the tokens; the stop flags come
  from LMDeploy's ``ARStoppingCriteria.step`` over the request's stop words.

The engine loop's one-step prefetch is the protocol's steps in flight
(``in_flight = True``, at most ``MAX_STEPS_IN_FLIGHT`` = 2). ``EngineLoop.main_loop``
(engine_loop.py:520-557) schedules step t (``_main_loop_try_send_next_inputs``,
:544), activates it (``scheduler.activate_seqs``, :551); ``_main_loop_get_outputs``
(:484-518) runs ``update_running_seqs`` (:496-497), then *prefetches step t+1*
(``_prefetch_next_inputs``, :510 -> ``prefetch_next_inputs``, inputs_maker.py:1350-1353)
before it waits for step t's output (:511) and applies it
(``_finish_forward_output``, :465-482: ``_make_infer_outputs`` ->
``update_running``, ``release_completed_prefill_reservations``); then
``preempt_invalid_decode_seqs`` (:556), and the next turn activates step t+1.
The driver follows that order call for call: a ``schedule`` while a step awaits
its output is the prefetch (``_make_forward_inputs(prefill, enable_empty=True)``,
no activation yet); the older step's ``update`` applies its tokens, runs
``preempt_invalid_decode_seqs`` and only then activates the prefetched step and
runs its ``update_running_seqs``. A decode prefetched for a sequence the step in
flight samples for starts from ``num_all_ids`` (its token is not appended yet:
inputs_maker.py:1188-1193), and ``num_computed_tokens`` says so. A sequence
stopped by step t's output is still in the prefetched step t+1; its output there
is dropped (``update_running`` skips a sequence that is not RUNNING,
strategies/ar/sequence.py:145). With no step in flight (an ``update`` came before
the next ``schedule``), ``schedule`` is ``send_next_inputs`` plus the activation,
as the loop's first turn.

What reaches the driver in flight is up to the harness, and a safety campaign
sends none today: (1) ``conformance/checking/replay.py`` answers *unknown* for a trace
with steps in flight under ``--comparison safety`` ("drives the scheduler one
step at a time") and ``campaign.get_forced_for_protocol_level`` forces
``max_concurrent_batches = 1`` under safety; (2) a campaign reads ``in_flight``
from the adapter before the first ``init`` (``StdioSut.in_flight`` is False
until the ``init`` reply's capabilities arrive; ``conformance/adapters/lmdeploy.py``
would need ``in_flight = True``, as the vLLM adapter has); (3) under strict or
observable the trace's schedule is vLLM's, which LMDeploy's never matches. So a
safety campaign still applies each output before the next schedule; the
prefetch order runs when a caller sends two ``schedule`` calls in a row
(tests/engines/test_lmdeploy.py) or replays a trace with steps in flight.

Mapping (PROTOCOL.md -> LMDeploy):

``init``
    ``CacheConfig(block_size, num_gpu_blocks = n - 1, num_cpu_blocks = 0,
    max_batches = max_num_seqs, max_prefill_token_num = max_num_batched_tokens,
    enable_prefix_caching)`` and ``SchedulerConfig(max_batches, max_session_len =
    max_model_len, eviction_type = 'recompute', prefill_interval = min(16, block_size))``
    (see ``PREFILL_INTERVAL``); capabilities ``in_flight: true`` (the prefetch, above);
    ``enable_chunked_prefill`` selects ``do_prefill_chunked`` (else
    ``do_prefill_default``). vLLM's pool holds block 0 back as the null block,
    LMDeploy has none: block ``i`` is reported as ``i + 1``. ``unsupported``:
    ``policy: priority`` (FCFS by arrival only), ``num_spec_tokens > 0``,
    ``num_lookahead_tokens > 0`` and ``long_prefill_token_threshold > 0``
    (``max_num_batched_tokens < max_num_seqs`` is refused with the protocol's
    ``budget_below_max_num_seqs``, as vLLM refuses it).
``add_request``
    Validated with the protocol's codes, then one session per request
    (``Scheduler.add_session``, as ``Engine._on_add_session``) and the engine's
    own ``Engine._add_message`` (run on a stand-in for the Engine object: it
    calls ``SchedulerSession.add_sequence`` and caps ``max_new_tokens`` at the
    session length) with ``SamplingParam.from_gen_config(GenerationConfig(
    max_new_tokens, min_new_tokens, ignore_eos, stop_token_ids = [eos] +
    stop_token_ids))``. The session length is ``Engine._get_max_session_len``:
    ``min(max_model_len, pool tokens - one block)``, and ``_add_message`` caps
    ``max_new_tokens`` at it (engine.py:469-480). A prompt of at least the session
    length (no token left) is answered ``unsupported`` at once; a request that
    merely *could* outgrow it runs, and the ``update`` at which LMDeploy ends it at
    the session length before its ``max_tokens`` / ``max_model_len`` is answered
    ``unsupported`` (until then LMDeploy's schedule is the same with or without the cap). LMDeploy's
    ``ignore_eos`` drops ALL stop words (they become bad words,
    messages.py:91-93): a stop id sampled under ``ignore_eos`` (vLLM stops,
    LMDeploy cannot sample it) is answered ``unsupported``.
``abort``
    The engine's ``STOP_SESSION`` + ``END_SESSION`` path: ``Scheduler.stop_session``
    then ``Scheduler.end_session``.
``schedule``
    One engine step. Prefill-like work (``ModelInputs``): ``num_scheduled_tokens``
    = ``seq_length``, ``num_computed_tokens`` = ``history_lengths``; decode
    (``ModelInputsDelta``): one token, ``num_computed_tokens = num_history_ids``.
    A sequence scheduled for the first time is a new request; one whose block
    table no longer extends the table last reported (after a recompute
    eviction, or a prefix-trie de-duplication that swapped a block) is
    ``resumed`` with its whole table; else ``new_block_ids`` is the appended
    tail. ``preempted_req_ids``: live sequences RUNNING before the step and
    not after it (``schedule_running`` evicted them to WAITING).
    ``finished_req_ids``: ended since the last step.
``update``
    ``step`` (optional) must be the oldest step in flight (``unscheduled_step``,
    ``duplicate_model_output``, ``model_output_out_of_order``); a third ``schedule``
    is ``output_not_processed``. ``ARStoppingCriteria.step`` -> ``stopped``; ``ARSequenceStrategy.update_running``
    applies the token (and ``finish()``); a finished request's session is ended
    (``Scheduler.end_session``, the API's END_SESSION after a finished
    non-interactive request). ``finish_reason``: ``stop`` (``stop_reason`` the
    token unless it is the EOS) when the token is a stop word, else ``length``.
    A non-final long-prompt chunk samples nothing (the model agent returns no
    tokens for it).
``observe``
    ``free_block_queue``: the GPU allocator's free stack, next allocation
    first, then the blocks only the prefix trie holds (evictable, as vLLM's
    cached free blocks); ``num_free_blocks`` its length; ``block_tables``: each
    live request's physical table.

``python -m schedconf.conformance.engines.lmdeploy_driver --self-check [--expect-version V]``
builds one scheduler, runs two steps and prints ``self-check ok: ...``.
"""

# Size: it runs inside LMDeploy's environment with only the standard library, LMDeploy and
# protocol_server, so the engine adapter and the self-check live in the one file that
# environment runs.

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import types
from typing import Any

from schedconf.conformance.engines.protocol_checks import (
    SutUnsupported,
    is_token_id,
    require,
    validate_add_request,
    validate_config,
)
from schedconf.conformance.engines.self_check import run_self_check, run_two_steps
from schedconf.conformance.protocol_server import OFFLINE_ENV, run_driver, take_protocol_stdout

DISTRIBUTION = "lmdeploy"

NO_PREEMPTED_FIELD_PROFILES = ("vllm-0.11",)
MAX_STEPS_IN_FLIGHT = 2
"""LMDeploy's engine loop holds the step running on the executor and the one it prefetched (engine_loop.py:484-518)."""
PREFILL_INTERVAL = 16
"""LMDeploy's default ``PytorchEngineConfig.prefill_interval``; it is also the number of tokens preallocated
for decode (``AREngineStrategy.get_prealloc_size``). The engine keeps one block of the pool out of the session
length (``Engine._get_max_session_len``), which covers the preallocation only when ``prefill_interval <=
block_size`` (LMDeploy's default block size is 64): the driver uses ``min(16, block_size)``, or the value of
``SCHEDCONF_LMDEPLOY_PREFILL_INTERVAL`` (set it to 16 to see the liveness failure of a larger interval:
reports/findings/repro_lmdeploy_0_18_0_prealloc_liveness.py)."""


# ----------------------------------------------------------------- LMDeploy


def _bare_package(name: str) -> None:
    """Register package ``name`` with its real ``__path__`` without running its ``__init__``."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed in this environment (pip install --no-deps lmdeploy)")
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__spec__ = spec
    package.__package__ = name
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


class _Lmd:
    """LMDeploy's scheduler, engine-loop and strategy modules (see the module docstring)."""

    def __init__(self) -> None:
        import warnings

        warnings.filterwarnings("ignore")
        _bare_package("lmdeploy")  # its __init__ imports the serving pipeline
        importlib.import_module("lmdeploy.pytorch")
        _bare_package("lmdeploy.pytorch.engine")  # its __init__ imports Engine (executor, models, kernels)
        from importlib.metadata import version

        import numpy as np
        import torch
        from lmdeploy.messages import GenerationConfig
        from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig
        from lmdeploy.pytorch.disagg.config import EngineRole
        from lmdeploy.pytorch.engine.engine import Engine
        from lmdeploy.pytorch.engine.inputs_maker import InputsMakerAsync, InputsMakerConfig
        from lmdeploy.pytorch.messages import MessageStatus, SamplingParam, SequenceMeta
        from lmdeploy.pytorch.paging import Scheduler
        from lmdeploy.pytorch.strategies.ar.engine import AREngineStrategy
        from lmdeploy.pytorch.strategies.ar.model_agent import ARModelAgentStrategy
        from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy

        for name in ("lmdeploy", "lmdeploy.pytorch"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.version: str = version(DISTRIBUTION)
        self.np, self.torch = np, torch
        self.GenerationConfig = GenerationConfig
        self.CacheConfig, self.SchedulerConfig = CacheConfig, SchedulerConfig
        self.InputsMakerAsync, self.InputsMakerConfig = InputsMakerAsync, InputsMakerConfig
        self.MessageStatus, self.SamplingParam, self.SequenceMeta = MessageStatus, SamplingParam, SequenceMeta
        self.Scheduler = Scheduler
        self.Engine, self.EngineRole = Engine, EngineRole
        self.AREngineStrategy, self.ARModelAgentStrategy = AREngineStrategy, ARModelAgentStrategy
        self.ARSequenceStrategy = ARSequenceStrategy


class _NoAdapters:
    """``AdapterManager`` stand-in: no LoRA adapters (``_set_adapter_ids`` returns at once)."""

    def num_adapters(self) -> int:
        return 0


class _NoSampling:
    """``SamplingStrategy`` stand-in: the sampling tensors feed only the model agent, which is faked."""

    def make_sampling_inputs(self, seqs: Any) -> None:
        return None


# ------------------------------------------------------------------- config


def unsupported_reason(cfg: dict[str, Any]) -> str | None:
    """Why LMDeploy cannot run ``cfg`` (the verdict is then unknown), or None."""
    if cfg["policy"] != "fcfs":
        return "LMDeploy's scheduler has no priorities (it admits waiting requests by arrival time)"
    if cfg["num_spec_tokens"] > 0:
        return "speculative decoding is not driven (no drafts without a draft model)"
    if cfg["num_lookahead_tokens"] > 0:
        return "LMDeploy has no lookahead slots"
    if cfg["long_prefill_token_threshold"] > 0:
        return "LMDeploy has no long_prefill_token_threshold (it chunks only prompts over max_prefill_token_num)"
    return None


# -------------------------------------------------------------------- SUT


class LmdeploySchedulerSut:
    """One LMDeploy ``Scheduler`` + ``InputsMakerAsync`` behind the protocol's methods."""

    in_flight = True
    """Steps in flight (PROTOCOL.md): a ``schedule`` while a step awaits its output is LMDeploy's prefetch."""

    def __init__(self, lmd: _Lmd) -> None:
        self.m = lmd
        self.name = f"lmdeploy@{lmd.version}"
        self.scheduler: Any = None
        self.config: dict[str, Any] = {}
        self.profile = ""
        self.dead: str | None = None

    # ----------------------------------------------------------------- init

    def start(self, config: dict[str, Any], profile: str) -> None:
        cfg = validate_config(config)
        reason = unsupported_reason(cfg)
        if reason:
            raise SutUnsupported(reason)
        m = self.m
        interval = min(PREFILL_INTERVAL, cfg["block_size"])
        if os.environ.get("SCHEDCONF_LMDEPLOY_PREFILL_INTERVAL"):  # e.g. 16: LMDeploy's default, any block size
            interval = int(os.environ["SCHEDCONF_LMDEPLOY_PREFILL_INTERVAL"])
        cache_config = m.CacheConfig(
            max_batches=cfg["max_num_seqs"],
            block_size=cfg["block_size"],
            num_cpu_blocks=0,
            num_gpu_blocks=cfg["num_gpu_blocks"] - 1,
            max_prefill_token_num=cfg["max_num_batched_tokens"],
            enable_prefix_caching=cfg["enable_prefix_caching"],
            device_type="cpu",
        )
        scheduler_config = m.SchedulerConfig(
            max_batches=cfg["max_num_seqs"],
            max_session_len=cfg["max_model_len"],
            eviction_type="recompute",
            prefill_interval=interval,
        )
        # Engine._get_max_session_len (engine.py:328-341): min(session_len, pool tokens - one block)
        self.session_len = m.Engine._get_max_session_len(
            types.SimpleNamespace(scheduler_config=scheduler_config, cache_config=cache_config)
        )
        # Engine._add_message (engine.py:467-518) runs on this stand-in for the Engine object
        self.engine_view = types.SimpleNamespace(
            max_session_len=self.session_len,
            engine_config=types.SimpleNamespace(role=m.EngineRole.Hybrid),
            migration_event=types.SimpleNamespace(set=lambda: None),
            _response=self._engine_response,
        )
        self.seq_strategy = m.ARSequenceStrategy()
        seq_meta = m.SequenceMeta(cfg["block_size"], strategy=self.seq_strategy, sampling_strategy=None)
        self.scheduler = m.Scheduler(scheduler_config, cache_config, seq_meta=seq_meta)
        self.engine_view.scheduler = self.scheduler
        self.agent_strategy = m.ARModelAgentStrategy()
        maker_config = m.InputsMakerConfig(
            max_batches=cfg["max_num_seqs"],
            max_prefill_token_num=cfg["max_num_batched_tokens"],
            role=cache_config.role,
            block_size=cfg["block_size"],
            kernel_block_size=cache_config.kernel_block_size,
            window_size=-1,
            enable_prefix_caching=cache_config.enable_prefix_caching,
            prefix_cache_decode_state_interval=0,
            is_ssm=False,
            dp=1,
            spec_decoding=False,
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            use_mrope=False,
            prefill_interval=interval,
        )
        self.maker = m.InputsMakerAsync(
            executor=types.SimpleNamespace(device_type="cpu"),
            scheduler=self.scheduler,
            state_checkpoints=self.scheduler.state_checkpoints,
            adapter_manager=_NoAdapters(),
            engine_strategy=m.AREngineStrategy(scheduler_config, cache_config),
            sampling_strategy=_NoSampling(),
            model_agent_strategy=self.agent_strategy,
            config=maker_config,
        )
        self.config = cfg
        self.profile = profile
        self.dead = None
        self.seqs: dict[str, Any] = {}  # live requests
        self.meta: dict[int, dict[str, Any]] = {}  # session id -> request fields
        self.session_of: dict[str, int] = {}
        self.next_session = 0
        self.seen: set[str] = set()
        self.reported: dict[str, list[int]] = {}  # req_id -> block table last reported in a SchedulerOutput
        self.admitted: set[str] = set()  # live requests scheduled at least once
        self.finished_since: set[str] = set()
        self.in_flight_steps: list[dict[str, Any]] = []  # scheduled, output not applied yet (oldest first)
        self.aborted_in_pending: set[str] = set()  # aborted while a step of theirs is in flight
        self.current_step = 0

    def _session_len_why(self) -> str:
        cc = self.scheduler.cache_config
        return (
            f"Engine._get_max_session_len, engine.py:328-341: the pool's {cc.num_gpu_blocks} blocks of "
            f"{cc.block_size} tokens minus one block"
        )

    def _engine_response(self, resp: Any, resp_type: Any, data: Any = None, err_msg: str = "") -> None:
        self.engine_response_error = f"{resp_type} {err_msg}".strip()

    def _sched(self) -> Any:
        if self.scheduler is None:
            raise RuntimeError("init must come first")
        require(
            self.dead is None,
            "engine_dead",
            f"LMDeploy's scheduler failed ({self.dead}); it is dead until the next init",
        )
        return self.scheduler

    def _die(self, what: str, exc: BaseException) -> RuntimeError:
        import traceback

        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if "lmdeploy" in f.filename
        ] or traceback.extract_tb(exc.__traceback__)
        where = (
            f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno} {frames[-1].line!r}"
            if frames
            else "?"
        )
        self.dead = f"{type(exc).__name__} at {where}"
        return RuntimeError(f"LMDeploy's {what} raised {type(exc).__name__}: {exc} at {where}")

    # --------------------------------------------------------------- inputs

    def add_request(self, event: dict[str, Any]) -> None:
        s = self._sched()
        fields = validate_add_request(event, self.seqs, self.aborted_in_pending, self.config["max_model_len"])
        rid, prompt, stops, eos = (
            fields[k] for k in ("request_id", "prompt_token_ids", "stop_token_ids", "eos_token_id")
        )
        max_tokens, min_tokens, priority, arrival, ignore_eos = (
            fields[k] for k in ("max_tokens", "min_tokens", "priority", "arrival_time", "ignore_eos")
        )
        if len(prompt) >= self.session_len:
            # Engine._add_message would cap max_new_tokens at session_len - len(prompt) <= 0: no token at all
            raise SutUnsupported(
                f"request {rid!r} has a prompt of {len(prompt)} tokens but LMDeploy caps a session at "
                f"{self.session_len} ({self._session_len_why()}): it would not generate"
            )
        m = self.m
        stop_ids = ([] if eos is None else [eos]) + [t for t in stops if t != eos]
        gen = m.GenerationConfig(
            max_new_tokens=max_tokens, min_new_tokens=min_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_ids
        )
        param = m.SamplingParam.from_gen_config(gen)
        session_id = self.next_session
        self.next_session += 1
        s.add_session(session_id)  # Engine._on_add_session
        self.engine_response_error = None
        req = types.SimpleNamespace(
            resp=None,
            data={
                "session_id": session_id,
                "sampling_param": param,
                "token_ids": m.np.array(prompt, dtype=m.np.int64),
                "adapter_name": None,
                "input_multimodals": None,
                "input_embeddings": None,
                "migration_request": None,
                "with_cache": False,
                "preserve_cache": False,
            },
        )
        m.Engine._add_message(self.engine_view, [req])  # the engine's own insertion (caps max_new_tokens too)
        if self.engine_response_error is not None:
            raise RuntimeError(f"LMDeploy's Engine._add_message answered {self.engine_response_error}")
        seq = next(iter(s.get_session(session_id).sequences.values()))
        self.seqs[rid] = seq
        self.session_of[rid] = session_id
        self.meta[session_id] = {
            "req_id": rid,
            "eos": eos,
            "stops": set(stops),
            "ignore_eos": ignore_eos,
            "max_tokens": max_tokens,
            "num_prompt": len(prompt),
        }
        self.seen.add(rid)

    def abort(self, request_id: str) -> None:
        s = self._sched()
        require(
            isinstance(request_id, str) and request_id in self.seen,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
        )
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return  # already finished
        sid = self.session_of.pop(request_id)
        try:  # the engine's STOP_SESSION then END_SESSION (engine.py _on_stop_session / _on_end_session)
            s.stop_session(sid)
            s.end_session(sid)
        except Exception as exc:
            raise self._die("Scheduler.stop_session/end_session", exc) from exc
        self.reported.pop(request_id, None)
        self.admitted.discard(request_id)
        self.finished_since.add(request_id)
        if any(request_id in step["ids"] for step in self.in_flight_steps):
            self.aborted_in_pending.add(request_id)

    # ------------------------------------------------------------- schedule

    def _rid(self, seq: Any) -> str:
        return self.meta[seq.session_id]["req_id"]

    def _table(self, seq: Any) -> list[int]:
        return [int(b) + 1 for b in self.scheduler.block_manager.get_block_table(seq)]

    def schedule(self) -> dict[str, Any]:
        s = self._sched()
        require(
            len(self.in_flight_steps) < MAX_STEPS_IN_FLIGHT,
            "output_not_processed",
            f"schedule() called while {len(self.in_flight_steps)} steps await their output (LMDeploy's engine "
            f"loop has at most {MAX_STEPS_IN_FLIGHT}: the step running and the one prefetched)",
        )
        prefetch = bool(self.in_flight_steps)
        running_status = self.m.MessageStatus.RUNNING
        running_before = [seq for seq in self.seqs.values() if seq.status == running_status]
        maker = self.maker
        try:
            # InputsMakerAsync._send_next_inputs_impl (inputs_maker.py:1329-1345), minus executor.forward_async;
            # with a step in flight it is prefetch_next_inputs (inputs_maker.py:1350-1353, enable_empty=True)
            s.resume_completed_migrations()
            prefill = maker.do_prefill()
            forward_inputs = maker._make_forward_inputs(prefill, prefetch)
            if forward_inputs is None:
                running, inputs, delta = [], None, None
            else:
                running = forward_inputs.pop("running")
                inputs, delta = forward_inputs["inputs"], forward_inputs["delta"]
                maker._last_forward_kind = maker._forward_kind(inputs, delta)
                s.tick()
                if not prefetch:
                    self._dispatch(running, inputs, delta)
        except Exception as exc:
            raise self._die("engine step (InputsMakerAsync / Scheduler)", exc) from exc
        has_work = inputs is not None or delta is not None
        if not has_work:
            running = []
        ids = [id(seq) for seq in running]
        if len(set(ids)) != len(ids):
            self.dead = "a sequence scheduled twice in one step"
            raise RuntimeError("LMDeploy scheduled one sequence twice in one step")
        new_reqs: list[dict[str, Any]] = []
        cached: list[dict[str, Any]] = []
        num_scheduled: dict[str, int] = {}
        # A sequence the step in flight samples for has its token appended only when that step's output is
        # applied: the prefetched step computes from num_all_ids (inputs_maker.py:1188-1193, "num_all_ids can be
        # one decode step stale here").
        sampling_in_flight = {id(seq) for step in self.in_flight_steps if step["samples"] for seq in step["running"]}
        if inputs is not None:
            counts = [int(x) for x in inputs.seq_length.tolist()]
            computed = [int(x) for x in inputs.history_lengths.tolist()]
        else:
            counts = [1] * len(running)
            computed = [
                int(seq.num_all_ids if id(seq) in sampling_in_flight else seq.num_history_ids) for seq in running
            ]
        samples = inputs is None or not (inputs.is_chunk and not inputs.is_last_chunk)
        for seq, n, c in zip(running, counts, computed):
            outputs_so_far = int(seq.num_new_tokens) + (1 if id(seq) in sampling_in_flight else 0)
            rid = self._rid(seq)
            table = self._table(seq)
            num_scheduled[rid] = n
            before = self.reported.get(rid)
            if rid not in self.admitted:
                new_reqs.append({"req_id": rid, "block_ids": table, "num_computed_tokens": c})
                self.admitted.add(rid)
            elif before is not None and table[: len(before)] == before:
                cached.append(
                    {
                        "req_id": rid,
                        "resumed": False,
                        "new_block_ids": table[len(before) :],
                        "num_computed_tokens": c,
                        "num_output_tokens": outputs_so_far,
                    }
                )
            else:
                cached.append(
                    {
                        "req_id": rid,
                        "resumed": True,
                        "new_block_ids": table,
                        "num_computed_tokens": c,
                        "num_output_tokens": outputs_so_far,
                    }
                )
            self.reported[rid] = table
        scheduled_ids = {self._rid(seq) for seq in running}
        preempted = sorted(
            self._rid(seq) for seq in running_before if seq.status != running_status and self._rid(seq) in self.seqs
        )
        for rid in preempted:
            if rid not in scheduled_ids:
                self.reported.pop(rid, None)
        finished, self.finished_since = sorted(self.finished_since), set()
        self.current_step += 1
        self.in_flight_steps.append(
            {
                "step": self.current_step,
                "running": running,
                "inputs": inputs,
                "delta": delta,
                "samples": samples,
                "ids": scheduled_ids,
                "dispatched": not prefetch,
            }
        )
        return {
            "scheduled_new_reqs": new_reqs,
            "scheduled_cached_reqs": cached,
            "num_scheduled_tokens": dict(sorted(num_scheduled.items())),
            "total_num_scheduled_tokens": sum(num_scheduled.values()),
            "scheduled_spec_decode_tokens": {},
            "finished_req_ids": finished,
            "preempted_req_ids": None if self.profile in NO_PREEMPTED_FIELD_PROFILES else preempted,
        }

    # --------------------------------------------------------------- update

    def _dispatch(self, running: list[Any], inputs: Any, delta: Any) -> None:
        """What the engine loop does to a step once it is the one running: ``scheduler.activate_seqs``
        (engine_loop.py:551) and ``InputsMakerAsync.update_running_seqs`` (engine_loop.py:496-497)."""
        self.scheduler.activate_seqs(running)
        if inputs is not None or delta is not None:
            self.maker.update_running_seqs(running, inputs)

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        self._sched()
        sampled, drafts = sampled_token_ids, draft_token_ids
        if step is not None:
            require(
                is_token_id(step) and 0 < step <= self.current_step,
                "unscheduled_step",
                f"model output for step {step}, which was never scheduled",
            )
            in_flight = [st["step"] for st in self.in_flight_steps]
            require(step in in_flight, "duplicate_model_output", f"the output of step {step} was already applied")
            require(
                step == in_flight[0],
                "model_output_out_of_order",
                f"model output for step {step} while step {in_flight[0]} is still in flight",
            )
        require(bool(self.in_flight_steps), "unexpected_model_output", "update without a pending step")
        require(
            isinstance(sampled, dict) and isinstance(drafts, dict),
            "invalid_field_type",
            "sampled_token_ids and draft_token_ids must be objects",
        )
        pending = self.in_flight_steps[0]
        for rid, tokens in sampled.items():
            require(
                rid in pending["ids"],
                "unscheduled_model_output",
                f"sampled tokens for {rid!r}, which was not scheduled",
            )
            require(isinstance(tokens, list), "invalid_field_type", "sampled tokens must be a list")
            for token in tokens:
                require(is_token_id(token), "invalid_token_id", "sampled token ids must be non-negative integers")
            require(
                len(tokens) <= 1,
                "bad_num_sampled_tokens",
                f"request {rid!r} may sample at most 1 token (no drafts), got {len(tokens)}",
            )
            require(
                pending["samples"] or not tokens,
                "bad_num_sampled_tokens",
                f"request {rid!r}: a prefill chunk samples no token",
            )
        for _rid in drafts:
            require(False, "drafts_without_spec_decode", "draft tokens given but num_spec_tokens is 0")
        running = pending["running"]
        live_ids = [self._rid(seq) for seq in running]
        live = [
            (rid, seq)
            for rid, seq in zip(live_ids, running)
            if rid not in self.aborted_in_pending and self.seqs.get(rid) is seq
        ]
        if pending["samples"]:
            for rid, seq in live:
                tokens = sampled.get(rid, [])
                if not tokens:
                    raise SutUnsupported(
                        f"request {rid!r} sampled no token: LMDeploy's model agent samples one "
                        "token for every sequence of a prefill or decode forward"
                    )
                meta = self.meta[seq.session_id]
                if meta["ignore_eos"] and tokens[0] in meta["stops"]:
                    raise SutUnsupported(
                        f"request {rid!r} sampled its stop token {tokens[0]} under ignore_eos: "
                        "LMDeploy's ignore_eos turns every stop word into a bad word "
                        "(messages.py SamplingParam.from_gen_config), so it cannot be sampled"
                    )
        self.in_flight_steps.pop(0)
        still = {rid for st in self.in_flight_steps for rid in st["ids"]}
        self.aborted_in_pending &= still
        result = self._apply_output(pending, sampled, live) if pending["samples"] and running else []
        try:
            self.maker.preempt_invalid_decode_seqs()  # engine_loop.py:556, after every step's output
            if self.in_flight_steps and not self.in_flight_steps[0]["dispatched"]:
                # the prefetched step becomes the running one (engine_loop.py:551 then 496-497)
                nxt = self.in_flight_steps[0]
                nxt["dispatched"] = True
                self._dispatch(nxt["running"], nxt["inputs"], nxt["delta"])
        except Exception as exc:
            raise self._die("engine loop (preempt_invalid_decode_seqs / activate_seqs)", exc) from exc
        return result

    def _apply_output(
        self, pending: dict[str, Any], sampled: dict[str, list[int]], live: list[tuple[str, Any]]
    ) -> list[dict[str, Any]]:
        """``EngineLoop._finish_forward_output`` (engine_loop.py:465-482) for one step's sampled tokens."""
        s = self.scheduler
        running = pending["running"]
        m = self.m
        torch = m.torch
        token_list = [sampled.get(self._rid(seq), [0])[0] if self._rid(seq) in sampled else 0 for seq in running]
        next_token_ids = torch.tensor(token_list, dtype=torch.long)
        try:
            # ARModelAgentStrategy: stopping criteria of this batch, then one step (the model agent's stop rule)
            criteria = self.agent_strategy.make_stopping_criteria(running)
            width = max([len(seq.sampling_param.stop_words) for seq in running] + [0])
            stop_words = None
            if width:
                stop_words = torch.full((len(running), width), -1, dtype=torch.long)
                for i, seq in enumerate(running):
                    sw = seq.sampling_param.stop_words
                    if sw:
                        stop_words[i, : len(sw)] = torch.tensor(sw, dtype=torch.long)
            stopped, _stop_pos, _ = criteria.step(next_token_ids, stop_words)
            outputs = types.SimpleNamespace(
                next_token_ids=next_token_ids, stopped=stopped, model_metas=None, all_routed_experts=None
            )
            self.seq_strategy.update_running(
                running=running, batched_outputs=outputs, model_inputs=pending["inputs"], delta=pending["delta"]
            )
            s.release_completed_prefill_reservations(running)
        except Exception as exc:
            raise self._die("output update (ARSequenceStrategy.update_running)", exc) from exc
        result: list[dict[str, Any]] = []
        stopped_status = m.MessageStatus.STOPPED
        for rid, seq in live:
            token = sampled[rid][0]
            meta = self.meta[seq.session_id]
            reason = stop_reason = None
            if seq.status == stopped_status:
                if token in seq.sampling_param.stop_words:
                    reason = "stop"
                    stop_reason = None if token == meta["eos"] else token
                else:
                    reason = "length"
                    outputs_done = int(seq.num_new_tokens)
                    if (
                        outputs_done < meta["max_tokens"]
                        and meta["num_prompt"] + outputs_done < self.config["max_model_len"]
                    ):
                        raise SutUnsupported(
                            f"LMDeploy ended request {rid!r} at its session length {self.session_len} "
                            f"({self._session_len_why()}; Engine._add_message caps max_new_tokens, engine.py:469-480)"
                            f"after {outputs_done} of its {meta['max_tokens']} tokens"
                        )
                sid = self.session_of.pop(rid)
                try:
                    s.end_session(sid)  # END_SESSION after a finished non-interactive request
                except Exception as exc:
                    raise self._die("Scheduler.end_session", exc) from exc
                self.seqs.pop(rid, None)
                self.reported.pop(rid, None)
                self.admitted.discard(rid)
                self.finished_since.add(rid)
            result.append(
                {"req_id": rid, "new_token_ids": [token], "finish_reason": reason, "stop_reason": stop_reason}
            )
        return result

    # -------------------------------------------------------------- observe

    def _trie_blocks(self) -> list[int]:
        trie = self.scheduler.block_trie
        out: list[int] = []
        stack = list(getattr(trie, "_roots", {}).values())
        while stack:
            node = stack.pop()
            if node.block_id >= 0:
                out.append(int(node.block_id))
            stack.extend(node.children.values())
        return out

    def observe(self) -> dict[str, Any]:
        s = self._sched()
        bm = s.block_manager
        gpu = bm.allocator.get_phy_allocator("gpu")
        num_used = gpu._num_blocks - gpu._free_count
        free = [int(b) + 1 for b in gpu._free_blocks[num_used:]]
        tables = {rid: self._table(seq) for rid, seq in sorted(self.seqs.items()) if seq.num_blocks > 0}
        held = {b for t in tables.values() for b in t}
        trie_logical = self._trie_blocks()
        trie_only: list[int] = []
        if trie_logical:
            np = self.m.np
            logical = np.array(trie_logical, dtype=np.int64)
            refs = bm.allocator.get_ref_count(logical)
            phys = bm.allocator.get_physical_blocks(logical)
            trie_only = sorted({int(p) + 1 for p, r in zip(phys, refs) if r == 1 and int(p) + 1 not in held})
        queue = free + [b for b in trie_only if b not in free]
        return {"free_block_queue": queue, "num_free_blocks": len(queue), "block_tables": tables}

    def close(self) -> None:
        self.scheduler = None


# -------------------------------------------------------------------- serve


def serve_stdio() -> int:
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    lmd = _Lmd()
    return serve(lambda: LmdeploySchedulerSut(lmd), stdin=sys.stdin, stdout=proto_out)


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(lmd: _Lmd) -> str | None:
        first, second = run_two_steps(LmdeploySchedulerSut(lmd), "vllm-0.33")
        ok = (
            first["num_scheduled_tokens"] == {"a": 10}
            and first["scheduled_new_reqs"][0]["num_computed_tokens"] == 0
            and second["num_scheduled_tokens"] == {"a": 1}
            and second["scheduled_cached_reqs"][0]["num_computed_tokens"] == 10
        )
        return None if ok else f"unexpected outputs {first} / {second}"

    return run_self_check(
        "lmdeploy",
        expect_version,
        _Lmd,
        exercise,
        lambda lmd: f"lmdeploy {lmd.version} (PyTorch engine Scheduler)",
    )


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.lmdeploy_driver",
        engine="lmdeploy",
        default_env=OFFLINE_ENV,
        description="Serve LMDeploy's scheduler over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
    )


if __name__ == "__main__":
    main()
