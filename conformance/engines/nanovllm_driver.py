"""Serve nano-vllm's own ``Scheduler`` over the schedconf JSON-lines protocol.

Runs INSIDE the environment built by ``schedconf env nano-vllm VERSION``
(``.venvs/nano-vllm-VERSION``, the PyPI distribution ``nano-vllm-fork``), as
``<venv python> -m schedconf.conformance.engines.nanovllm_driver`` with the repository
root on ``PYTHONPATH`` (``schedconf.conformance.adapters.nanovllm`` starts it). It
imports the standard library, nano-vllm's ``nanovllm.engine.scheduler``,
``block_manager``, ``sequence`` and ``sampling_params`` modules, and
``schedconf.conformance.protocol_server``; never ``spec/``.

What is bypassed, and why:

* ``nanovllm/__init__.py`` is not run: it imports the whole LLM engine
  (``nanovllm.llm`` -> ``model_runner`` -> torch, triton and ``flash_attn``,
  which has no CPU build). The driver registers the ``nanovllm`` package
  object with its real ``__path__`` and imports the scheduler modules from the
  installed files; those need only xxhash, numpy and transformers.
* ``nanovllm.config.Config`` is imported (``scheduler.py`` imports it) but not
  instantiated: its ``__post_init__`` asserts a model folder, loads the model's
  ``AutoConfig`` and asserts ``kvcache_block_size % 256 == 0`` (a flash-attn
  paged-KV kernel rule; the scheduler and block manager work with any block
  size). ``Scheduler(config)`` reads exactly five fields (``max_num_seqs``,
  ``max_num_batched_tokens``, ``eos``, ``num_kvcache_blocks``,
  ``kvcache_block_size``), so it gets a plain namespace carrying them.
* The model runner: the protocol's ``update`` supplies the sampled tokens that
  ``LLMEngine.step`` would get from ``model_runner.run``.

Mapping (PROTOCOL.md -> nano-vllm):

``init``
    ``Scheduler`` over ``num_gpu_blocks - 1`` blocks: vLLM's pool holds block
    0 back as the null block and nano-vllm has none, so the usable pools are
    the same size. Block ids are reported **plus one** (nano-vllm block ``i``
    is protocol block ``i + 1``), so they fall in vLLM's range ``1..n-1``.
    ``Sequence.block_size`` (a class attribute) is set to the trace's block
    size. ``max_num_seqs`` and ``max_num_batched_tokens`` map one to one (note:
    nano-vllm's ``max_num_seqs`` caps the sequences of one batch, not the
    running ones). Configs are refused with the protocol's codes first (field
    types and ranges, ``budget_below_max_model_len``, and
    ``pool_below_max_model_len``: the ``n - 1`` blocks must hold one
    ``max_model_len`` sequence). ``unsupported`` (verdict unknown) for what
    nano-vllm cannot express: ``block_size < 2`` (``may_append`` detects the
    first token of a new block by ``len % block_size == 1``, never true for
    1: decode would never allocate and its hash assertion fails; nano-vllm's
    Config only allows multiples of 256), ``policy: priority`` (FCFS only),
    ``num_spec_tokens > 0``, ``num_lookahead_tokens > 0``,
    ``long_prefill_token_threshold > 0``, ``enable_chunked_prefill: true``
    (it always prefills whole sequences) and ``enable_prefix_caching: false``
    (it always caches). ``scheduler_reserve_full_isl`` is accepted either way:
    with whole-sequence prefill, admission always needs blocks for the whole
    current sequence (``BlockManager.can_allocate``). Any ``profile`` is
    accepted; ``preempted_req_ids`` is null under ``vllm-0.11`` (no such field).
``add_request``
    Validated with the protocol's codes (nano-vllm checks nothing), then
    ``Scheduler.add(Sequence(prompt, SamplingParams(max_tokens, ignore_eos)))``.
    nano-vllm has no per-request EOS (``Scheduler.eos`` is the tokenizer's), no
    ``stop_token_ids``, no ``min_tokens`` and no ``max_model_len`` stop:
    ``max_tokens`` is capped at ``max_model_len - len(prompt)`` (the
    protocol's length limit; without it a sequence could outgrow the pool and
    nano-vllm's ``schedule()`` would fail its ``assert scheduled_seqs``
    forever); the EOS of each request is set as ``Scheduler.eos`` just before
    its own ``postprocess`` call; stop ids and ``min_tokens`` are accepted, and
    the first ``update`` at which one of them would change the outcome (a
    sampled stop id, or EOS before ``min_tokens``) is answered ``unsupported``.
``abort``
    nano-vllm has no abort: the driver removes the sequence from ``waiting``
    and ``running`` (every occurrence), frees its blocks with
    ``BlockManager.deallocate`` and marks it FINISHED. An id never added is
    ``unknown_request_id``; a finished one is ignored. Aborted ids are
    reported in the next ``finished_req_ids``.
``schedule``
    With no request waiting or running, an empty output without calling
    nano-vllm (its engine loop never steps then; ``schedule()`` would assert).
    Otherwise ``Scheduler.schedule()`` -> ``(seqs, is_prefill)``. A prefill
    step: a sequence admitted for the first time is a ``scheduled_new_reqs``
    entry (all its blocks, ``num_computed_tokens`` = its prefix hit
    ``num_cached_tokens``); one admitted again after a preemption is a
    ``scheduled_cached_reqs`` entry with ``resumed: true`` and all its blocks.
    A decode step: every sequence is a cached entry with the block
    ``may_append`` added (if any), ``num_computed_tokens = len - 1``.
    ``num_scheduled_tokens`` is ``len - num_cached_tokens`` (prefill) or 1.
    ``preempted_req_ids``: the sequences RUNNING before the call and WAITING
    after it. ``finished_req_ids``: finished or aborted since the previous
    step. If ``schedule()`` raises or returns a sequence twice, nano-vllm's
    engine would die or corrupt its state: the reply is ``internal`` (with the
    failing line) and every later call ``engine_dead`` until the next ``init``.
``update``
    Validated (``unexpected_model_output``, ``unscheduled_model_output``,
    ``invalid_token_id``, ``bad_num_sampled_tokens`` above one token,
    ``drafts_without_spec_decode``); a scheduled live sequence that samples
    nothing is ``unsupported`` (nano-vllm's runner always samples one token per
    sequence, and its block accounting assumes it). Then nano-vllm's own
    ``Scheduler.postprocess([seq], [token])`` per sequence, in scheduled order
    (its stop rule: EOS unless ``ignore_eos``, or ``max_tokens`` reached).
    The outputs: one per sequence, ``finish_reason`` ``stop`` when it sampled
    its EOS (not ignored; nano-vllm's condition tests EOS first, as vLLM 0.12+
    does; ``stop_reason`` null), else ``length`` when it finished, else null.
``observe``
    ``free_block_queue`` (``BlockManager.free_block_ids``, front first: the
    next block ``allocate`` takes), ``num_free_blocks`` and ``block_tables``
    (each live request holding blocks, sorted by id).

Guidance pairs (``SCHEDCONF_NANOVLLM_CFG_SCALE``, a driver-level workload family)
    The fork's classifier-free guidance: ``SamplingParams.cfg_scale > 1`` makes
    ``LLMEngine.add_request`` (llm_engine.py:46-69) add two sequences, the
    request and an unconditional twin (``is_unconditional``, linked both ways by
    ``paired_seq``; without an unconditional prompt the twin gets the prompt
    itself, llm_engine.py:51-59). ``Scheduler.schedule`` admits and decodes a
    request with its twin (scheduler.py:34-63, 98-144) and orders a batch
    requests first, twins after (:81-88, :172-176); the model runner samples
    one token per request from the guided logits (model_runner.py:374-440) and
    ``Scheduler.postprocess`` appends it to both, ending both together
    (scheduler.py:186-222). With the variable set (e.g. ``3``) every protocol
    request is such a pair, built as ``add_request`` builds it; the twin is
    internal (no protocol id): the schedule reports the requests, ``update``
    takes one token per request and makes ONE ``postprocess`` call for the
    batch, as ``LLMEngine.step`` does, and ``abort`` removes the pair. The
    properties the harness cannot see on the twins are checked by the driver
    over the whole batch, twins included (``seats``, ``token_budget``, the
    pairing the runner relies on: ``batch[i]``'s twin at ``batch[len // 2 + i]``)
    and, at each ``observe``, ``block_conservation`` over every live sequence;
    ``observe`` then reports the free queue without ``block_tables`` (the
    harness's table checks would count the twins' blocks as leaked). A failure
    is an ``internal`` reply naming the property (a ``sut_error`` verdict) and
    the engine is dead until the next ``init``. ``unsupported``: a pair that
    could need more blocks than the pool (``2 * cdiv(prompt + max_tokens,
    block_size)``: admission wants blocks for both, scheduler.py:48-52), and a
    batch mixing EOS ids (nano-vllm's EOS is engine-wide and a guidance batch is
    post-processed in one call).

``python -m schedconf.conformance.engines.nanovllm_driver --self-check [--expect-version V]``
builds one scheduler, runs two steps and prints ``self-check ok: ...``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

from schedconf.conformance.engines.protocol_checks import (
    SutUnsupported,
    cdiv,
    is_token_id,
    require,
    validate_add_request,
    validate_config,
)
from schedconf.conformance.engines.self_check import run_self_check, run_two_steps
from schedconf.conformance.protocol_server import OFFLINE_ENV, run_driver, take_protocol_stdout

DISTRIBUTION = "nano-vllm-fork"

NO_PREEMPTED_FIELD_PROFILES = ("vllm-0.11",)
"""Profiles whose SchedulerOutput has no ``preempted_req_ids`` (reported as null)."""
CFG_SCALE_ENV = "SCHEDCONF_NANOVLLM_CFG_SCALE"
"""Set to a guidance scale above 1 (e.g. 3) to run every request as a classifier-free-guidance pair (see the
module docstring, "Guidance pairs")."""


class CfgPairViolation(RuntimeError):
    """A safety property of the whole batch (guidance twins included) failed: the reply is ``internal``."""


# ---------------------------------------------------------------- nano-vllm


class _Nano:
    """nano-vllm's scheduler modules, imported without ``nanovllm/__init__.py`` (see the module docstring)."""

    def __init__(self) -> None:
        if "nanovllm" not in sys.modules:
            spec = importlib.util.find_spec("nanovllm")
            if spec is None or not spec.submodule_search_locations:
                raise ImportError("nano-vllm is not installed in this environment (pip install nano-vllm-fork)")
            package = types.ModuleType("nanovllm")
            package.__path__ = list(spec.submodule_search_locations)
            package.__file__ = spec.origin
            package.__spec__ = spec
            package.__package__ = "nanovllm"
            sys.modules["nanovllm"] = package  # its __init__ (the LLM engine) is never executed
        from importlib.metadata import version

        from nanovllm.engine.block_manager import BlockManager
        from nanovllm.engine.scheduler import Scheduler
        from nanovllm.engine.sequence import Sequence, SequenceStatus
        from nanovllm.sampling_params import SamplingParams

        self.version: str = version(DISTRIBUTION)
        self.Scheduler = Scheduler
        self.BlockManager = BlockManager
        self.Sequence = Sequence
        self.SequenceStatus = SequenceStatus
        self.SamplingParams = SamplingParams


