"""Serve SGLang's own scheduling classes over the schedconf JSON-lines protocol.

Runs INSIDE the environment built by ``schedconf env sglang VERSION``
(``.venvs/sglang-VERSION``: the ``sglang`` wheel from PyPI, torch 2.13.0 CPU
and the import chain of the modules below, all ``--no-deps``), as
``<venv python> -m schedconf.conformance.engines.sglang_driver`` with the repository
root on ``PYTHONPATH`` (``schedconf.conformance.adapters.sglang`` starts it). It imports
the standard library, torch, SGLang's ``sglang.srt`` modules and
``schedconf.conformance.protocol_server``; never ``spec/``.

What runs, and what does not
----------------------------
SGLang's ``Scheduler`` (``sglang/srt/managers/scheduler.py``) cannot be
instantiated without its runtime: its ``__init__`` builds the tokenizer, the
ZMQ channels and a ``TpModelWorker`` that loads model weights onto a GPU. What
this driver runs are the classes that make every scheduling decision, all of
them SGLang's own and unmodified:

* ``SchedulePolicy`` (``calc_priority``) and ``PrefillAdder``
  (``add_one_req``, ``budget_state``) from ``managers/schedule_policy.py``;
* ``Req`` (``init_next_round_input``, ``update_finish_state``) and
  ``ScheduleBatch`` (``init_new``, ``prepare_for_extend``, ``filter_batch``,
  ``merge_batch``, ``check_decode_mem``, ``retract_decode``,
  ``prepare_for_decode``) from ``managers/schedule_batch.py``;
* ``RadixCache`` (``mem_cache/radix_cache.py``), ``ReqToTokenPool``
  (``mem_cache/memory_pool.py``), ``TokenToKVPoolAllocator``
  (``mem_cache/allocator/token.py``) or, for ``page_size > 1``,
  ``PagedTokenToKVPoolAllocator`` (``mem_cache/allocator/paged.py``), ``release_kv_cache`` and
  ``checkpoint_kv_cache`` (``mem_cache/common.py``) and
  ``NewTokenRatioTracker``, all on ``device="cpu"``.

The per-step loop is the Scheduler's own, reproduced by calling those methods
in the order ``Scheduler.event_loop_normal`` (scheduler.py:2026, the
non-overlap loop) does, with every feature branch that a plain text model
without LoRA, grammar, HiCache, PP/DP, speculative decoding, mixed chunks or
mamba skips left out:

``get_next_batch_to_run`` (scheduler.py:3894)
    the chunked request (``Scheduler.chunked_req``), if any, is kept out of
    the merge and its last chunk stashed (3911-3919:
    ``stash_chunked_request`` = ``checkpoint_kv_cache``, which moves its
    ``prefix_len`` to the chunk's end); a last batch that was an extend is
    filtered (less the chunked request) and merged into the running batch
    (3934-3959); the running batch is filtered (3963-3966); then
    ``_get_new_batch_prefill_raw`` (4079: priority preemption resets
    ``batch_is_full`` 4090; the chunked request's next chunk first,
    ``init_next_round_input`` + ``PrefillAdder.add_chunked_req`` 4176-4184;
    the admission loop 4203-4295, with ``preempt_to_schedule`` under
    priority preemption; the waiting-queue update and the preempted
    requests re-queued 4300-4322; a new chunked request and its
    ``inflight_middle_chunks`` 4324-4330; ``ScheduleBatch.init_new(...,
    chunked_req)`` + ``prepare_for_extend`` 4333-4349); if it returns no batch,
    ``update_running_batch`` (4459: ``check_decode_mem`` ->
    ``retract_decode`` -> the retracted requests go back to the waiting queue
    through ``_add_request_to_queue`` -> ``prepare_for_decode``).
``process_batch_result_prefill`` / ``_decode`` (batch_result_processor.py:258, 952)
    a request whose chunk was not its last (``inflight_middle_chunks > 0``)
    commits nothing and its count goes down (426-445); otherwise the
    sampled token is appended to ``output_ids``, ``update_finish_state``
    decides the stop, a finished request's KV goes back with
    ``release_kv_cache(checkpoint=True)``, an unfinished prefill's is inserted
    into the tree with ``checkpoint_kv_cache``.

The model runner is the protocol's ``update``. The global server arguments are
SGLang's own ``ServerArgs(model_path="schedconf-no-model", device="cpu")``
published with ``set_global_server_args_for_scheduler`` (the accessors
``get_exec()`` ... that the batch code reads need them); the model config is a
namespace with the five fields the batch code reads for a decoder-only text
model. Bypassed imports: ``torchvision`` (imported at module level by
``sglang/srt/multimodal/internvl_utils.py`` through
``sglang/srt/configs/__init__.py``) has no CPU wheel matching torch 2.13.0 on
PyPI (the 0.28.0 wheel links ``libtorch_cuda.so``), so three placeholder
modules stand in for it; nothing on the scheduler's path calls it.
Transformers' processing classes are imported first, while torchvision is
still absent, so transformers records it as unavailable.

Mapping (PROTOCOL.md -> SGLang)
-------------------------------
``init``
    ``block_size`` is SGLang's ``page_size``. Pools of ``num_gpu_blocks - 1``
    pages (SGLang's allocators keep page 0 as the padding page, as vLLM keeps
    block 0 as the null block; page ids ``1..n-1`` are the protocol's block
    ids, a table is the pages of a request's ``req_to_token`` row):
    ``TokenToKVPoolAllocator`` at ``page_size`` 1, as SGLang's
    ``kv_cache_configurator.py`` picks, else ``PagedTokenToKVPoolAllocator``
    of ``(num_gpu_blocks - 1) * page_size`` slots. Its ``alloc_extend`` /
    ``alloc_decode`` launch the Triton kernels ``alloc_extend_kernel`` /
    ``alloc_decode_kernel`` only where ``current_platform.capabilities.
    supports_triton``; this CPU platform has none, so SGLang's own torch
    versions ``alloc_extend_naive`` / ``alloc_decode_naive`` run
    (``paged.py:41-133``), and ``get_last_loc`` takes ``get_last_loc_torch``
    under the ``torch_native`` attention backend SGLang picks on a CPU (a
    platform with Triton would make ``block_size > 1`` ``unsupported``).
    ``max_num_seqs`` -> ``max_running_requests`` (and the ``ReqToTokenPool``
    rows); ``max_num_batched_tokens`` -> ``max_prefill_tokens`` (PrefillAdder's
    ``rem_input_tokens``) and, with ``enable_chunked_prefill``, also
    ``chunked_prefill_size`` (PrefillAdder's ``rem_chunk_tokens``; off:
    ``None``, as ``Scheduler.init_chunked_prefill`` makes of ``-1``);
    ``enable_prefix_caching: false`` -> a disabled ``RadixCache``; the
    ``schedule`` leaves ``page_size``, ``chunked_prefill_size``,
    ``max_prefill_tokens`` and the priority flags of the published server
    arguments are set for the session (``get_schedule().override``), since
    ``preempt_to_schedule`` and ``retract_decode`` read them there.
    ``policy: priority`` -> SGLang's ``--enable-priority-scheduling
    --schedule-low-priority-values-first`` (the protocol's priority: lower
    is more important; SGLang's default is the opposite), with its defaults
    otherwise: priority preemption on (``preempt_to_schedule``: a waiting
    request preempts running ones whose priority value is more than
    ``--priority-scheduling-preemption-threshold`` (10) larger), retraction
    by length. The queue's second key is SGLang's queue entry time
    (``set_wait_queue_entry_time`` at every ``_add_request_to_queue``, a
    retraction or preemption included), a logical clock here, not the
    protocol's ``arrival_time``: SGLang's server has no arrival time of the
    client's. ``policy: fcfs``: SGLang's default (no priority reaches it).
    ``unsupported``: ``num_spec_tokens > 0``, ``num_lookahead_tokens > 0``,
    ``0 < long_prefill_token_threshold < max_num_batched_tokens`` (SGLang has
    no per-request threshold: ``rem_chunk_tokens`` caps the batch as a
    whole; a threshold at or above the budget cuts nothing in vLLM either and
    is accepted, one above ``max_model_len`` is vLLM's start-up refusal,
    ``unsupported`` too), and chunked prefill with a
    ``max_num_batched_tokens`` that ``block_size`` does not divide (SGLang's
    server refuses that ``chunked_prefill_size``,
    ``arg_groups/validation_hook.py:244``; PrefillAdder would otherwise cut
    every chunk to 0 tokens and admit nothing).
``add_request``
    Validated with the protocol's codes, then ``Req(rid, "", prompt,
    SamplingParams(max_new_tokens, min_new_tokens, stop_token_ids,
    ignore_eos), eos_token_ids={eos})`` appended to the waiting queue (what
    ``_add_request_to_queue`` does), with a tokenizer stand-in (no EOS of its
    own, no stop strings) where the Scheduler sets its tokenizer.
    ``max_new_tokens`` is capped at ``max_model_len - len(prompt)``, then
    clipped as ``Scheduler.init_req_max_new_tokens`` does (scheduler.py:2709:
    ``max_req_len - input - 1`` with SGLang's context_len standing at
    ``max_model_len + 2``, so that the protocol's cap is reachable; then the
    allocator's ``max_new_tokens_for_memory``, pool - input - 2, in general pool - the
    input rounded up to pages - ``page_size`` - 1). A request
    that clip leaves no token is ``unsupported`` (SGLang aborts it at intake);
    one that then ends by length below the protocol's cap is ``unsupported`` at
    that ``update``. SGLang's intake refusal of prompts of ``max_req_len - 5``
    tokens or more (scheduler.py:3231) is not applied (a margin for chat
    templates that would refuse most prompts of the harness's tiny configs).
    Token ids of ``2**17`` or more are ``unsupported`` (the sampler's
    penalizers allocate batch x vocab tensors). ``min_new_tokens`` is enforced by
    SGLang's sampler (``MinNewTokensPenalizer`` masks EOS and stop ids), not by
    the scheduler: an ``update`` sampling a stop or EOS token before
    ``min_tokens`` is ``unsupported`` (the real model could not sample it).
``abort``
    SGLang's ``abort_request`` (scheduler.py:5675) drops a waiting request and
    lets a running one run one more decode step with ``to_finish``; the
    protocol forbids scheduling an aborted request, so a running one is
    finished at once: ``finished_reason = FINISH_ABORT()`` (``filter_batch``
    drops it) and ``release_kv_cache(checkpoint=False)`` (what
    ``abort_request`` does for a request that holds KV, scheduler.py:5721). An
    abort of a request in the step awaiting its update is applied after it.
    The chunked request is released the same way and ``chunked_req``
    cleared, what ``process_pending_chunked_abort`` (scheduler.py:3777) does
    at the start of the next step (nothing runs in between).
``schedule``
    The loop above. An extend batch: each request admitted for the first time
    is a ``scheduled_new_reqs`` entry (the pages of ``req_to_token[row,
    :kv_allocated_len]``, ``num_computed_tokens = prefix_len``, the radix
    hit), ``extend_len`` tokens (the whole rest of the prompt, or the chunk
    PrefillAdder cut); the next chunk of a chunked request is a cached
    entry with ``resumed: false``, its new pages and ``num_computed_tokens =
    prefix_len`` (where the stash left it); one re-admitted after a
    retraction or a priority preemption is a cached entry with ``resumed:
    true`` and all its pages. A decode batch: every
    request is a cached entry with the slots added since its last step,
    ``num_computed_tokens`` = its length - 1. ``RadixCache.checkpoint``
    (radix_cache.py:531) repoints a running request's row onto the tree's copy
    of KV another request computed for the same tokens and frees its own
    duplicate: such a request's next entry is ``resumed: true`` with the whole
    table (nothing is recomputed), and if it is not in the next batch it is
    listed in that step's ``preempted_req_ids`` (its freed slots may be handed
    out in that very step); the stash of a chunk repoints the same way.
    ``preempted_req_ids``: those, the requests ``retract_decode`` retracted
    and those ``preempt_to_schedule`` preempted in this step. An observe
    between an update whose ``checkpoint_kv_cache`` repointed a table and
    the next step leaves ``block_tables`` out: no SchedulerOutput could
    have handed the repointed table over yet (the next step does). ``finished_req_ids``:
    finished or aborted since the previous step. An exception inside SGLang's
    code is ``internal`` (with the failing line) and the engine is dead until
    the next ``init``.
``update``
    No token for a request whose chunk was not its last (one is refused with
    ``bad_num_sampled_tokens``, the protocol's "a prefill chunk samples
    none"); one token for every other scheduled request (SGLang's runner
    samples one per request; none is ``unsupported``): ``output_ids``
    append, ``update_finish_state``;
    finish ``FINISH_MATCHED_TOKEN`` -> ``stop`` (``stop_reason`` the token if
    it is not the request's EOS), ``FINISH_LENGTH`` -> ``length``.
``observe``
    ``free_block_queue``: the allocator's free pages (``free_pages``, the next
    ``alloc`` takes the front), then the pages of radix-tree nodes nobody locks
    (evictable: ``alloc_token_slots`` evicts them on demand, as vLLM reuses
    cached free blocks); ``num_free_blocks`` their count; ``block_tables``
    the pages of each live request's ``req_to_token`` row up to ``kv_allocated_len``.

``python -m schedconf.conformance.engines.sglang_driver --self-check [--expect-version V]``
builds one scheduler, runs two steps and prints ``self-check ok: ...``.
"""

