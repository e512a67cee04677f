"""Record what a live vLLM engine's scheduler does: one JSON line per scheduler call.

Runs INSIDE the engine's process (vLLM's environment, this checkout on
``PYTHONPATH``), loaded by ``conformance/live/boot/sitecustomize.py`` when
``SCHEDCONF_RECORD`` names a folder. :func:`install` puts an import hook on
``sys.meta_path``; when the process imports ``vllm.v1.core.sched.scheduler``
the hook lets the module run, then wraps these methods of its ``Scheduler``
class (``AsyncScheduler`` inherits them):

``__init__``, ``add_request``, ``finish_requests``, ``schedule``,
``update_from_output``, ``update_draft_token_ids``, ``reset_prefix_cache``,
``set_pause_state``.

Only calls from outside the scheduler are recorded (a call the scheduler makes
to itself, such as ``finish_requests`` from ``add_request``, is part of the
outer call). The engine's behaviour is unchanged: a wrapper calls the original
method with the same arguments and returns its result; a failure of the
recorder itself is written as an ``error`` line, never raised into vLLM.

The recording (``DIR/engine-<pid>-<n>.jsonl``, one file per scheduler built)
is JSON Lines. Each line is made in the scheduler's call (what it records is
read there), then written and flushed by a thread of the recorder's own, so
that the file's write leaves the engine's step; a call that raises, and the
process's exit, wait until every line made so far is on disk. A crash leaves
the recording readable up to the crash (a process killed outright loses at
most the lines of its last moments, which the sequence numbers cannot tell
from an earlier end). Every line has ``seq`` (0, 1, 2, ... without a gap: a missing
number is a lost line) and ``call``:

``start`` (seq 0)
    ``format`` ``"schedconf-recording"``, ``version`` 1, ``vllm_version``,
    ``scheduler_class``, ``config`` (the schedconf config read back from the
    built scheduler: every field of ``spec/v1/config.py``), ``engine`` (what
    decides the model's scope: KV-cache groups, connectors, parallelism,
    async scheduling, log_stats, the model runner layout), ``observe``
    (whether steps carry the free queue), ``pid``, ``time``.
``add_request``
    ``request``: ``request_id``, ``prompt_token_ids``, ``max_tokens``,
    ``min_tokens``, ``stop_token_ids``, ``eos_token_id`` (what
    ``check_stop`` compares: None under ``ignore_eos``), ``ignore_eos``,
    ``priority``, ``arrival_time`` (the engine's own); ``unsupported``: the
    request's features outside the model (structured output, LoRA,
    multimodal, pooling, ``cache_salt``, skipped prefix-cache reads, ...).
``finish_requests``
    ``request_ids`` (a list, or null for "all"), ``status`` (vLLM's name,
    ``FINISHED_ABORTED`` from the engine), ``finished``: the ids it finished.
``schedule``
    ``step`` (1, 2, ... per scheduler), ``output``: the canonical
    SchedulerOutput (``schedconf.conformance.engines.vllm_driver``'s conversion), ``observe``
    (the free queue, when enabled), ``in_flight`` (steps scheduled whose
    output was not applied yet, this one included).
``update_from_output``
    ``step`` (which schedule() the output answers: under async scheduling
    the engine applies the output of an older step after scheduling a newer
    one), ``sampled_token_ids`` (request id -> tokens, scheduled requests
    only, empty lists left out), ``outputs`` (the canonical request outputs
    vLLM returned, in its order) and ``stats`` (SchedulerStats, when the
    engine logs them).
``update_draft_token_ids``
    ``draft_token_ids``: request id -> drafts for the next step.
``reset_prefix_cache``
    ``reset_running_requests``, ``reset_connector`` and ``result`` (vLLM's success).
``set_pause_state``
    ``pause_state`` (a paused engine is outside the model's scope).

A call that raised has ``raised``: the exception, as text. A line the recorder
could not build is ``{"seq": N, "call": ..., "error": "..."}``.

Environment: ``SCHEDCONF_RECORD`` (the folder; created),
``SCHEDCONF_RECORD_OBSERVE=1`` to add each step's free block queue (walks
the free list: O(free blocks) per step), and the experiment
``SCHEDCONF_CPU_ASYNC_SCHEDULING=1`` (:func:`keep_cpu_async_scheduling`).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import itertools
import json
import os
import queue
import sys
import threading
import time
import types
from typing import Any, cast

TARGET_MODULE = "vllm.v1.core.sched.scheduler"
CPU_PLATFORM_MODULE = "vllm.platforms.cpu"
RECORDING_FORMAT = "schedconf-recording"
RECORDING_VERSION = 1
WRAPPED_METHODS = (
    "add_request",
    "finish_requests",
    "schedule",
    "update_from_output",
    "update_draft_token_ids",
    "reset_prefix_cache",
    "set_pause_state",
)

_installed: dict[str, Any] = {}
_PATCHES: dict[str, Any] = {}
"""Module name -> the function that patches it right after it ran."""
_counter = itertools.count()


# ------------------------------------------------------------- import hook


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then wraps the Scheduler class of the module it ran."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        _PATCHES[module.__name__](module)


class _SchedulerFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``_PATCHES`` with the path finder and hands back a patching loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def keep_cpu_async_scheduling(module: types.ModuleType) -> None:
    """EXPERIMENT (``SCHEDCONF_CPU_ASYNC_SCHEDULING=1``): undo the CPU platform's ``async_scheduling = False``.

    ``CpuPlatform.check_and_update_config`` (vllm/platforms/cpu.py) turns async
    scheduling off unconditionally; it runs where the config is built (the
    front end) and the engine core receives the result. This restores what the
    user asked for (``--async-scheduling``) after it ran. The only change to
    the engine's behaviour this package makes, and only when asked.
    """
    platform = getattr(module, "CpuPlatform", None)
    if platform is None or getattr(platform, "_schedconf_async", False):
        return
    original = platform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        asked = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
        original(cls, vllm_config)
        if asked:
            vllm_config.scheduler_config.async_scheduling = True

    platform.check_and_update_config = classmethod(check_and_update_config)
    platform._schedconf_async = True


def install(folder: str) -> None:
    """Record every vLLM scheduler this process builds into ``folder`` (idempotent)."""
    if _installed:
        return
    _installed["folder"] = folder
    _installed["observe"] = os.environ.get("SCHEDCONF_RECORD_OBSERVE") == "1"
    _PATCHES[TARGET_MODULE] = patch_scheduler_class
    if os.environ.get("SCHEDCONF_CPU_ASYNC_SCHEDULING") == "1":
        _PATCHES[CPU_PLATFORM_MODULE] = keep_cpu_async_scheduling
    for name, patch in list(_PATCHES.items()):
        module = sys.modules.get(name)
        if module is not None:  # imported before us: patch it in place
            patch(module)
    sys.meta_path.insert(0, _SchedulerFinder())


def patch_scheduler_class(module: types.ModuleType) -> None:
    """Wrap the methods of ``module.Scheduler`` (once)."""
    cls = getattr(module, "Scheduler", None)
    if cls is None or getattr(cls, "_schedconf_recorded", False):
        return
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original_init(self, *args, **kwargs)
        if "_schedconf_rec" in self.__dict__:
            return
        try:
            self._schedconf_rec = Recording(
                self,
                _installed.get("folder") or os.environ["SCHEDCONF_RECORD"],
                observe=bool(_installed.get("observe")),
            )
        except Exception as exc:  # noqa: BLE001 - never stop the engine
            print(f"schedconf: cannot record this scheduler: {type(exc).__name__}: {exc}", file=sys.stderr)

    cls.__init__ = __init__
    for name in WRAPPED_METHODS:
        method = getattr(cls, name, None)
        if method is not None:
            setattr(cls, name, _wrap(name, method))
    cls._schedconf_recorded = True


def _wrap(name: str, method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec: Recording | None = self.__dict__.get("_schedconf_rec")
        if rec is None or rec.depth:
            return method(self, *args, **kwargs)
        rec.depth += 1
        try:
            started = time.perf_counter()
            before = rec.before(name, args, kwargs)
            called = time.perf_counter()
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                rec.after(name, args, kwargs, before, None, exc)
                raise
            returned = time.perf_counter()
            rec.after(name, args, kwargs, before, result, None)
            rec.own_seconds += (called - started) + (time.perf_counter() - returned)
            return result
        finally:
            rec.depth -= 1

    return wrapper


# --------------------------------------------------------------- recording


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


class LineWriter:
    """Writes a recording's lines on a thread of its own: the engine's call only queues them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the scheduler's lifetime
        self.lines: queue.SimpleQueue[str | threading.Event] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="schedconf-recorder", daemon=True)
        self.thread.start()
        atexit.register(self.drain)

    def put(self, line: str) -> None:
        self.lines.put(line)

    def drain(self, timeout_s: float = 10.0) -> None:
        """Return once every line queued so far is written and flushed (or the writer is gone)."""
        done = threading.Event()
        self.lines.put(done)
        if self.thread.is_alive():
            done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            item = self.lines.get()
            batch = [item]
            while True:  # what else is queued goes in the same write and flush
                try:
                    batch.append(self.lines.get_nowait())
                except queue.Empty:
                    break
            text = "".join(line for line in batch if isinstance(line, str))
            try:
                if text:
                    self.file.write(text)
                    self.file.flush()
            except (OSError, ValueError) as exc:
                print(f"schedconf: cannot write {self.path}: {exc}", file=sys.stderr)
            for line in batch:
                if isinstance(line, threading.Event):
                    line.set()


