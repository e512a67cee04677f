"""``FastV0Scheduler``: vLLM 0.10.2's legacy (v0) scheduler, written for speed (no torch).

It makes the decisions of ``vllm/core/scheduler.py`` with
``SelfAttnBlockSpaceManager`` (blocks in ``impl/v0_blocks.py``) for one
sequence per group: ``_schedule_default`` (prefills first, never mixed with
decodes, no new prefill while anything is swapped) and
``_schedule_chunked_prefill`` (running, then swapped, then new prefills, with
``PartialPrefillMetadata``), FCFS and priority (``_schedule_priority_preemption``),
preemption by recompute or by swap (``preemption_mode``), swap-in with the
watermark, prefix caching with vLLM's computed-blocks tracker and LRU evictor,
``SchedulingBudget``'s per-request idempotent counters, and after the model
output ``LLMEngine``'s update (computed tokens, the v0 ``StopChecker``,
``free_finished_seq_groups``). Its output, ``V0StepOutput.to_canonical()``, is
the contract's ``SchedulerOutputs`` form.

Independent of ``spec/v0`` (written from vLLM's code): the config is any object
with the ``V0SchedulerConfig`` attribute names. Time is a logical clock (one
tick per ``schedule()``), which orders block accesses as vLLM's wall clock does.

Where vLLM 0.10.2 itself raises, this raises ``EngineCrash`` with the v0
model's codes and refuses every later call (``engine_dead``): a swap-out
without CPU space, a swapped group that priority preemption put into
``waiting``, an abort of a swapped group under prefix caching (vLLM marks CPU
block ids in the GPU allocator), a sequence dropped twice from the computed
blocks tracker, a swapped prefill with fewer cached than computed tokens, and
a stale evictor entry.
"""

# Size: the v0 fast scheduler, one class for the same reason as impl/scheduler.py.

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schedconf.impl.v0_blocks import (
    FIRST_BLOCK,
    NaiveAllocator,
    NoFreeBlocks,
    PrefixCachingAllocator,
    StaleEvictorEntry,
    compute_block_hash,
)
from schedconf.spec.errors import EngineCrash, InvalidEvent

WAITING, RUNNING, SWAPPED, FINISHED_STOPPED, FINISHED_LENGTH_CAPPED, FINISHED_ABORTED, FINISHED_IGNORED = range(7)
FINISH_REASONS = {
    FINISHED_STOPPED: "stop",
    FINISHED_LENGTH_CAPPED: "length",
    FINISHED_ABORTED: "abort",
    FINISHED_IGNORED: "length",
}
OK, LATER, NEVER = 0, 1, 2
MAX_TOKEN_ID = 2**31 - 1
WATERMARK = 0.01


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token(value: object) -> bool:
    return _is_int(value) and 0 <= value <= MAX_TOKEN_ID  # type: ignore[operator]


class V0Req:
    """One request (a single-sequence group): tokens, progress, and its block table."""

    __slots__ = (
        "req_id",
        "num_prompt",
        "tokens",
        "max_tokens",
        "min_tokens",
        "priority",
        "arrival_time",
        "eos",
        "stops",
        "stopset",
        "status",
        "num_computed",
        "prefill",
        "blocks",
        "nfull",
        "on_cpu",
        "last_access",
        "chain",
        "ct_cached",
        "stop_reason",
    )

    def __init__(
        self,
        req_id: str,
        prompt: tuple[int, ...],
        max_tokens: int,
        min_tokens: int,
        priority: int,
        arrival_time: Any,
        eos: int | None,
        stops: tuple[int, ...],
    ) -> None:
        self.req_id = req_id
        self.num_prompt = len(prompt)
        self.tokens = list(prompt)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.priority = priority
        self.arrival_time = arrival_time
        self.eos = eos
        self.stops = frozenset(stops)
        self.stopset = self.stops | ({eos} if eos is not None else frozenset())
        self.status = WAITING
        self.num_computed = 0
        self.prefill = True
        self.blocks: list[int] | None = None
        """The block table (GPU ids, or CPU ids while swapped); None without a table."""
        self.nfull = 0
        """``BlockTable.num_full_slots``: tokens appended to the table."""
        self.on_cpu = False
        self.last_access: float | None = None
        self.chain: list[int] = []
        """Hashes of the full blocks of ``tokens`` computed so far (prefix caching)."""
        self.ct_cached: int | None = None
        """``ComputedBlocksTracker``'s remembered cached-token count (None: not tracked)."""
        self.stop_reason: int | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def is_finished(self) -> bool:
        return self.status > SWAPPED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)