# Size: it runs inside SGLang's environment with only the standard library, SGLang and
# protocol_server, so the engine adapter and the self-check live in the one file that
# environment runs.

from __future__ import annotations

import importlib.machinery
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
from schedconf.conformance.engines.self_check import (
    SELF_CHECK_CONFIG,
    get_self_check_request,
    run_self_check,
    run_two_steps,
)
from schedconf.conformance.protocol_server import OFFLINE_ENV, run_driver, take_protocol_stdout

DISTRIBUTION = "sglang"

VOCAB_SIZE = 1 << 17
"""The fake model's vocabulary: SGLang's MinNewTokensPenalizer allocates batch x vocab tensors (sampling/penaltylib/
min_new_tokens.py:61) and scatters stop ids into them; larger token ids are ``unsupported``."""
NO_PREEMPTED_FIELD_PROFILES = ("vllm-0.11",)


# ------------------------------------------------------------------- SGLang


class _AbsentAttr:
    """A name of a placeholder module: usable at import time, fails loudly if ever called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _AbsentAttr:
        return _AbsentAttr(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} called, but torchvision is not installed in this environment")


def _install_torchvision_placeholder() -> None:
    if "torchvision" in sys.modules:
        return
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__file__ = f"<schedconf placeholder for {name}>"
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__getattr__ = (lambda n: lambda attr: _AbsentAttr(f"{n}.{attr}"))(name)  # type: ignore[attr-defined]
        sys.modules[name] = module


TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}
"""A model folder holding only ``config.json`` (no weights): publishing SGLang's ServerArgs reads the model's
HF config (``arg_groups/muse_spark_hook.py`` calls ``get_config(model_path)``); nothing loads weights."""


def _model_config_dir() -> str:
    import json
    import tempfile

    home = os.environ.get("SCHEDCONF_SGLANG_MODEL_DIR") or os.path.join(tempfile.gettempdir(), "schedconf-sglang-model")
    os.makedirs(home, exist_ok=True)
    path = os.path.join(home, "config.json")
    text = json.dumps(TINY_MODEL_CONFIG, sort_keys=True)
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return home


class _NoStopStringsTokenizer:
    """Stands for the tokenizer ``SamplingParams.normalize`` wants; the protocol has no stop strings to encode."""

    eos_token_id = None
    additional_stop_token_ids = None

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the protocol has no stop strings: nothing to encode")


_NO_STOP_STRINGS_TOKENIZER = _NoStopStringsTokenizer()


class _Sgl:
    """SGLang's scheduling modules (see the module docstring for what is bypassed)."""

    def __init__(self) -> None:
        import warnings

        warnings.filterwarnings("ignore")
        # transformers decides whether torchvision exists when its processing classes are first
        # imported: do that before the placeholder appears (see the module docstring).
        import transformers  # noqa: F401
        from transformers import AutoImageProcessor, AutoProcessor  # noqa: F401

        _install_torchvision_placeholder()
        from importlib.metadata import version

        import torch
        from sglang.srt.managers.schedule_batch import (
            FINISH_ABORT,
            FINISH_LENGTH,
            FINISH_MATCHED_TOKEN,
            Req,
            ScheduleBatch,
        )
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.platforms import current_platform
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.version: str = version(DISTRIBUTION)
        self.server_args = ServerArgs(model_path=_model_config_dir(), device="cpu")
        set_global_server_args_for_scheduler(self.server_args)
        self.torch = torch
        self.Req, self.ScheduleBatch = Req, ScheduleBatch
        self.FINISH_ABORT, self.FINISH_LENGTH, self.FINISH_MATCHED_TOKEN = (
            FINISH_ABORT,
            FINISH_LENGTH,
            FINISH_MATCHED_TOKEN,
        )
        self.AddReqResult, self.PrefillAdder, self.SchedulePolicy = AddReqResult, PrefillAdder, SchedulePolicy
        self.NewTokenRatioTracker = NewTokenRatioTracker
        self.TokenToKVPoolAllocator, self.ReqToTokenPool = TokenToKVPoolAllocator, ReqToTokenPool
        self.PagedTokenToKVPoolAllocator = PagedTokenToKVPoolAllocator
        # PagedTokenToKVPoolAllocator.alloc_extend / alloc_decode launch their Triton kernels only where
        # the platform says it has Triton; this CPU platform does not, so they run alloc_extend_naive /
        # alloc_decode_naive, SGLang's own torch versions of the same allocation
        self.paged_alloc_is_torch = not current_platform.capabilities.supports_triton
        self.get_schedule = get_schedule
        self.RadixCache, self.CacheInitParams = RadixCache, CacheInitParams
        self.checkpoint_kv_cache, self.release_kv_cache = checkpoint_kv_cache, release_kv_cache
        self.SamplingParams = SamplingParams
        self.SPEC_NONE = SpeculativeAlgorithm.NONE