class Recording:
    """The recording of one scheduler: its file, sequence numbers and steps in flight."""

    def __init__(self, scheduler: Any, folder: str, observe: bool = False) -> None:
        from schedconf.conformance.engines.vllm_driver import get_canonical_output

        self.scheduler = scheduler
        self.observe = observe
        self.depth = 0
        self.seq = 0
        self.step = 0
        self.lock = threading.Lock()
        self.in_flight: dict[int, tuple[int, Any]] = {}  # id(SchedulerOutput) -> (step, output)
        self._canonical_output = lambda out: get_canonical_output(out, scheduler.requests)
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"engine-{os.getpid()}-{next(_counter)}.jsonl")
        self.writer = LineWriter(self.path)
        self.own_seconds = 0.0  # time spent in the recorder, inside the scheduler's calls
        self.emit({"call": "start"}, self.describe_start)
        if os.environ.get("SCHEDCONF_RECORD_TIMING") == "1":
            atexit.register(self.report_timing)
        print(f"schedconf: recording the scheduler into {self.path}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------- writing

    def emit(self, head: dict[str, Any], build: Any = None) -> None:
        """Write one line: ``head`` plus what ``build()`` returns; a failure becomes an ``error`` line."""
        with self.lock:
            seq = self.seq
            self.seq += 1
            line: str
            try:
                body = dict(head)
                if build is not None:
                    body.update(build())
                body["seq"] = seq
                line = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_jsonable)
            except Exception as exc:  # noqa: BLE001 - the line says what was lost
                line = json.dumps(
                    {"seq": seq, "call": head.get("call"), "error": f"{type(exc).__name__}: {exc}"},
                    sort_keys=True,
                    separators=(",", ":"),
                )
            self.writer.put(line + "\n")
        if "raised" in head:  # the engine may die of this call: its line first
            self.writer.drain()

    def report_timing(self) -> None:
        """One stderr line: the recorder's own time in the scheduler's calls (``SCHEDCONF_RECORD_TIMING=1``)."""
        print(
            f"schedconf-recorder-timing {json.dumps({'seconds': self.own_seconds, 'steps': self.step})}",
            file=sys.stderr,
            flush=True,
        )

    def describe_start(self) -> dict[str, Any]:
        import vllm

        s = self.scheduler
        return {
            "format": RECORDING_FORMAT,
            "version": RECORDING_VERSION,
            "vllm_version": vllm.__version__,
            "scheduler_class": f"{type(s).__module__}.{type(s).__qualname__}",
            "config": read_config(s),
            "engine": read_engine(s),
            "observe": self.observe,
            "pid": os.getpid(),
            "time": time.time(),
        }

    # --------------------------------------------------------------- calls

    def before(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What must be read before the call runs (the request's fields, the ids asked to finish)."""
        if name == "add_request":
            return read_request(_arg(args, kwargs, 0, "request"))
        if name == "finish_requests":
            ids = _arg(args, kwargs, 0, "request_ids")
            if isinstance(ids, str):
                return [ids]
            return None if ids is None else [str(i) for i in ids]
        return None

    def after(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        before: Any,
        result: Any,
        exc: BaseException | None,
    ) -> None:
        head: dict[str, Any] = {"call": name}
        if exc is not None:
            head["raised"] = f"{type(exc).__name__}: {exc}"
        builder = getattr(self, f"_build_{name}")
        self.emit(head, lambda: builder(args, kwargs, before, result, exc))

    def _build_add_request(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        request, unsupported = before
        return {"request": request, "unsupported": unsupported}

    def _build_finish_requests(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        status = _arg(args, kwargs, 1, "finished_status")
        finished = [r.request_id for r in result] if isinstance(result, list) else None
        return {"request_ids": before, "status": getattr(status, "name", str(status)), "finished": finished}

    def _build_schedule(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        if exc is not None:
            return {"step": self.step + 1}
        self.step += 1
        self.in_flight[id(result)] = (self.step, result)
        body: dict[str, Any] = {
            "step": self.step,
            "output": self._canonical_output(result),
            "in_flight": len(self.in_flight),
        }
        throttle = _arg(args, kwargs, 0, "throttle_prefills", False)
        if throttle:
            body["throttle_prefills"] = True
        if self.observe:
            pool = self.scheduler.kv_cache_manager.block_pool
            body["observe"] = {
                "free_block_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                "num_free_blocks": pool.get_num_free_blocks(),
            }
        return body

    def _build_update_from_output(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        out = _arg(args, kwargs, 0, "scheduler_output")
        runner = _arg(args, kwargs, 1, "model_runner_output")
        step, _ = self.in_flight.pop(id(out), (None, None))
        scheduled = out.num_scheduled_tokens
        sampled: dict[str, list[int]] = {}
        tokens = getattr(runner, "sampled_token_ids", None) or []
        for rid, index in (getattr(runner, "req_id_to_index", None) or {}).items():
            if rid in scheduled and index < len(tokens) and len(tokens[index]):
                sampled[rid] = [int(t) for t in tokens[index]]
        body: dict[str, Any] = {"step": step, "sampled_token_ids": dict(sorted(sampled.items()))}
        if exc is None:
            body["outputs"] = canonical_request_outputs(result)
            stats = canonical_stats(result)
            if stats is not None:
                body["stats"] = stats
        return body

    def _build_update_draft_token_ids(
        self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any
    ) -> dict[str, Any]:
        drafts = _arg(args, kwargs, 0, "draft_token_ids")
        ids = list(getattr(drafts, "req_ids", []) or [])
        tokens = list(getattr(drafts, "draft_token_ids", []) or [])
        return {"draft_token_ids": {rid: [int(t) for t in toks] for rid, toks in zip(ids, tokens)}}

    def _build_reset_prefix_cache(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        return {
            "reset_running_requests": bool(_arg(args, kwargs, 0, "reset_running_requests", False)),
            "reset_connector": bool(_arg(args, kwargs, 1, "reset_connector", False)),
            "result": result if isinstance(result, bool) else repr(result),
        }

    def _build_set_pause_state(self, args: Any, kwargs: Any, before: Any, result: Any, exc: Any) -> dict[str, Any]:
        state = _arg(args, kwargs, 0, "pause_state")
        return {"pause_state": getattr(state, "name", str(state))}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


# ------------------------------------------------------------------ readers


def read_config(s: Any) -> dict[str, Any]:
    """The schedconf config (spec/v1/config.py fields) read back from a built scheduler."""
    vc = s.vllm_config
    groups = s.kv_cache_config.kv_cache_groups
    block_size = groups[0].kv_cache_spec.block_size if len(groups) == 1 else vc.cache_config.block_size
    max_running = s.max_num_running_reqs
    active = getattr(s, "max_num_active_reqs", max_running)
    return {
        "block_size": int(block_size),
        "num_gpu_blocks": int(s.kv_cache_manager.block_pool.num_gpu_blocks),
        "max_num_batched_tokens": int(s.max_num_scheduled_tokens),
        "max_num_seqs": int(max_running),
        "max_model_len": int(s.max_model_len),
        "enable_chunked_prefill": bool(vc.scheduler_config.enable_chunked_prefill),
        "long_prefill_token_threshold": int(vc.scheduler_config.long_prefill_token_threshold),
        "enable_prefix_caching": bool(vc.cache_config.enable_prefix_caching),
        "policy": str(getattr(s.policy, "value", s.policy)),
        "num_spec_tokens": int(getattr(s, "num_spec_tokens", 0) or 0),
        "num_lookahead_tokens": int(getattr(s, "num_lookahead_tokens", 0) or 0),
        "scheduler_reserve_full_isl": (
            bool(s.scheduler_reserve_full_isl) if hasattr(s, "scheduler_reserve_full_isl") else None
        ),
        "max_concurrent_batches": int(getattr(vc, "max_concurrent_batches", 1)),
        "max_num_active_seqs": None if active == max_running else int(active),
        "long_prefill_token_threshold_adaptive": bool(getattr(s, "adaptive_long_prefill_threshold", False)),
        "use_v2_model_runner": bool(getattr(s, "use_v2_model_runner", False)),
    }


def read_engine(s: Any) -> dict[str, Any]:
    """What of the engine decides whether the model covers it (see schedconf.conformance.live.convert.get_scope_problems)."""
    vc = s.vllm_config
    pc = vc.parallel_config
    spec = getattr(vc, "speculative_config", None)
    return {
        "num_kv_cache_groups": len(s.kv_cache_config.kv_cache_groups),
        "kv_cache_spec": type(s.kv_cache_config.kv_cache_groups[0].kv_cache_spec).__name__
        if s.kv_cache_config.kv_cache_groups
        else None,
        "kv_connector": getattr(s, "connector", None) is not None,
        "ec_connector": getattr(s, "ec_connector", None) is not None,
        "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
        "pipeline_parallel_size": int(getattr(pc, "pipeline_parallel_size", 1)),
        "data_parallel_size": int(getattr(pc, "data_parallel_size", 1)),
        "log_stats": bool(getattr(s, "log_stats", False)),
        "speculative_method": getattr(spec, "method", None) if spec is not None else None,
        "prefix_caching_hash_algo": str(getattr(vc.cache_config, "prefix_caching_hash_algo", "")),
        "model": str(getattr(vc.model_config, "model", "")),
    }


def read_request(request: Any) -> tuple[dict[str, Any], list[str]]:
    """The trace fields of a vLLM ``Request`` and the features it uses that the model does not cover."""
    sp = request.sampling_params
    unsupported = []
    if sp is None:
        unsupported.append("pooling request")
    checks = (
        ("pooling request", getattr(request, "pooling_params", None) is not None),
        ("LoRA adapter", getattr(request, "lora_request", None) is not None),
        ("multimodal input", bool(getattr(request, "mm_features", None))),
        ("structured output", getattr(request, "structured_output_request", None) is not None),
        ("cache_salt", getattr(request, "cache_salt", None) is not None),
        ("KV transfer", getattr(request, "kv_transfer_params", None) is not None),
        ("streaming input (resumable)", bool(getattr(request, "resumable", False))),
        ("prompt embeddings", getattr(request, "prompt_embeds", None) is not None),
        ("repetition detection", getattr(sp, "repetition_detection", None) is not None),
    )
    unsupported += [what for what, used in checks if used]
    try:
        if request.skip_reading_prefix_cache:
            unsupported.append("skips prefix-cache reads (prompt logprobs)")
    except Exception:  # noqa: BLE001, S110 - an attribute this release lacks
        pass
    max_tokens = getattr(request, "max_tokens", None)
    if max_tokens is None and sp is not None:
        max_tokens = sp.max_tokens
    fields = {
        "request_id": str(request.request_id),
        "prompt_token_ids": [int(t) for t in (request.prompt_token_ids or [])],
        "max_tokens": int(max_tokens or 0),
        "min_tokens": int(getattr(sp, "min_tokens", 0) or 0),
        "stop_token_ids": [int(t) for t in (getattr(sp, "stop_token_ids", None) or [])],
        "eos_token_id": getattr(sp, "eos_token_id", None),
        "ignore_eos": bool(getattr(sp, "ignore_eos", False)),
        "priority": int(getattr(request, "priority", 0) or 0),
        "arrival_time": float(request.arrival_time),
    }
    return fields, unsupported


def canonical_request_outputs(engine_outputs: Any) -> list[dict[str, Any]]:
    """vLLM's ``{client_index: EngineCoreOutputs}`` as the trace's request outputs, in vLLM's order."""
    results: list[dict[str, Any]] = []
    for client_index in sorted(engine_outputs or {}):
        for o in engine_outputs[client_index].outputs:
            reason, stop = o.finish_reason, o.stop_reason
            results.append(
                {
                    "req_id": o.request_id,
                    "new_token_ids": [int(t) for t in o.new_token_ids],
                    "finish_reason": None if reason is None else str(reason),
                    "stop_reason": stop
                    if stop is None or (isinstance(stop, int) and not isinstance(stop, bool))
                    else str(stop),
                }
            )
    return results


def canonical_stats(engine_outputs: Any) -> dict[str, Any] | None:
    """The SchedulerStats of one update in the trace's form, or None (the driver's conversion)."""
    from schedconf.conformance.engines.vllm_driver import VllmSchedulerSut

    # A stand-in self: _canonical_stats reads nothing of it but .reports_stats().
    holder = cast(VllmSchedulerSut, types.SimpleNamespace(reports_stats=lambda: True))
    try:
        return VllmSchedulerSut._canonical_stats(holder, engine_outputs or {})
    except AttributeError:  # a release whose stats have another shape
        return None