# ------------------------------------------------------------------- config


def unsupported_reason(cfg: dict[str, Any]) -> str | None:
    """Why nano-vllm cannot run ``cfg`` (None if it can)."""
    if cfg["block_size"] < 2:
        return (
            "nano-vllm's block arithmetic needs block_size >= 2 (may_append detects a new block by "
            "len % block_size == 1; its Config requires multiples of 256)"
        )
    if cfg["policy"] != "fcfs":
        return "nano-vllm schedules FCFS only (no priority policy)"
    if cfg["num_spec_tokens"]:
        return "nano-vllm has no speculative decoding (num_spec_tokens must be 0)"
    if cfg["num_lookahead_tokens"]:
        return "nano-vllm allocates no lookahead slots (num_lookahead_tokens must be 0)"
    if cfg["long_prefill_token_threshold"]:
        return "nano-vllm has no long-prefill threshold (it prefills whole sequences)"
    if cfg["enable_chunked_prefill"]:
        return "nano-vllm has no chunked prefill (it prefills whole sequences)"
    if not cfg["enable_prefix_caching"]:
        return "nano-vllm always caches prefixes (enable_prefix_caching must be true)"
    return None


# ---------------------------------------------------------------------- SUT


class NanoVllmSchedulerSut:
    """One nano-vllm scheduler at a time, rebuilt on every ``start`` (protocol ``init``)."""

    supports_observe = True

    def __init__(self, nano: _Nano | None = None) -> None:
        self.n = nano or _Nano()
        self.name = f"nano-vllm@{self.n.version}"
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
        self.n.Sequence.block_size = cfg["block_size"]  # a class attribute (256 in nano-vllm)
        fields = types.SimpleNamespace(  # exactly what Scheduler.__init__ reads from its Config
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            eos=-1,
            num_kvcache_blocks=cfg["num_gpu_blocks"] - 1,
            kvcache_block_size=cfg["block_size"],
        )
        self.scheduler = self.n.Scheduler(fields)
        self.config = cfg
        self.profile = profile
        self.dead = None
        self.seqs: dict[str, Any] = {}  # live requests
        self.meta: dict[int, dict[str, Any]] = {}  # seq_id -> request fields nano-vllm has no place for
        self.seen: set[str] = set()
        self.admitted: set[int] = set()  # seq_ids prefilled at least once
        self.finished_since: set[str] = set()
        self.pending: list[tuple[str, Any]] | None = None  # (req_id, seq) scheduled in the step awaiting update
        self.aborted_in_pending: set[str] = set()
        self.cfg_scale = float(os.environ.get(CFG_SCALE_ENV) or 1.0)
        self.twins: dict[str, Any] = {}  # req_id -> its unconditional twin (guidance pairs only)

    def _sched(self) -> Any:
        if self.scheduler is None:
            raise RuntimeError("init must come first")
        require(
            self.dead is None,
            "engine_dead",
            f"nano-vllm's scheduler failed ({self.dead}); it is dead until the next init",
        )
        return self.scheduler

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
        capped = min(max_tokens, self.config["max_model_len"] - len(prompt))
        meta = {"req_id": rid, "eos": -1 if eos is None else eos, "stops": set(stops), "min_tokens": min_tokens}
        if self.cfg_scale > 1.0:
            bs = self.config["block_size"]
            pair_blocks = 2 * cdiv(len(prompt) + capped, bs)
            if pair_blocks > self.config["num_gpu_blocks"] - 1:
                raise SutUnsupported(
                    f"request {rid!r} as a guidance pair may need {pair_blocks} blocks; the pool has "
                    f"{self.config['num_gpu_blocks'] - 1} (nano-vllm admits a pair only with blocks "
                    "for both, scheduler.py:48-52)"
                )
            params = self.n.SamplingParams(max_tokens=capped, ignore_eos=ignore_eos, cfg_scale=self.cfg_scale)
            # LLMEngine.add_request (llm_engine.py:50-69): without an unconditional prompt the twin gets the
            # prompt itself; the twin is built first, linked both ways, and added right after its request
            uncond = self.n.Sequence(list(prompt), params, is_unconditional=True)
            seq = self.n.Sequence(list(prompt), params, is_unconditional=False, conditional_seq=uncond)
            uncond.paired_seq = seq
            s.add(seq)
            s.add(uncond)
            self.twins[rid] = uncond
            self.meta[uncond.seq_id] = {**meta, "req_id": None, "twin_of": rid}
        else:
            seq = self.n.Sequence(list(prompt), self.n.SamplingParams(max_tokens=capped, ignore_eos=ignore_eos))
            s.add(seq)
        self.seqs[rid] = seq
        self.meta[seq.seq_id] = meta
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
        twin = self.twins.pop(request_id, None)
        for one in (seq, twin) if twin is not None else (seq,):  # a guidance pair ends together
            for queue in (s.waiting, s.running):
                while one in queue:
                    queue.remove(one)
            if one.block_table:
                s.block_manager.deallocate(one)
            one.status = self.n.SequenceStatus.FINISHED
        self.finished_since.add(request_id)
        if self.pending is not None and any(r == request_id for r, _ in self.pending):
            self.aborted_in_pending.add(request_id)

    # ------------------------------------------------------------- schedule

    def _rid(self, seq: Any) -> str:
        return self.meta[seq.seq_id]["req_id"]

    def schedule(self) -> dict[str, Any]:
        s = self._sched()
        require(
            self.pending is None,
            "output_not_processed",
            "schedule() called before update_from_output() for the previous step",
        )
        running_before = {
            seq.seq_id: seq
            for seq in s.running
            if seq.status == self.n.SequenceStatus.RUNNING and not seq.is_unconditional
        }
        blocks_before = {seq.seq_id: len(seq.block_table) for seq in running_before.values()}
        if s.is_finished():
            seqs, is_prefill = [], False
        else:
            try:
                seqs, is_prefill = s.schedule()
            except Exception as exc:  # nano-vllm's engine loop would die here
                import traceback

                frames = traceback.extract_tb(exc.__traceback__)
                where = (
                    f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} {frames[-1].line!r}"
                    if frames
                    else "?"
                )
                self.dead = f"{type(exc).__name__} at {where}"
                raise RuntimeError(
                    f"nano-vllm's Scheduler.schedule() raised {type(exc).__name__}: {exc} at {where}"
                ) from exc
        ids = [seq.seq_id for seq in seqs]
        if len(set(ids)) != len(ids):
            dup = sorted({self._rid(q) for q in seqs if ids.count(q.seq_id) > 1})
            self.dead = f"scheduled {dup} twice in one step"
            raise RuntimeError(
                f"nano-vllm's Scheduler.schedule() returned {dup} twice in one step "
                "(a sequence listed twice in Scheduler.running)"
            )
        if self.cfg_scale > 1.0:
            self._check_cfg_batch(seqs, is_prefill)
        batch = seqs
        seqs = [seq for seq in seqs if not seq.is_unconditional]  # the protocol's requests (twins are internal)
        new_reqs: list[dict[str, Any]] = []
        cached: list[dict[str, Any]] = []
        num_scheduled: dict[str, int] = {}
        for seq in seqs:
            rid = self._rid(seq)
            blocks = [b + 1 for b in seq.block_table]
            if is_prefill:
                num_scheduled[rid] = len(seq) - seq.num_cached_tokens
                if seq.seq_id in self.admitted:
                    cached.append(
                        {
                            "req_id": rid,
                            "resumed": True,
                            "new_block_ids": blocks,
                            "num_computed_tokens": seq.num_cached_tokens,
                            "num_output_tokens": seq.num_completion_tokens,
                        }
                    )
                else:
                    new_reqs.append({"req_id": rid, "block_ids": blocks, "num_computed_tokens": seq.num_cached_tokens})
                    self.admitted.add(seq.seq_id)
            else:
                num_scheduled[rid] = 1
                cached.append(
                    {
                        "req_id": rid,
                        "resumed": False,
                        "new_block_ids": blocks[blocks_before.get(seq.seq_id, len(blocks)) :],
                        "num_computed_tokens": len(seq) - 1,
                        "num_output_tokens": seq.num_completion_tokens,
                    }
                )
        preempted = sorted(
            self._rid(seq) for sid, seq in running_before.items() if seq.status == self.n.SequenceStatus.WAITING
        )
        finished, self.finished_since = sorted(self.finished_since), set()
        self.pending = [(self._rid(seq), seq) for seq in seqs]
        self.pending_batch = batch
        self.aborted_in_pending = set()
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

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]:
        s = self._sched()
        require(self.pending is not None, "unexpected_model_output", "update without a pending step")
        sampled, drafts = sampled_token_ids, draft_token_ids
        require(
            isinstance(sampled, dict) and isinstance(drafts, dict),
            "invalid_field_type",
            "sampled_token_ids and draft_token_ids must be objects",
        )
        scheduled = dict(self.pending or [])
        for rid, tokens in sampled.items():
            require(
                rid in scheduled, "unscheduled_model_output", f"sampled tokens for {rid!r}, which was not scheduled"
            )
            require(isinstance(tokens, list), "invalid_field_type", "sampled tokens must be a list")
            for token in tokens:
                require(is_token_id(token), "invalid_token_id", "sampled token ids must be non-negative integers")
            require(
                len(tokens) <= 1,
                "bad_num_sampled_tokens",
                f"request {rid!r} may sample at most 1 token (no drafts), got {len(tokens)}",
            )
        require(not drafts, "drafts_without_spec_decode", "draft tokens given but num_spec_tokens is 0")
        live = [
            (rid, seq)
            for rid, seq in self.pending or []
            if rid not in self.aborted_in_pending and self.seqs.get(rid) is seq
        ]
        for rid, seq in live:
            tokens = sampled.get(rid, [])
            if not tokens:
                raise SutUnsupported(
                    f"request {rid!r} sampled no token: nano-vllm's model runner samples exactly one "
                    "token per scheduled sequence and its block accounting assumes it"
                )
            m = self.meta[seq.seq_id]
            token = tokens[0]
            k = seq.num_completion_tokens + 1
            eos_stops = token == m["eos"] and not seq.ignore_eos
            if token in m["stops"] and k < seq.max_tokens and not eos_stops and k >= m["min_tokens"]:
                raise SutUnsupported(f"request {rid!r} sampled its stop token {token}: nano-vllm has no stop_token_ids")
            if k < m["min_tokens"] and eos_stops:
                raise SutUnsupported(
                    f"request {rid!r} sampled EOS before min_tokens={m['min_tokens']}: nano-vllm has no min_tokens"
                )
        if self.cfg_scale > 1.0:
            eos_ids = {self.meta[seq.seq_id]["eos"] for _, seq in live}
            if len(eos_ids) > 1:
                raise SutUnsupported(
                    f"a guidance batch mixes EOS ids {sorted(eos_ids)}: nano-vllm's EOS is "
                    "engine-wide and its guidance batch is post-processed in one call"
                )
        self.pending = None
        self.aborted_in_pending = set()
        outputs: list[dict[str, Any]] = []
        if self.cfg_scale > 1.0 and live:
            # LLMEngine.step (llm_engine.py:72-75): one postprocess call for the batch; the model runner
            # samples one token per request from the guided logits (model_runner.py:379-440), and
            # Scheduler.postprocess appends it to the request and its twin (scheduler.py:195-222)
            alive = {id(seq) for _, seq in live}
            batch = [q for q in self.pending_batch if id(q) in alive or id(q.paired_seq) in alive]
            s.eos = self.meta[live[0][1].seq_id]["eos"]
            s.postprocess(batch, [sampled[rid][0] for rid, _ in live])
        for rid, seq in live:
            token = sampled[rid][0]
            if self.cfg_scale <= 1.0:
                s.eos = self.meta[seq.seq_id]["eos"]  # nano-vllm's EOS is engine-wide; each request has its own here
                s.postprocess([seq], [token])  # nano-vllm's own stop rule
            reason = None
            if seq.is_finished:
                # nano-vllm's own condition tests EOS first: (not ignore_eos and token == eos) or length
                reason = "stop" if token == self.meta[seq.seq_id]["eos"] and not seq.ignore_eos else "length"
                self.seqs.pop(rid, None)
                self.twins.pop(rid, None)
                self.finished_since.add(rid)
            outputs.append({"req_id": rid, "new_token_ids": [token], "finish_reason": reason, "stop_reason": None})
        return outputs

    # -------------------------------------------------------------- observe

    def observe(self) -> dict[str, Any]:
        bm = self._sched().block_manager
        if self.cfg_scale > 1.0:
            # the twins hold blocks no protocol request names: the block tables are checked here, over all
            # sequences, and the harness gets the free queue only
            self._check_cfg_blocks()
            return {"free_block_queue": [b + 1 for b in bm.free_block_ids], "num_free_blocks": len(bm.free_block_ids)}
        return {
            "free_block_queue": [b + 1 for b in bm.free_block_ids],
            "num_free_blocks": len(bm.free_block_ids),
            "block_tables": {
                rid: [b + 1 for b in seq.block_table] for rid, seq in sorted(self.seqs.items()) if seq.block_table
            },
        }

    # ------------------------------------------------------- guidance pairs

    def _violation(self, prop: str, message: str) -> CfgPairViolation:
        self.dead = f"guidance-pair property {prop} failed"
        return CfgPairViolation(
            f"guidance-pair safety property {prop} (conformance/CHECKS.md, over the whole "
            f"batch, unconditional twins included): {message}"
        )

    def _check_cfg_batch(self, batch: list[Any], is_prefill: bool) -> None:
        """The batch properties over every sequence nano-vllm scheduled, twins included."""
        cfg = self.config
        name = [self._rid(q) if not q.is_unconditional else f"{self.meta[q.seq_id]['twin_of']}~uncond" for q in batch]
        if len(batch) > cfg["max_num_seqs"]:
            raise self._violation(
                "seats",
                f"{len(batch)} sequences {name} scheduled in one "
                f"{'prefill' if is_prefill else 'decode'} step, max_num_seqs={cfg['max_num_seqs']} "
                "(the model runner's buffers hold max_num_seqs rows, model_runner.py:118-147)",
            )
        tokens = sum(len(q) - q.num_cached_tokens for q in batch) if is_prefill else len(batch)
        if tokens > cfg["max_num_batched_tokens"]:
            raise self._violation(
                "token_budget",
                f"{tokens} tokens scheduled for {name}, max_num_batched_tokens={cfg['max_num_batched_tokens']}",
            )
        conds = [q for q in batch if not q.is_unconditional]
        twins = [q for q in batch if q.is_unconditional]
        # Scheduler.postprocess and ModelRunner.run pair batch[i] with batch[len // 2 + i] (scheduler.py:196-203)
        half = len(batch) // 2
        if len(conds) != len(twins) or any(batch[half + i] is not q.paired_seq for i, q in enumerate(batch[:half])):
            raise self._violation(
                "guidance_pairs",
                f"batch {name}: a request and its twin must be scheduled "
                "together, requests first and twins in the same order",
            )

    def _check_cfg_blocks(self) -> None:
        bm = self.scheduler.block_manager
        held = {
            b
            for rid, q in self.seqs.items()
            for one in (q, self.twins.get(rid))
            if one is not None
            for b in one.block_table
        }
        usable = self.config["num_gpu_blocks"] - 1
        if len(held) + len(bm.free_block_ids) != usable:
            raise self._violation(
                "block_conservation",
                f"{len(bm.free_block_ids)} free + {len(held)} held by live "
                f"requests and twins != {usable} usable blocks",
            )

    def close(self) -> None:
        self.scheduler = None


# -------------------------------------------------------------------- serve


def serve_stdio() -> int:
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    nano = _Nano()
    return serve(lambda: NanoVllmSchedulerSut(nano), stdin=sys.stdin, stdout=proto_out)


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(nano: _Nano) -> str | None:
        first, second = run_two_steps(NanoVllmSchedulerSut(nano), "vllm-0.33")
        ok = (
            first["num_scheduled_tokens"] == {"a": 10}
            and first["scheduled_new_reqs"][0]["block_ids"] == [1, 2, 3]
            and second["num_scheduled_tokens"] == {"a": 1}
        )
        return None if ok else f"unexpected outputs {first} / {second}"

    return run_self_check(
        "nano-vllm", expect_version, _Nano, exercise, lambda nano: f"nano-vllm {nano.version} (nano-vllm-fork)"
    )


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.nanovllm_driver",
        engine="nano-vllm",
        default_env=OFFLINE_ENV,
        description="Serve nano-vllm's scheduler over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
    )


if __name__ == "__main__":
    main()