# ------------------------------------------------------------------- config


def unsupported_reason(cfg: dict[str, Any]) -> str | None:
    """Why this driver cannot run ``cfg`` on SGLang (None if it can)."""
    if cfg["num_spec_tokens"]:
        return "speculative decoding is not driven (num_spec_tokens must be 0)"
    if cfg["num_lookahead_tokens"]:
        return "SGLang has no lookahead slots (num_lookahead_tokens must be 0)"
    threshold = cfg["long_prefill_token_threshold"]
    if threshold > cfg["max_model_len"]:
        return (
            "long_prefill_token_threshold > max_model_len is a vLLM start-up refusal; SGLang has no such knob to refuse"
        )
    if 0 < threshold < cfg["max_num_batched_tokens"]:
        return (
            "SGLang has no per-request long-prefill threshold: its chunk limit (chunked_prefill_size, "
            "PrefillAdder.rem_chunk_tokens) caps a prefill batch as a whole, so long_prefill_token_threshold "
            "must be 0 or at least max_num_batched_tokens (where it cuts nothing)"
        )
    if cfg["enable_chunked_prefill"] and cfg["max_num_batched_tokens"] % cfg["block_size"]:
        return (
            "SGLang's server refuses a chunked_prefill_size (max_num_batched_tokens) that page_size (block_size) "
            "does not divide (arg_groups/validation_hook.py:244)"
        )
    return None