class _Budget:
    """``SchedulingBudget``: per-request idempotent token and sequence counters."""

    __slots__ = ("token_budget", "max_num_seqs", "tok_ids", "seq_ids", "batched", "cached", "seqs")

    def __init__(self, token_budget: int, max_num_seqs: int) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.tok_ids: set[str] = set()
        self.seq_ids: set[str] = set()
        self.batched = 0
        self.cached = 0
        self.seqs = 0

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return self.batched + num_new_tokens <= self.token_budget and self.seqs + num_new_seqs <= self.max_num_seqs

    def add_tokens(self, rid: str, n: int, cached: int = 0) -> None:
        if rid not in self.tok_ids:
            self.tok_ids.add(rid)
            self.batched += n
            self.cached += cached

    def subtract_tokens(self, rid: str, n: int) -> None:
        if rid in self.tok_ids:
            self.tok_ids.remove(rid)
            self.batched -= n

    def add_seqs(self, rid: str, n: int) -> None:
        if rid not in self.seq_ids:
            self.seq_ids.add(rid)
            self.seqs += n

    def subtract_seqs(self, rid: str, n: int) -> None:
        if rid in self.seq_ids:
            self.seq_ids.remove(rid)
            self.seqs -= n


class _PartialPrefills:
    """``PartialPrefillMetadata`` of one chunked-prefill step."""

    __slots__ = ("schedulable", "long_prefills", "threshold", "max_long", "max_partial")

    def __init__(self, sched: FastV0Scheduler) -> None:
        c = sched.config
        self.threshold = sched.long_threshold
        self.max_long = c.max_long_partial_prefills
        self.max_partial = c.max_num_partial_prefills
        prefills = longs = waiting_longs = 0
        for r in sched.running:
            if r.prefill:
                prefills += 1
                if len(r.tokens) - r.num_computed > self.threshold:
                    longs += 1
        for r in sched.waiting:
            if prefills >= self.max_partial:
                break
            if _num_new_tokens(r) > self.threshold:
                if longs + waiting_longs >= self.max_long:
                    continue
                waiting_longs += 1
            prefills += 1
        self.schedulable = min(prefills, self.max_partial)
        self.long_prefills = longs

    def can_schedule(self, r: V0Req) -> bool:
        return not (
            _num_new_tokens(r) > self.threshold and self.long_prefills >= self.max_long and self.max_partial > 1
        )

    def maybe_increment(self, r: V0Req) -> None:
        if _num_new_tokens(r) > self.threshold:
            self.long_prefills += 1


def _num_new_tokens(r: V0Req) -> int:
    """``Sequence.get_num_new_tokens``: 1 in the decode stage, else the uncomputed tokens."""
    return len(r.tokens) - r.num_computed if r.prefill else 1


class V0StepOutput:
    """One ``schedule()``: ``entries`` are ``(req, token_chunk_size, is_prompt, do_sample, block_table,
    computed_block_nums, num_computed_before)`` in ``scheduled_seq_groups`` order.

    ``swap_out_gens`` holds, per ``blocks_to_swap_out`` pair, the generation its GPU
    block had when it was freed (for the model runner, not part of the canonical form).
    """

    __slots__ = (
        "entries",
        "num_prefill_groups",
        "num_batched_tokens",
        "blocks_to_swap_in",
        "blocks_to_swap_out",
        "blocks_to_copy",
        "ignored",
        "running_queue_size",
        "preempted",
        "finished_requests_ids",
        "swap_out_gens",
    )

    def __init__(self) -> None:
        self.entries: list[tuple[V0Req, int, bool, bool, list[int], list[int], int]] = []
        self.num_prefill_groups = 0
        self.num_batched_tokens = 0
        self.blocks_to_swap_in: list[tuple[int, int]] = []
        self.blocks_to_swap_out: list[tuple[int, int]] = []
        self.blocks_to_copy: list[tuple[int, int]] = []
        self.ignored: list[V0Req] = []
        self.running_queue_size = 0
        self.preempted = 0
        self.finished_requests_ids: list[str] = []
        self.swap_out_gens: list[int] = []

    @property
    def req_ids(self) -> list[str]:
        return [e[0].req_id for e in self.entries]

    def to_canonical(self) -> dict[str, Any]:
        """The contract's canonical ``SchedulerOutputs`` (sorted keys)."""
        return {
            "blocks_to_copy": [list(p) for p in self.blocks_to_copy],
            "blocks_to_swap_in": [list(p) for p in self.blocks_to_swap_in],
            "blocks_to_swap_out": [list(p) for p in self.blocks_to_swap_out],
            "finished_requests_ids": list(self.finished_requests_ids),
            "ignored_seq_groups": [r.req_id for r in self.ignored],
            "num_batched_tokens": self.num_batched_tokens,
            "num_lookahead_slots": 0,
            "num_prefill_groups": self.num_prefill_groups,
            "preempted": self.preempted,
            "running_queue_size": self.running_queue_size,
            "scheduled_seq_groups": [
                {
                    "block_table": list(table),
                    "computed_block_nums": list(computed),
                    "do_sample": do_sample,
                    "is_prompt": is_prompt,
                    "request_id": req.req_id,
                    "token_chunk_size": chunk,
                }
                for req, chunk, is_prompt, do_sample, table, computed, _ in self.entries
            ],
        }