def chunked_prefill_size(cfg: dict[str, Any]) -> int | None:
    """SGLang's ``chunked_prefill_size`` for ``cfg`` (None: chunked prefill off, ``Scheduler.init_chunked_prefill``)."""
    return cfg["max_num_batched_tokens"] if cfg["enable_chunked_prefill"] else None


# ---------------------------------------------------------------------- SUT


class SglangSchedulerSut:
    """One SGLang scheduling state at a time, rebuilt on every ``start`` (protocol ``init``)."""

    supports_observe = True

    def __init__(self, sgl: _Sgl | None = None) -> None:
        self.g = sgl or _Sgl()
        self.name = f"sglang@{self.g.version}"
        self.ready = False
        self.dead: str | None = None

    # ----------------------------------------------------------------- init

    def start(self, config: dict[str, Any], profile: str) -> None:
        cfg = validate_config(config)
        reason = unsupported_reason(cfg)
        if reason:
            raise SutUnsupported(reason)
        g = self.g
        page_size = cfg["block_size"]
        if page_size > 1 and not g.paged_alloc_is_torch:
            raise SutUnsupported(
                "block_size > 1 needs PagedTokenToKVPoolAllocator's Triton kernels "
                "(alloc_extend_kernel / alloc_decode_kernel) on this platform"
            )
        self.config, self.profile = cfg, profile
        self.page_size = page_size
        self.max_running = cfg["max_num_seqs"]
        self.chunked_prefill_size = chunked_prefill_size(cfg)
        # Scheduler: max_prefill_tokens is PrefillAdder's rem_input_tokens; with chunked prefill on, SGLang's
        # server keeps it >= chunked_prefill_size (both are the step's token budget here)
        self.max_prefill_tokens = cfg["max_num_batched_tokens"]
        self.priority_scheduling = cfg["policy"] == "priority"
        # SGLang's server flags for the protocol's priority policy: --enable-priority-scheduling and
        # --schedule-low-priority-values-first (the protocol's lower = more important); preemption by priority
        # is on by default with it (Scheduler.init_schedule_policy, scheduler.py:1469), at SGLang's default
        # --priority-scheduling-preemption-threshold
        self._enter_schedule_args(
            page_size=page_size,
            chunked_prefill_size=self.chunked_prefill_size or -1,
            max_prefill_tokens=self.max_prefill_tokens,
            enable_priority_scheduling=self.priority_scheduling,
            schedule_low_priority_values_first=self.priority_scheduling,
        )
        sched = g.get_schedule()
        self.priority_preemption = self.priority_scheduling and not sched.disable_priority_preemption
        self.preemption_threshold = sched.priority_scheduling_preemption_threshold
        self.req_to_token_pool = g.ReqToTokenPool(
            size=cfg["max_num_seqs"],
            max_context_len=cfg["max_model_len"] + 4 + page_size,
            device="cpu",
            enable_memory_saver=False,
        )
        # KV pool: num_gpu_blocks - 1 pages of page_size slots (page 0 is SGLang's padding page, the protocol's
        # null block); page ids 1..num_gpu_blocks-1 are the protocol's block ids
        if page_size == 1:
            self.allocator = g.TokenToKVPoolAllocator(
                size=cfg["num_gpu_blocks"] - 1, dtype=g.torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        else:
            self.allocator = g.PagedTokenToKVPoolAllocator(
                size=(cfg["num_gpu_blocks"] - 1) * page_size,
                page_size=page_size,
                dtype=g.torch.float16,
                device="cpu",
                kvcache=None,
                need_sort=False,
            )
        self.tree_cache = g.RadixCache(
            g.CacheInitParams(
                disable=not cfg["enable_prefix_caching"],
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=page_size,
            )
        )
        self.policy = g.SchedulePolicy(
            "fcfs", self.tree_cache, False, self.priority_scheduling, self.priority_scheduling
        )
        self.ratio = g.NewTokenRatioTracker.from_config()
        # what ScheduleBatch reads of ModelConfig for a decoder-only text model
        self.model_config = types.SimpleNamespace(
            vocab_size=VOCAB_SIZE, is_encoder_decoder=False, is_multimodal=False, hf_config=None, is_hybrid_swa=False
        )
        self.waiting: list[Any] = []
        self.queue_clock = 0
        self.running_batch = g.ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch: Any = None
        self.chunked_req: Any = None  # Scheduler.chunked_req
        self.reqs: dict[str, Any] = {}  # live requests
        self.meta: dict[str, dict[str, Any]] = {}
        self.seen: set[str] = set()
        self.admitted: set[str] = set()
        self.tables: dict[str, list[int]] = {}  # the table last reported per request
        self.mid_chunk: set[str] = set()  # requests whose last step ran a chunk that was not their last
        self.replaced: set[str] = set()  # reported preempted for a repointed table; resumed at their next step
        self.preempted_now: list[Any] = []  # PrefillAdder.preempt_to_schedule's victims in this step
        self.finished_since: set[str] = set()
        self.pending: Any = None  # the batch scheduled in the step awaiting update
        self.aborted_in_pending: set[str] = set()
        self.dead = None
        self.ready = True

    def _enter_schedule_args(self, **leaves: Any) -> None:
        """Set the published server arguments' ``schedule`` leaves for this session (restored at close)."""
        import contextlib

        self._leave_schedule_args()
        self._schedule_scope: Any = contextlib.ExitStack()
        self._schedule_scope.enter_context(self.g.get_schedule().override(**leaves))

    def _leave_schedule_args(self) -> None:
        scope = getattr(self, "_schedule_scope", None)
        if scope is not None:
            scope.close()
            self._schedule_scope = None

    def _enqueue(self, req: Any) -> None:
        """Scheduler._add_request_to_queue (scheduler.py:3480): append, stamp the queue entry time.

        The stamp is a logical clock (SGLang's is ``time.perf_counter()`` at the same call): the priority sort's
        second key, ``SchedulePolicy._sort_by_priority_and_fcfs``, and ``preempt_to_schedule``'s tie-break."""
        self.waiting.append(req)
        self.queue_clock += 1
        req.time_stats.set_wait_queue_entry_time(float(self.queue_clock))

    def _check(self) -> None:
        if not self.ready:
            raise RuntimeError("init must come first")
        require(self.dead is None, "engine_dead", f"SGLang's scheduler failed ({self.dead}); dead until the next init")

    # --------------------------------------------------------------- inputs

    def add_request(self, event: dict[str, Any]) -> None:
        self._check()
        g = self.g
        fields = validate_add_request(event, self.reqs, self.aborted_in_pending, self.config["max_model_len"])
        rid, prompt, stops, eos = (
            fields[k] for k in ("request_id", "prompt_token_ids", "stop_token_ids", "eos_token_id")
        )
        max_tokens, min_tokens, priority, arrival, ignore_eos = (
            fields[k] for k in ("max_tokens", "min_tokens", "priority", "arrival_time", "ignore_eos")
        )
        from array import array

        # SGLang's request limits (TpModelWorker, tp_worker.py:568-572): max_req_len = min(context_len - 1,
        # kv_capacity - 1); prompts of max_req_input_len = max_req_len - 5 tokens or more are refused at intake
        # (Scheduler.handle_generate_request, scheduler.py:3231)
        # (not applied here: that margin of 5 is for chat templates and special tokens of real prompts, and on
        # the harness's tiny configs it would refuse most prompts; the protocol's prompt_too_long applies)
        # SGLang's context_len stands at max_model_len + 2 here: its intake keeps two tokens of headroom
        # (max_req_len = context_len - 1, then max_new_tokens <= max_req_len - input_len - 1, scheduler.py:2714),
        # so a request may reach the protocol's max_model_len cap exactly as in vLLM
        max_req_len = min(self.config["max_model_len"] + 2 - 1, self.allocator.size - 1)
        for token in (*prompt, *stops, *(() if eos is None else (eos,))):
            if token >= VOCAB_SIZE:
                raise SutUnsupported(
                    f"request {rid!r}: token id {token} >= the driver's vocab_size {VOCAB_SIZE} "
                    "(SGLang's sampler penalizers allocate batch x vocab tensors)"
                )
        capped = min(max_tokens, self.config["max_model_len"] - len(prompt))
        # Scheduler.init_req_max_new_tokens (scheduler.py:2693-2740) clips max_new_tokens at intake:
        # to max_req_len - input_len - 1, then to the empty pool's budget (the allocator's own method)
        clipped = max(0, min(capped, max_req_len - len(prompt) - 1))
        clipped = self.allocator.max_new_tokens_for_memory(
            len(prompt), clipped, token_capacity=self.allocator.size, sliding_window_size=None, chunk_size=None
        )
        if not clipped:
            raise SutUnsupported(
                f"request {rid!r}: SGLang would abort it at intake (no room to generate in its "
                "pool: Scheduler.init_req_max_new_tokens, scheduler.py:2730)"
            )
        params = g.SamplingParams(
            max_new_tokens=clipped,
            min_new_tokens=min(min_tokens, clipped),
            stop_token_ids=list(stops) or None,
            ignore_eos=ignore_eos,
        )
        # normalize() needs a tokenizer only to encode stop strings (none here); without one it refuses
        # min_new_tokens (sampling_params.py:463), which the tokenizer manager would have accepted
        params.normalize(_NO_STOP_STRINGS_TOKENIZER)
        # the priority reaches the scheduler only with priority scheduling on (without it, SGLang's server
        # ignores or refuses a priority: Scheduler._set_or_validate_priority, scheduler.py:3520)
        req = g.Req(
            rid,
            "",
            array("q", prompt),
            params,
            eos_token_ids=None if eos is None else {eos},
            vocab_size=None,
            priority=int(priority) if self.priority_scheduling else None,
        )
        req.tokenizer = (
            _NO_STOP_STRINGS_TOKENIZER  # the Scheduler sets its tokenizer here (the sampler's penalizers read it)
        )
        self._enqueue(req)
        self.reqs[rid] = req
        self.meta[rid] = {
            "eos": eos,
            "stops": set(stops),
            "min_tokens": min_tokens,
            "ignore_eos": ignore_eos,
            "cap": capped,
            "clipped": clipped,
        }
        self.seen.add(rid)

    def _release(self, req: Any) -> None:
        if req.kv.holds_kv:
            self.g.release_kv_cache(req, self.tree_cache, checkpoint=False)

    def abort(self, request_id: str) -> None:
        self._check()
        require(
            isinstance(request_id, str) and request_id in self.seen,
            "unknown_request_id",
            f"abort of request {request_id!r}, which was never added",
        )
        req = self.reqs.pop(request_id, None)
        if req is None:
            return  # already finished
        self.finished_since.add(request_id)
        if req in self.waiting:
            self.waiting.remove(req)
        if not req.finished():
            req.finished_reason = self.g.FINISH_ABORT()  # filter_batch drops it from any batch
        if req is self.chunked_req:
            # abort_request defers a chunked request to process_pending_chunked_abort (scheduler.py:5676, 3781),
            # which the next step runs first: release_kv_cache(checkpoint=False) and chunked_req = None
            self.chunked_req = None
        if self.pending is not None and any(r is req for r in self.pending.reqs):
            self.aborted_in_pending.add(request_id)  # released after the step's update
            return
        self._release(req)

    # ------------------------------------------------------------- schedule

    def _row(self, req: Any) -> list[int]:
        """The request's block table: the pages of its ``req_to_token`` row up to ``kv_allocated_len``."""
        if not req.kv.holds_kv:
            return []
        slots = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, : req.kv.kv_allocated_len]
        return [int(x) // self.page_size for x in slots[:: self.page_size]]

    def _num_allocatable(self, running_bs: int, num_held_rows: int = 0) -> int:
        # Scheduler.get_num_allocatable_reqs (scheduler.py:4026): the micro-batch size
        # (max_running_requests without PP) minus the running requests, and the free req_to_token rows
        return min(self.max_running - running_bs, self.req_to_token_pool.available_size() + num_held_rows)

    def _get_new_batch_prefill(self, running_batch: Any) -> Any:
        """Scheduler._get_new_batch_prefill_raw (scheduler.py:4079) without the features this config has off."""
        g = self.g
        if self.priority_preemption:
            running_batch.batch_is_full = False  # scheduler.py:4090: try preemption with a prefill adder
        if running_batch.is_empty():
            running_batch.batch_is_full = False
        if (running_batch.batch_is_full or len(self.waiting) == 0) and self.chunked_req is None:
            return None
        running_bs = len(running_batch.reqs)
        if self._num_allocatable(running_bs) <= 0 and self.chunked_req is None and not self.priority_preemption:
            running_batch.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting, running_batch)
        adder = g.PrefillAdder(
            self.page_size,
            self.tree_cache,
            self.allocator,
            running_batch,
            self.ratio.current,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            0,
            self.preemption_threshold,
            max_prefill_bs=0,
            max_running_requests=self.max_running,
            prefill_max_requests=None,
            prefill_delayer_single_pass=None,
            dllm_config=None,
            waiting_queue_len=len(self.waiting),
            prefill_tile_block_m=64,
        )
        if self.chunked_req is not None:  # scheduler.py:4176-4184: the chunked request's next chunk first
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting, adder.rem_chunk_tokens or 0, self.page_size
            )
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:  # scheduler.py:4203-4295
            if adder.budget_state() == g.AddReqResult.OTHER:
                break
            running_bs = len(running_batch.reqs)
            num_held_rows = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable(running_bs, num_held_rows):
                running_batch.batch_is_full = True
            if running_batch.batch_is_full:
                if not self.priority_preemption or not adder.preempt_to_schedule(req):
                    break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if res != g.AddReqResult.CONTINUE:
                if res == g.AddReqResult.NO_TOKEN:
                    running_batch.batch_is_full = len(adder.can_run_list) > 0 or not running_batch.is_empty()
                break
        self.preempted_now.extend(adder.preempt_list)
        can_run_list = adder.can_run_list
        if not can_run_list:
            for req in adder.preempt_list:
                self._enqueue(req)
            return None
        can_run = set(can_run_list)
        self.waiting = [x for x in self.waiting if x not in can_run]
        for req in adder.preempt_list:
            self._enqueue(req)
        if adder.new_chunked_req is not None:  # scheduler.py:4324-4330
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = g.ScheduleBatch.init_new(
            can_run_list,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.model_config,
            False,
            g.SPEC_NONE,
            chunked_req=self.chunked_req,
        )
        batch.prepare_for_extend()
        return batch

    def _update_running_batch(self, batch: Any) -> tuple[Any, list[Any]]:
        """Scheduler.update_running_batch (scheduler.py:4459) for the non-overlap loop."""
        initial_bs = batch.batch_size()
        retracted: list[Any] = []
        if batch.is_empty():
            batch.batch_is_full = False
            return batch, retracted
        if not batch.check_decode_mem():
            retracted, new_ratio, to_abort = batch.retract_decode()
            if to_abort:
                raise RuntimeError(f"retract_decode asked to abort {[r.rid for r in to_abort]}")
            self.ratio.current = new_ratio
            for req in retracted:
                self._enqueue(req)  # _add_request_to_queue(req, is_retracted=True)
        else:
            self.ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch, retracted
        batch.prepare_for_decode()
        return batch, retracted

    def _next_batch(self) -> tuple[Any, list[Any]]:
        """Scheduler.get_next_batch_to_run (scheduler.py:3894), non-overlap."""
        running_batch = self.running_batch
        last_batch = self.last_batch
        reqs_to_exclude = set()
        if self.chunked_req is not None:  # scheduler.py:3911-3919: keep it out of the merge, stash its chunk
            reqs_to_exclude.add(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self.g.checkpoint_kv_cache(self.chunked_req, self.tree_cache)  # Scheduler.stash_chunked_request
        if last_batch is not None and last_batch.forward_mode.is_extend():
            if last_batch.chunked_req is not None:
                reqs_to_exclude.add(last_batch.chunked_req)
            last_bs = last_batch.batch_size()
            last_batch.filter_batch(reqs_to_exclude=list(reqs_to_exclude))
            if last_batch.batch_size() < last_bs:
                running_batch.batch_is_full = False
            if not last_batch.is_empty() and last_batch is not running_batch:
                if running_batch.is_empty():
                    running_batch = last_batch
                else:
                    running_batch.merge_batch(last_batch)
        running_bs = running_batch.batch_size()
        running_batch.filter_batch()
        if running_batch.batch_size() < running_bs:
            running_batch.batch_is_full = False
        retracted: list[Any] = []
        new_batch = self._get_new_batch_prefill(running_batch)
        if new_batch is not None:
            ret = new_batch
        elif not running_batch.is_empty():
            decode, retracted = self._update_running_batch(running_batch)
            ret = decode if decode is not None and not decode.is_empty() else None
        else:
            ret = None
        self.running_batch = running_batch
        return ret, retracted

    def schedule(self) -> dict[str, Any]:
        self._check()
        require(
            self.pending is None,
            "output_not_processed",
            "schedule() called before update_from_output() for the previous step",
        )
        try:
            batch, retracted = self._next_batch()
        except Exception as exc:
            import traceback

            frames = [
                f for f in traceback.extract_tb(exc.__traceback__) if "sglang" in f.filename
            ] or traceback.extract_tb(exc.__traceback__)
            where = (
                f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno} {frames[-1].line!r}"
                if frames
                else "?"
            )
            self.dead = f"{type(exc).__name__} at {where}"
            raise RuntimeError(f"SGLang's scheduling code raised {type(exc).__name__}: {exc} at {where}") from exc
        self.last_batch = batch
        if batch is None:
            self.ratio.reset() if not self.reqs else None  # Scheduler.on_idle resets the ratio when idle
        new_reqs: list[dict[str, Any]] = []
        cached: list[dict[str, Any]] = []
        num_scheduled: dict[str, int] = {}
        reqs = list(batch.reqs) if batch is not None else []
        is_extend = batch is not None and batch.forward_mode.is_extend()
        for req in reqs:
            rid = req.rid
            row = self._row(req)
            if is_extend:
                num_scheduled[rid] = int(req.extend_len)
                before = self.tables.get(rid, [])
                if rid not in self.admitted:
                    new_reqs.append({"req_id": rid, "block_ids": row, "num_computed_tokens": int(req.prefix_len)})
                    self.admitted.add(rid)
                elif rid in self.mid_chunk and rid not in self.replaced and row[: len(before)] == before:
                    # the next chunk of a chunked prefill: it continues from where its last chunk ended (the
                    # stash, checkpoint_kv_cache, moved prefix_len to that chunk's extend_end)
                    cached.append(
                        {
                            "req_id": rid,
                            "resumed": False,
                            "new_block_ids": row[len(before) :],
                            "num_computed_tokens": int(req.prefix_len),
                            "num_output_tokens": len(req.output_ids),
                        }
                    )
                else:
                    # re-admitted after a retraction or a preemption, or a chunk whose table the stash
                    # repointed (RadixCache.checkpoint, as below): the whole table, from its prefix hit
                    cached.append(
                        {
                            "req_id": rid,
                            "resumed": True,
                            "new_block_ids": row,
                            "num_computed_tokens": int(req.prefix_len),
                            "num_output_tokens": len(req.output_ids),
                        }
                    )
                self.replaced.discard(rid)
                if req is batch.chunked_req:
                    self.mid_chunk.add(rid)
                else:
                    self.mid_chunk.discard(rid)
            else:
                num_scheduled[rid] = 1
                seqlen = len(req.origin_input_ids) + len(req.output_ids)
                before = self.tables.get(rid, [])
                # RadixCache.checkpoint (radix_cache.py:531) repoints the row of a running request onto the
                # tree's copy of KV that another request computed for the same tokens (and frees its own
                # duplicate slots): the table changed below what was reported, so it is handed over whole,
                # the protocol's only way to replace a table (a cached entry with resumed: true)
                replaced = row[: len(before)] != before or rid in self.replaced
                self.replaced.discard(rid)
                cached.append(
                    {
                        "req_id": rid,
                        "resumed": replaced,
                        "new_block_ids": row if replaced else row[len(before) :],
                        "num_computed_tokens": seqlen - 1,
                        "num_output_tokens": len(req.output_ids),
                    }
                )
            self.tables[rid] = row
        # A live request outside this batch whose row RadixCache.checkpoint repointed (see above) has freed the
        # slots it reported, and they may be handed out in this very step: the protocol can replace a table only
        # through preemption and resumption, so it is reported preempted now and resumed (whole table, nothing
        # recomputed) when it is next scheduled
        in_batch = {r.rid for r in reqs}
        moved = [
            rid
            for rid, req in self.reqs.items()
            if rid not in in_batch
            and rid in self.tables
            and self._row(req)[: len(self.tables[rid])] != self.tables[rid]
        ]
        for rid in moved:
            self.tables[rid] = []
            self.replaced.add(rid)
        victims = {r.rid for r in self.preempted_now} | {r.rid for r in retracted}
        for rid in victims:
            self.tables[rid] = []
        self.preempted_now = []
        preempted = sorted(victims | set(moved))
        finished, self.finished_since = sorted(self.finished_since), set()
        self.pending = batch if batch is not None else self.g.ScheduleBatch(reqs=[], batch_is_full=False)
        self.pending_extend = is_extend
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
        self._check()
        require(self.pending is not None, "unexpected_model_output", "update without a pending step")
        sampled, drafts = sampled_token_ids, draft_token_ids
        require(
            isinstance(sampled, dict) and isinstance(drafts, dict),
            "invalid_field_type",
            "sampled_token_ids and draft_token_ids must be objects",
        )
        batch = self.pending
        scheduled = {r.rid: r for r in batch.reqs}
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
        live: list[Any] = [r for r in batch.reqs if r.rid not in self.aborted_in_pending and self.reqs.get(r.rid) is r]
        # process_batch_result_prefill (batch_result_processor.py:306-430): a request with a chunk in flight
        # (inflight_middle_chunks > 0) commits no token; its chunk count goes down
        middle = [r for r in live if self.pending_extend and r.inflight_middle_chunks > 0]
        for req in middle:
            require(
                not sampled.get(req.rid),
                "bad_num_sampled_tokens",
                f"request {req.rid!r} ran a prefill chunk that is not its last: a prefill chunk samples none",
            )
        live = [r for r in live if not any(r is m for m in middle)]
        for req in live:
            tokens = sampled.get(req.rid, [])
            if not tokens:
                raise SutUnsupported(
                    f"request {req.rid!r} sampled no token: SGLang's model runner samples one token "
                    "per request whose prefill completes, and per decoding request"
                )
            m = self.meta[req.rid]
            token = tokens[0]
            k = len(req.output_ids) + 1
            stops_here = not m["ignore_eos"] and (token == m["eos"] or token in m["stops"])
            if stops_here and k < m["min_tokens"]:
                raise SutUnsupported(
                    f"request {req.rid!r} sampled a stop/EOS token before min_tokens="
                    f"{m['min_tokens']}: SGLang's sampler (MinNewTokensPenalizer) never samples it"
                )
        g = self.g
        for req in middle:
            req.inflight_middle_chunks -= 1
        outputs: list[dict[str, Any]] = []
        for req in live:
            token = sampled[req.rid][0]
            req.output_ids.append(token)
            req.update_finish_state(1)
            reason, stop_reason = None, None
            if req.finished():
                g.release_kv_cache(req, self.tree_cache, checkpoint=True)
                fr = req.finished_reason
                if isinstance(fr, g.FINISH_MATCHED_TOKEN):
                    reason = "stop"
                    stop_reason = None if token == self.meta[req.rid]["eos"] else token
                elif isinstance(fr, g.FINISH_LENGTH):
                    reason = "length"
                    m = self.meta[req.rid]
                    if len(req.output_ids) < m["cap"]:
                        raise SutUnsupported(
                            f"request {req.rid!r} ended by length after {len(req.output_ids)} tokens: SGLang clipped its "
                            f"max_new_tokens {m['cap']} -> {m['clipped']} at intake to fit its pool "
                            "(Scheduler.init_req_max_new_tokens, scheduler.py:2710-2735); the protocol's stop rules have no such clip"
                        )
                else:
                    raise RuntimeError(f"request {req.rid!r} finished with {fr!r}")
                self.reqs.pop(req.rid, None)
                self.finished_since.add(req.rid)
            elif self.pending_extend:
                g.checkpoint_kv_cache(req, self.tree_cache)  # process_batch_result_prefill, b_r_p.py:394
            outputs.append(
                {"req_id": req.rid, "new_token_ids": [token], "finish_reason": reason, "stop_reason": stop_reason}
            )
        for req in batch.reqs:
            if req.rid in self.aborted_in_pending:
                self._release(req)
                self.mid_chunk.discard(req.rid)
        self.pending = None
        self.aborted_in_pending = set()
        return outputs

    # -------------------------------------------------------------- observe

    def _evictable_blocks(self) -> list[int]:
        out: list[int] = []
        stack = [self.tree_cache.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.tree_cache.root_node and node.lock_ref == 0 and node.value is not None:
                out.extend(int(x) // self.page_size for x in node.value[:: self.page_size])
        return out

    def observe(self) -> dict[str, Any]:
        self._check()
        if self.page_size == 1:  # TokenToKVPoolAllocator: free slots, then freed slots awaiting a merge
            free = [int(x) for x in self.allocator.free_pages] + [int(x) for x in self.allocator.release_pages]
        else:  # PagedTokenToKVPoolAllocator: free page ids (staged ones only with need_sort, off here)
            free = [int(x) for x in self.allocator.get_all_free_pages()]
        free += self._evictable_blocks()
        tables = {rid: self._row(req) for rid, req in sorted(self.reqs.items()) if req.kv.holds_kv}
        observation: dict[str, Any] = {"free_block_queue": free, "num_free_blocks": len(free)}
        # A table RadixCache.checkpoint repointed during an update is handed over by the next step (see
        # ``schedule``); until then no SchedulerOutput can carry it, so the tables are left out (the
        # table checks skip this observation) rather than shown ahead of the output that reports them.
        if not any(
            rid in self.tables and row[: len(self.tables[rid])] != self.tables[rid] for rid, row in tables.items()
        ):
            observation["block_tables"] = {rid: t for rid, t in tables.items() if t}
        return observation

    def close(self) -> None:
        self._leave_schedule_args()
        self.ready = False


# -------------------------------------------------------------------- serve


def serve_stdio() -> int:
    from schedconf.conformance.protocol_server import serve

    proto_out = take_protocol_stdout()
    sgl = _Sgl()
    return serve(lambda: SglangSchedulerSut(sgl), stdin=sys.stdin, stdout=proto_out)


SGLANG_SELF_CHECK_CONFIG = {**SELF_CHECK_CONFIG, "block_size": 1, "num_gpu_blocks": 64}
"""SGLang pages one token at a time: 63 usable one-token pages."""


def self_check(expect_version: str | None) -> int:
    """Build one scheduler, run two steps; print ``self-check ok: ...`` (exit 0) or the problem (exit 1)."""

    def exercise(sgl: _Sgl) -> str | None:
        first, second = run_two_steps(
            SglangSchedulerSut(sgl),
            "vllm-0.33",
            SGLANG_SELF_CHECK_CONFIG,
            get_self_check_request(prompt_token_ids=list(range(10, 20))),
        )
        ok = (
            first["num_scheduled_tokens"] == {"a": 10}
            and first["scheduled_new_reqs"][0]["block_ids"] == list(range(1, 11))
            and second["num_scheduled_tokens"] == {"a": 1}
            and second["scheduled_cached_reqs"][0]["new_block_ids"] == [11]
        )
        return None if ok else f"unexpected outputs {first} / {second}"

    return run_self_check("sglang", expect_version, _Sgl, exercise, lambda sgl: f"sglang {sgl.version}")


def main(argv: list[str] | None = None) -> None:
    run_driver(
        argv,
        prog="python -m schedconf.conformance.engines.sglang_driver",
        engine="SGLang",
        default_env=OFFLINE_ENV,
        description="Serve SGLang's scheduling classes over the schedconf protocol.",
        self_check=self_check,
        serve_stdio=serve_stdio,
    )


if __name__ == "__main__":
    main()