RequestOutputTuple = tuple[str, Sequence[int], str | None, int | None]


class FastV0Scheduler:
    """vLLM 0.10.2's v0 scheduler for single-sequence groups (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.config = c = config
        self.bs = c.block_size
        self.mml = c.max_model_len
        self.mnbt = c.max_num_batched_tokens
        self.chunked = c.enable_chunked_prefill
        self.caching = c.enable_prefix_caching
        self.priority_policy = c.policy == "priority"
        self.swap_mode = c.preemption_mode == "swap"
        self.long_threshold = c.long_prefill_token_threshold
        if c.max_num_partial_prefills > 1 and self.long_threshold == 0:
            self.long_threshold = int(c.max_model_len * 0.04)
        alloc = PrefixCachingAllocator if self.caching else NaiveAllocator
        self.gpu = alloc(c.num_gpu_blocks)
        self.cpu = alloc(c.num_cpu_blocks)
        self.watermark_blocks = int(WATERMARK * c.num_gpu_blocks)
        self.prompt_limit = c.max_model_len if self.chunked else min(c.max_model_len, c.max_num_batched_tokens)
        mpp = c.max_num_partial_prefills
        self.partial_budget = [c.max_num_batched_tokens] + [c.max_num_batched_tokens // i for i in range(1, mpp + 1)]
        self.waiting: deque[V0Req] = deque()
        self.running: deque[V0Req] = deque()
        self.swapped: deque[V0Req] = deque()
        self.requests: dict[str, V0Req] = {}
        self.seen_ids: set[str] = set()
        self.finished_ids: list[str] = []
        self.pending: V0StepOutput | None = None
        self.clock = 0
        self.num_cumulative_preemption = 0
        self.crashed: str | None = None

    # ------------------------------------------------------------------ inputs

    def _require_alive(self) -> None:
        if self.crashed is not None:
            raise EngineCrash("engine_dead", f"the engine died in step {self.clock} ({self.crashed})")

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        *,
        priority: int = 0,
        arrival_time: Any = 0,
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        min_tokens: int = 0,
    ) -> None:
        """Append a request to ``waiting``; refuse invalid ones unchanged (a too-long prompt is not refused)."""
        self._require_alive()
        for name, value in (("prompt_token_ids", prompt_token_ids), ("stop_token_ids", stop_token_ids)):
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
                raise InvalidEvent("invalid_field_type", f"{name} must be a list of token ids", request_id=request_id)
        if not isinstance(ignore_eos, bool):
            raise InvalidEvent("invalid_field_type", "ignore_eos must be a boolean", request_id=request_id)
        prompt = tuple(prompt_token_ids)
        stops = tuple(stop_token_ids)
        if not isinstance(request_id, str) or request_id == "":
            raise InvalidEvent("invalid_request_id", "request id must be a non-empty string", request_id=request_id)
        if request_id in self.requests:
            raise InvalidEvent("duplicate_request_id", f"request {request_id!r} is already live", request_id=request_id)
        if not prompt:
            raise InvalidEvent("empty_prompt", "the prompt has no tokens", request_id=request_id)
        if len(prompt) > self.mml:  # LLMEngine._validate_model_input refuses only longer prompts
            raise InvalidEvent(
                "prompt_too_long", f"prompt of {len(prompt)} tokens is longer than max_model_len", request_id=request_id
            )
        for name, value in (("max_tokens", max_tokens), ("min_tokens", min_tokens), ("priority", priority)):
            if not _is_int(value):
                raise InvalidEvent("invalid_field_type", f"{name} must be an integer", request_id=request_id)
        if priority != 0 and not self.priority_policy:  # LLMEngine.add_request refuses it
            raise InvalidEvent(
                "priority_without_priority_policy",
                "a priority other than 0 needs policy 'priority'",
                request_id=request_id,
            )
        if (
            isinstance(arrival_time, bool)
            or not isinstance(arrival_time, (int, float))
            or (isinstance(arrival_time, float) and not math.isfinite(arrival_time))
        ):
            raise InvalidEvent("invalid_field_type", "arrival_time must be a finite number", request_id=request_id)
        if max_tokens < 1:
            raise InvalidEvent("invalid_max_tokens", "max_tokens must be >= 1", request_id=request_id)
        if not 0 <= min_tokens <= max_tokens:
            raise InvalidEvent("invalid_min_tokens", "min_tokens must be in [0, max_tokens]", request_id=request_id)
        for token in (*prompt, *stops, *(() if eos_token_id is None else (eos_token_id,))):
            if not _is_token(token):
                raise InvalidEvent(
                    "invalid_token_id", f"token ids must be integers in [0, {MAX_TOKEN_ID}]", request_id=request_id
                )
        req = V0Req(
            request_id,
            prompt,
            max_tokens,
            min_tokens,
            priority,
            arrival_time,
            None if ignore_eos else eos_token_id,
            stops,
        )
        self.requests[request_id] = req
        self.seen_ids.add(request_id)
        self.waiting.append(req)

    def abort(self, request_id: str) -> list[str]:
        """``abort_seq_group``: remove the request from its queue, free it, report it in the next step."""
        self._require_alive()
        if request_id not in self.seen_ids:
            raise InvalidEvent(
                "unknown_request_id", f"abort of request {request_id!r}, which was never added", request_id=request_id
            )
        req = self.requests.get(request_id)
        if req is None:
            return []
        for queue in (self.waiting, self.running, self.swapped):
            if req in queue:
                queue.remove(req)
                break
        else:
            return []
        self.finished_ids.append(request_id)
        del self.requests[request_id]
        req.status = FINISHED_ABORTED
        self._free(req)
        return [request_id]

    # ------------------------------------------------------------------ block manager

    def _hashes(self, req: V0Req, num_blocks: int) -> list[int]:
        """The first ``num_blocks`` full-block hashes of the request's tokens (extended lazily)."""
        chain = req.chain
        if len(chain) < num_blocks:
            bs, tokens = self.bs, req.tokens
            parent = chain[-1] if chain else FIRST_BLOCK
            for j in range(len(chain), num_blocks):
                parent = compute_block_hash(parent, tokens[j * bs : (j + 1) * bs])
                chain.append(parent)
        return chain

    def _num_cached_tokens(self, req: V0Req) -> int:
        """``ComputedBlocksTracker.get_num_cached_tokens``: remembered while in prefill, else recomputed."""
        if req.ct_cached is not None and req.prefill:
            return req.ct_cached
        n = len(req.tokens) // self.bs
        chain = self._hashes(req, n)
        cached = self.gpu.count_cached_prefix(chain[:n] if len(chain) > n else chain) * self.bs
        req.ct_cached = cached
        return cached

    def _touched_by_append(self, req: V0Req) -> int:
        """``get_num_blocks_touched_by_append_slots`` for the request's unseen tokens (worst case)."""
        bs = self.bs
        first = bs - req.nfull % bs
        return 1 - ((first - (len(req.tokens) - req.nfull)) // bs)

    def _can_allocate(self, req: V0Req) -> int:
        required = -(-len(req.tokens) // self.bs)
        if self.gpu.num_blocks - required < self.watermark_blocks:
            return NEVER
        if self.gpu.get_num_free_blocks() - required >= self.watermark_blocks:
            return OK
        return LATER

    def _allocate(self, req: V0Req) -> None:
        """``BlockTable.allocate`` of all the request's tokens: full blocks (cached or registered), then the tail."""
        bs, gpu, n = self.bs, self.gpu, len(req.tokens)
        nf = n // bs
        if self.caching:
            chain = self._hashes(req, nf)
            blocks = [gpu.allocate_full(chain[j]) for j in range(nf)]
        else:
            blocks = [gpu.allocate_fresh() for _ in range(nf)]
        if n > nf * bs:
            blocks.append(gpu.allocate_fresh())
        req.blocks = blocks
        req.nfull = n
        req.on_cpu = False
        req.last_access = None

    def _append_slots(self, req: V0Req) -> None:
        """``append_slots``: room for the unseen tokens; blocks they fill are promoted (prefix caching)."""
        blocks = req.blocks
        assert blocks is not None
        bs, n, nfull = self.bs, len(req.tokens), req.nfull
        unseen = n - nfull
        if unseen <= 0:
            return
        gpu = self.gpu
        empty = len(blocks) * bs - nfull
        if empty < unseen:
            for _ in range(-(-(unseen - empty) // bs)):
                blocks.append(gpu.allocate_fresh())
        if self.caching:
            first_full, last_full = nfull // bs, n // bs
            if last_full > first_full:
                chain = self._hashes(req, last_full)
                for j in range(first_full, last_full):
                    blocks[j] = gpu.promote(blocks[j], chain[j])
        req.nfull = n

    def _free(self, req: V0Req) -> None:
        """``block_manager.free``: last access marks (prefix caching), untrack, free the table in order."""
        blocks = req.blocks
        if blocks is None:
            return
        alloc = self.cpu if req.on_cpu else self.gpu
        if self.caching and req.last_access is not None:
            if req.on_cpu:
                # vLLM marks the CPU block ids as accessed in the GPU allocator: KeyError.
                raise self._crash(
                    EngineCrash(
                        "engine_abort_swapped_prefix_cache",
                        "freeing a swapped sequence under prefix caching (vLLM: KeyError)",
                        request_id=req.req_id,
                    )
                )
            alloc.mark_accessed(blocks, req.last_access)
        self._untrack(req)
        self._release(alloc, req, blocks)
        req.blocks = None
        req.last_access = None
        req.on_cpu = False

    def _crash(self, exc: EngineCrash) -> EngineCrash:
        self.crashed = exc.code
        return exc

    def _untrack(self, req: V0Req) -> None:
        """``ComputedBlocksTracker.remove_seq``, which asserts the sequence is tracked."""
        if self.caching:
            if req.ct_cached is None:
                raise self._crash(
                    EngineCrash(
                        "engine_computed_blocks_tracker_assertion",
                        "vLLM's ComputedBlocksTracker.remove_seq asserts on an untracked sequence",
                        request_id=req.req_id,
                    )
                )
            req.ct_cached = None

    def _release(self, alloc: NaiveAllocator, req: V0Req, blocks: list[int]) -> None:
        bs = self.bs
        nf = req.nfull // bs
        if self.caching:
            chain = self._hashes(req, nf)
            for j, b in enumerate(blocks):
                alloc.free_block(b, chain[j] if j < nf else None, (j + 1) * bs)
        else:
            for b in blocks:
                alloc.free_block(b, None, 0)

    def _move(self, req: V0Req, src: NaiveAllocator, dst: NaiveAllocator) -> list[tuple[int, int]]:
        """``CpuGpuBlockAllocator.swap``: free every block on ``src``, then allocate each on ``dst``."""
        blocks = req.blocks
        assert blocks is not None
        self._release(src, req, blocks)
        nf = req.nfull // self.bs
        if self.caching:
            chain = self._hashes(req, nf)
            new = [dst.allocate_full(chain[j]) if j < nf else dst.allocate_fresh() for j in range(len(blocks))]
        else:
            new = [dst.allocate_fresh() for _ in blocks]
        req.blocks = new
        seen: dict[int, int] = {}
        for s, d in zip(blocks, new):
            seen[s] = d
        return list(seen.items())

    def _can_swap(self, req: V0Req, alloc: NaiveAllocator, watermark: int) -> int:
        nf = req.nfull // self.bs
        hashes = self._hashes(req, nf) if self.caching else ()
        touched = self._touched_by_append(req) + alloc.count_full_blocks_touched(hashes, nf)
        if alloc.num_blocks < touched:
            return NEVER
        if alloc.get_num_free_blocks() - touched >= watermark:
            return OK
        return LATER

    # ------------------------------------------------------------------ scheduling pieces

    def _tokens(self, req: V0Req, chunking: bool, budget: _Budget, ppm: _PartialPrefills | None) -> tuple[int, int]:
        """``_get_num_new_uncached_and_cached_tokens`` (one sequence)."""
        cached = 0
        if not req.prefill:
            uncached = 1
        else:
            computed = req.num_computed
            all_new = len(req.tokens) - computed
            if self.caching:
                cached = self._num_cached_tokens(req)
                if cached < computed and not (req.status == RUNNING and self.chunked):
                    # vLLM asserts this never happens; a swapped chunked prefill whose tracker entry
                    # was dropped (not scheduled) comes back with fewer cached than computed tokens.
                    raise self._crash(
                        EngineCrash(
                            "engine_cached_below_computed",
                            "fewer cached than computed tokens for a prefill that is not running",
                            request_id=req.req_id,
                        )
                    )
                cached = max(0, cached - computed)
                uncached = all_new - cached
            else:
                uncached = all_new
        if uncached == 0 and cached > 0:
            uncached, cached = 1, cached - 1
        if chunking:
            remaining = budget.token_budget - budget.batched
            slot = remaining if ppm is None else self.partial_budget[ppm.schedulable]
            if self.caching:
                remaining = (min(remaining, slot) // self.bs) * self.bs
            uncached = min(uncached, remaining, slot)
        return uncached, cached

    def _preempt(self, req: V0Req, out: V0StepOutput, swap_out: list[tuple[int, int]]) -> bool:
        """``_preempt``: True when swapped out, False when sent back to recompute."""
        self.num_cumulative_preemption += 1
        if not self.swap_mode:
            req.status = WAITING
            self._free(req)
            req.num_computed = 0
            req.prefill = True
            return False
        if self._can_swap(req, self.cpu, 0) != OK:
            raise self._crash(
                EngineCrash(
                    "engine_swap_space_exhausted",
                    "Aborted due to the lack of CPU swap space (vLLM raises RuntimeError)",
                    request_id=req.req_id,
                )
            )
        gens = self.gpu.gen
        old_gens = {b: gens[b] for b in req.blocks or ()}
        pairs = self._move(req, self.gpu, self.cpu)
        req.on_cpu = True
        req.status = SWAPPED
        if swap_out is out.blocks_to_swap_out:
            swap_out.extend(pairs)
            out.swap_out_gens.extend(old_gens[g] for g, _ in pairs)
        return True

    def _schedule_running(
        self, budget: _Budget, chunking: bool, ppm: _PartialPrefills | None, out: V0StepOutput
    ) -> tuple[list, list, list, list]:
        """``_schedule_running``: head first; preempt victims from the tail (or the head itself) until it fits."""
        running = self.running
        prefills: list[tuple[V0Req, int]] = []
        decodes: list[tuple[V0Req, int]] = []
        preempted: list[V0Req] = []
        swapped_out: list[V0Req] = []
        gpu = self.gpu
        while running:
            req = running[0]
            n, _ = self._tokens(req, chunking, budget, ppm)
            if n == 0:
                break
            running.popleft()
            while self._touched_by_append(req) > gpu.get_num_free_blocks():
                budget.subtract_tokens(req.req_id, n)
                budget.subtract_seqs(req.req_id, 1)
                if running:
                    victim, again = running.pop(), True
                else:
                    victim, again = req, False
                if self._preempt(victim, out, out.blocks_to_swap_out):
                    swapped_out.append(victim)
                else:
                    preempted.append(victim)
                if not again:
                    break
            else:
                self._append_slots(req)
                if req.prefill:
                    prefills.append((req, n))
                else:
                    decodes.append((req, 1))
                budget.add_tokens(req.req_id, n)
                if chunking:
                    budget.add_seqs(req.req_id, 1)
        return prefills, decodes, preempted, swapped_out

    def _schedule_swapped(self, budget: _Budget, out: V0StepOutput) -> tuple[list, list, list]:
        """``_schedule_swapped`` (always unchunked: vLLM does not pass ``enable_chunking`` here)."""
        swapped = self.swapped
        prefills: list[tuple[V0Req, int]] = []
        decodes: list[tuple[V0Req, int]] = []
        infeasible: list[V0Req] = []
        while swapped:
            req = swapped[0]
            status = self._can_swap(req, self.gpu, self.watermark_blocks)
            if status == LATER:
                break
            if status == NEVER:
                req.status = FINISHED_IGNORED
                self.requests.pop(req.req_id, None)
                infeasible.append(req)
                swapped.popleft()
                continue
            u, c = self._tokens(req, False, budget, None)
            if u == 0 or not budget.can_schedule(u, 1):
                self._untrack(req)
                break
            swapped.popleft()
            out.blocks_to_swap_in.extend(self._move(req, self.cpu, self.gpu))
            req.on_cpu = False
            req.status = RUNNING
            self._append_slots(req)
            if req.prefill:
                prefills.append((req, u + c))
            else:
                decodes.append((req, 1))
            budget.add_tokens(req.req_id, u, c)
            budget.add_seqs(req.req_id, 1)
        return prefills, decodes, infeasible

    def _schedule_prefills(self, budget: _Budget, chunking: bool, ppm: _PartialPrefills | None) -> tuple[list, list]:
        """``_schedule_prefills``: admit from the head of ``waiting`` while the prompt fits."""
        if budget.token_budget - budget.batched == 0:
            return [], []
        waiting = self.waiting
        scheduled: list[tuple[V0Req, int]] = []
        ignored: list[V0Req] = []
        leftover: deque[V0Req] = deque()
        while waiting:
            req = waiting[0]
            if req.status != WAITING:
                # vLLM asserts exactly one WAITING sequence here; a swap-mode victim of priority
                # preemption sits in ``waiting`` with status SWAPPED and kills the engine.
                raise self._crash(
                    EngineCrash(
                        "engine_swapped_group_in_waiting",
                        "a swapped group sits in the waiting queue (vLLM's assertion fails)",
                        request_id=req.req_id,
                    )
                )
            if ppm is not None and not ppm.can_schedule(req):
                leftover.appendleft(req)
                waiting.popleft()
                continue
            u, c = self._tokens(req, chunking, budget, ppm)
            n = u + c
            if n > self.prompt_limit:
                self._ignore(req, ignored)
                continue
            status = self._can_allocate(req)
            if status == LATER:
                self._untrack(req)
                break
            if status == NEVER:
                self._ignore(req, ignored)
                continue
            if budget.batched >= self.mnbt or u == 0 or not budget.can_schedule(u, 1):
                self._untrack(req)
                break
            waiting.popleft()
            self._allocate(req)
            req.status = RUNNING
            if ppm is not None:
                ppm.maybe_increment(req)
            scheduled.append((req, n))
            budget.add_tokens(req.req_id, u, c)
            budget.add_seqs(req.req_id, 1)
        waiting.extendleft(leftover)
        return scheduled, ignored

    def _ignore(self, req: V0Req, ignored: list[V0Req]) -> None:
        req.status = FINISHED_IGNORED
        self._untrack(req)
        self.requests.pop(req.req_id, None)
        ignored.append(req)
        self.waiting.popleft()

    def _priority(self, req: V0Req) -> tuple[Any, Any]:
        return req.priority, req.arrival_time

    def _schedule_priority_preemption(self, budget: _Budget, out: V0StepOutput) -> None:
        """``_schedule_priority_preemption``: the waiting head preempts worse-priority running groups."""
        waiting = self.waiting
        key = self._priority
        running = deque(sorted(self.running, key=key))
        if waiting:
            req = waiting.popleft()
            is_waiting = req.status == WAITING
            u = self._tokens(req, False, budget, None)[0] if is_waiting else 0
            while running and key(running[-1]) > key(req):
                if not is_waiting:
                    raise self._crash(
                        EngineCrash(
                            "engine_swapped_group_in_waiting",
                            "can_allocate of a swapped group in waiting (vLLM: IndexError)",
                            request_id=req.req_id,
                        )
                    )
                if u > 0 and self._can_allocate(req) == OK and budget.can_schedule(u, 1):
                    break
                victim = running.pop()
                vu, _ = self._tokens(victim, False, budget, None)
                budget.subtract_tokens(victim.req_id, vu)
                budget.subtract_seqs(victim.req_id, 1)
                self._preempt(victim, out, [])  # vLLM drops this swap mapping
                waiting.appendleft(victim)
            waiting.appendleft(req)
            if is_waiting:
                self._untrack(req)
        self.waiting = deque(sorted(waiting, key=key))
        self.running = running

    def _schedule_default(self, out: V0StepOutput) -> list[tuple[V0Req, int]]:
        budget = _Budget(self.mnbt, self.config.max_num_seqs)
        for r in self.running:
            budget.add_seqs(r.req_id, 1)
        prefills: list[tuple[V0Req, int]] = []
        ignored: list[V0Req] = []
        decodes: list = []
        preempted: list = []
        swapped_out: list = []
        sw_decodes: list = []
        infeasible: list = []
        if not self.swapped:
            prefills, ignored = self._schedule_prefills(budget, False, None)
        if not prefills and self.priority_policy:
            self._schedule_priority_preemption(budget, out)
        if not prefills:
            _, decodes, preempted, swapped_out = self._schedule_running(budget, False, None, out)
            if not preempted and not swapped_out:
                _, sw_decodes, infeasible = self._schedule_swapped(budget, out)
        self.waiting.extendleft(preempted)
        running = self.running
        running.extend(r for r, _ in prefills)
        running.extend(r for r, _ in decodes)
        running.extend(r for r, _ in sw_decodes)
        self.swapped.extend(swapped_out)
        out.num_prefill_groups = len(prefills)
        out.num_batched_tokens = budget.batched + budget.cached
        out.ignored = ignored + infeasible
        out.preempted = len(preempted) + len(swapped_out)
        return prefills + decodes + sw_decodes

    def _schedule_chunked(self, out: V0StepOutput) -> list[tuple[V0Req, int]]:
        budget = _Budget(self.mnbt, self.config.max_num_seqs)
        ppm = _PartialPrefills(self)
        run_prefills, decodes, preempted, swapped_out = self._schedule_running(budget, True, ppm, out)
        sw_prefills: list = []
        sw_decodes: list = []
        infeasible: list = []
        if not preempted and not swapped_out:
            sw_prefills, sw_decodes, infeasible = self._schedule_swapped(budget, out)
        prefills, ignored = self._schedule_prefills(budget, True, ppm)
        self.waiting.extendleft(preempted)
        running = self.running
        running.extend(r for r, _ in sw_decodes)
        running.extend(r for r, _ in sw_prefills)
        running.extend(r for r, _ in decodes)
        running.extend(r for r, n in run_prefills if len(r.tokens) - r.num_computed == n)
        running.extend(r for r, n in run_prefills if len(r.tokens) - r.num_computed != n)
        running.extend(r for r, _ in prefills)
        self.swapped.extend(swapped_out)
        out.num_prefill_groups = len(prefills) + len(sw_prefills) + len(run_prefills)
        out.num_batched_tokens = budget.batched + budget.cached
        out.ignored = ignored + infeasible
        out.preempted = len(preempted) + len(swapped_out)
        return prefills + run_prefills + sw_prefills + decodes + sw_decodes

    # ------------------------------------------------------------------ steps

    def schedule(self) -> V0StepOutput:
        """``Scheduler.schedule()`` plus ``get_and_reset_finished_requests_ids()`` (as ``LLMEngine.step``)."""
        self._require_alive()
        if self.pending is not None:
            raise InvalidEvent("output_not_processed", "schedule() called before update_from_output()")
        self.clock += 1
        now = self.clock
        out = V0StepOutput()
        try:
            scheduled = self._schedule_chunked(out) if self.chunked else self._schedule_default(out)
        except StaleEvictorEntry as exc:
            raise self._crash(EngineCrash("engine_evictor_stale_entry", str(exc))) from None
        except NoFreeBlocks as exc:
            raise self._crash(EngineCrash("engine_no_free_blocks", str(exc))) from None
        out.running_queue_size = len(self.running)
        caching, bs = self.caching, self.bs
        entries = out.entries
        for req, chunk in scheduled:
            blocks = req.blocks
            assert blocks is not None
            if caching:
                req.last_access = now
                computed = blocks[: self._num_cached_tokens(req) // bs]
            else:
                computed = []
            is_prompt = req.prefill
            do_sample = not (is_prompt and chunk + req.num_computed < len(req.tokens))
            entries.append((req, chunk, is_prompt, do_sample, list(blocks), computed, req.num_computed))
        if caching and scheduled:
            self.gpu.mark_computed()
        out.finished_requests_ids = self.finished_ids
        self.finished_ids = []
        self.pending = out
        return out

    def validate_model_output(
        self, out: V0StepOutput, sampled: Mapping[str, Sequence[int]], drafts: Mapping[str, Sequence[int]]
    ) -> None:
        """Refuse model output no model could have produced for ``out``."""
        self._require_alive()
        if out is not self.pending:
            raise InvalidEvent("unexpected_model_output", "model output needs the last schedule() output, once")
        if drafts:
            raise InvalidEvent("drafts_without_spec_decode", "v0 has no speculative decoding")
        sampling = {e[0].req_id: e for e in out.entries if e[3]}
        for rid, tokens in sampled.items():
            if rid not in sampling:
                raise InvalidEvent("unscheduled_model_output", f"sampled tokens for {rid!r}, which does not sample")
            if len(tokens) > 1:
                raise InvalidEvent("bad_num_sampled_tokens", f"request {rid!r} samples one token per step")
            for t in tokens:
                if not _is_token(t):
                    raise InvalidEvent("invalid_token_id", f"sampled token ids must be integers in [0, {MAX_TOKEN_ID}]")
        for rid, e in sampling.items():
            if not e[0].is_finished and len(sampled.get(rid, ())) != 1:
                raise InvalidEvent("bad_num_sampled_tokens", f"request {rid!r} samples exactly one token")

    def update_from_output(self, out: V0StepOutput, sampled: Sequence[int | None]) -> list[RequestOutputTuple]:
        """``LLMEngine``'s update of one step; ``sampled[i]`` is entry ``i``'s token (None when it does not sample).

        Trusts its input: run ``validate_model_output`` first for untrusted output.
        """
        self._require_alive()
        if out is not self.pending:
            raise InvalidEvent("unexpected_model_output", "model output needs the last schedule() output, once")
        self.pending = None
        results: list[RequestOutputTuple] = []
        any_finished = False
        mml = self.mml
        for entry, tok in zip(out.entries, sampled):
            req, chunk, _, do_sample = entry[0], entry[1], entry[2], entry[3]
            if req.status > SWAPPED:
                continue
            req.num_computed += chunk
            tokens = req.tokens
            if req.num_computed == len(tokens):
                req.prefill = False
            if not do_sample:
                continue
            tokens.append(tok)  # type: ignore[arg-type]
            num_out = len(tokens) - req.num_prompt
            status = RUNNING
            if num_out >= req.min_tokens:
                if tok == req.eos:
                    status = FINISHED_STOPPED
                elif tok in req.stops:
                    status = FINISHED_STOPPED
                    req.stop_reason = tok
                elif len(tokens) >= mml or num_out == req.max_tokens:
                    status = FINISHED_LENGTH_CAPPED
            if status != RUNNING:
                req.status = status
                any_finished = True
                self._free(req)  # SingleStepOutputProcessor frees at once, in scheduled order
                results.append((req.req_id, (tok,), FINISH_REASONS[status], req.stop_reason))
            else:
                results.append((req.req_id, (tok,), None, None))
        if any_finished:
            remaining: deque[V0Req] = deque()
            for r in self.running:
                if r.status > SWAPPED:
                    self.finished_ids.append(r.req_id)
                    self.requests.pop(r.req_id, None)
                    self._free(r)
                else:
                    remaining.append(r)
            self.running = remaining
        for req in out.ignored:
            results.append((req.req_id, (), "length", None))
        return results

    # ------------------------------------------------------------------ views

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def observe(self) -> dict[str, Any]:
        """Free blocks per device and each request's table (the contract's ``observe`` for v0)."""
        gpu_tables: dict[str, list[int]] = {}
        cpu_tables: dict[str, list[int]] = {}
        for queue in (self.waiting, self.running, self.swapped):
            for r in queue:
                if r.blocks is not None:
                    (cpu_tables if r.on_cpu else gpu_tables)[r.req_id] = list(r.blocks)
        return {
            "num_free_gpu_blocks": self.gpu.get_num_free_blocks(),
            "num_free_cpu_blocks": self.cpu.get_num_free_blocks(),
            "block_tables": dict(sorted(gpu_tables.items())),
            "cpu_block_tables": dict(sorted(cpu_tables.items())),
        }
