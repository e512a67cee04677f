"""The fast scheduler: vLLM 0.33's v1 scheduling rules, written for speed.

It makes exactly the decisions of ``spec/v1/scheduler.py`` (the strict comparison:
block ids, list orders and the free-queue order included) for the profiles
``vllm-0.33`` and ``vllm-0.32``, but is organised for a per-step cost close to
the minimum a Python scheduler can have:

* Requests are ``__slots__`` records with plain integer statuses; a request's
  block table is a list of block ids; the block pool keeps reference counts,
  hashes and the free queue's links in flat lists indexed by block id (the free
  queue is a doubly linked list over those lists, so every queue operation is
  O(1) and nothing is ever rescanned).
* Block hashes are computed lazily, never on every appended token. A block that
  fills is cached at once (its place in the free queue depends on it) but
  hashed and indexed only before the next prefix-cache lookup, in the order the
  blocks were cached: a steady decode step computes no hash.
* ``schedule()`` updates ``num_computed_tokens`` and the prefill-chunk flag in
  the same pass that decides the batch (the reference does it in a second
  pass); a running request that needs no new block costs a few integer
  operations.
* A step's decisions are recorded as one tuple per scheduled request
  (:class:`StepOutput`); ``update_from_output`` takes the sampled tokens as a
  list aligned with those tuples (what a model runner naturally produces) and
  has a fast path for the common case of one sampled token and no stop.

Rules (each one is the reference's; the reference's docstrings derive them):

* running loop: each running request gets ``min(tokens it lacks, threshold,
  budget, max_model_len - 1 - computed)`` tokens; when its slots do not fit,
  the victim (FCFS: tail of ``running``; priority: first maximal
  ``(priority, arrival_time)``) is preempted by recompute until they do, or the
  request preempted itself (FCFS and 0.32: end of loop; 0.33 priority: go on);
* the waiting loop runs only in a step without preemption; it admits from the
  head while budget, seats (``max_num_seqs``) and blocks last, with prefix hits,
  the full-sequence admission gate, the spec-decode padding of one-token
  admissions and, with chunked prefill off, a stop at the first prompt that
  does not fit the budget;
* ``update_from_output`` rolls back rejected drafts, appends tokens one by one
  with the stop check (EOS, stop ids, length), trims tokens after a stop, caches
  full blocks after a spec-decode update (0.33), frees stopped requests, then
  stores the drafts proposed for the next step.

In-flight steps (vLLM's batch queue, ``EngineCore.step_with_batch_queue``):
``schedule()`` may be called again before the model output of earlier steps
came back, up to ``config.max_concurrent_batches`` steps in flight; outputs are
applied oldest first (``get_in_flight_output(step)`` names the one to apply).
Per request the scheduler counts ``in_flight`` (tokens of steps in flight) and,
after a preemption with steps in flight, ``stale`` (of those, the ones scheduled
before the preemption: their tokens are appended without touching the counters
the preemption reset, and the waiting loop skips the request until they are
back). Under an ``-async`` profile (vLLM's ``AsyncScheduler``) every scheduled
request that is not a prefill chunk gains ``1 + drafts`` output
``placeholders``: they count as tokens to compute, so a decode is scheduled
again while its previous token is still being sampled, and a request whose
steps in flight are sure to reach ``max_tokens`` is skipped. With spec decode
the worker keeps its drafts: a scheduled request that is not a prefill chunk
gets ``[-1] * k`` drafts for its next step, the drafts a step schedules are
those past ``num_tokens + placeholders``, a rejected draft also resolves its
placeholder, and a model output carrying drafts is refused
(``drafts_under_async_scheduling``). On a stop inside a multi-token output
0.33 forgets the trimmed tokens' ``num_computed_tokens`` and resolves a
placeholder for every returned token; 0.32 does neither (only the kept tokens
resolve theirs) and caches after the update up to ``num_computed -
placeholders``.

Invalid input raises ``schedconf.spec.errors.InvalidEvent`` with the reference's error
codes (the shared vocabulary of the trace format), leaving the state unchanged.
"""

# Size: the fast scheduler is one hot loop over plain lists; splitting it across modules costs
# attribute lookups on the step path that bench/bench_impl.py measures.

from __future__ import annotations

import hashlib
import heapq
import math
import struct
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

from schedconf.spec.errors import EngineCrash, InvalidConfig, InvalidEvent
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.profiles import check_config_for_profile, get_profile

# Request statuses, as small integers (compared with ==, never ordered).
WAITING, RUNNING, PREEMPTED, FINISHED_STOPPED, FINISHED_LENGTH_CAPPED, FINISHED_ABORTED = range(6)
STATUS_NAMES = ("WAITING", "RUNNING", "PREEMPTED", "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED")
FINISH_REASONS: dict[int, str] = {FINISHED_STOPPED: "stop", FINISHED_LENGTH_CAPPED: "length", FINISHED_ABORTED: "abort"}

# Entry kinds of a scheduled request (StepOutput.kinds).
KIND_RUNNING, KIND_NEW, KIND_RESUMED = 0, 1, 2

SUPPORTED_PROFILES = ("vllm-0.33", "vllm-0.32", "vllm-0.33-async", "vllm-0.32-async")
ASYNC_SUFFIX = "-async"
"""A profile ``<release>-async`` is the release's rules driven by vLLM's ``AsyncScheduler``."""
_HASH_SEED = hashlib.sha256(b"schedconf/impl/block-hash/v1").digest()
_NO_BLOCKS: tuple[int, ...] = ()
NOT_HASHED = b""
"""``BlockPool.block_hash`` of a cached block whose hash is not computed yet (no SHA-256 digest is empty)."""


class UnsupportedProfile(Exception):
    """The fast scheduler implements only the profiles in SUPPORTED_PROFILES."""


class Req:
    """One request: prompt, tokens so far, counters, block table and stop rules.

    ``tokens`` is prompt + outputs (``all_token_ids``); ``blocks`` is the block
    table, or None while the request holds no blocks (waiting / preempted);
    ``stopset`` holds every token id that stops the request (EOS unless
    ignored, and the stop ids), and ``length_cap`` the sequence length at which
    it stops by length: ``min(max_model_len, prompt + max_tokens)``.
    """

    __slots__ = (
        "req_id",
        "prompt",
        "tokens",
        "num_prompt",
        "num_computed",
        "spec",
        "hashes",
        "status",
        "priority",
        "arrival",
        "eos",
        "stop_ids",
        "stopset",
        "max_tokens",
        "min_tokens",
        "length_cap",
        "is_prefill_chunk",
        "stop_reason",
        "blocks",
        "num_cached",
        "num_preemptions",
        "placeholders",
        "in_flight",
        "stale",
        "drop_stale",
        "next_decode",
        "room",
    )

    def __init__(
        self,
        req_id: str,
        prompt: tuple[int, ...],
        max_tokens: int,
        min_tokens: int,
        priority: int,
        arrival: int | float,
        eos: int | None,
        stop_ids: tuple[int, ...],
        length_cap: int,
    ) -> None:
        self.req_id = req_id
        self.prompt = prompt
        self.tokens: list[int] = list(prompt)
        self.num_prompt = len(prompt)
        self.num_computed = 0
        self.spec: list[int] = []
        self.hashes: list[bytes] = []
        self.status = WAITING
        self.priority = priority
        self.arrival = arrival
        self.eos = -1 if eos is None else eos
        self.stop_ids = frozenset(stop_ids)
        self.stopset = self.stop_ids | ({eos} if eos is not None else set())
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.length_cap = length_cap
        self.is_prefill_chunk = False
        self.stop_reason: int | None = None
        self.blocks: list[int] | None = None
        self.num_cached = 0
        self.num_preemptions = 0
        self.placeholders = 0
        """``num_output_placeholders`` (async profiles): output tokens scheduled, not yet returned."""
        self.in_flight = 0
        """``num_in_flight_tokens``: tokens of steps scheduled whose model output is not applied yet.

        Counted only where steps may overlap (``FastScheduler.count_in_flight``); in the
        synchronous loop it stays 0 (the one step in flight holds the count, for a reset)."""
        self.stale = 0
        """``num_stale_output_tokens``: of ``in_flight``, those scheduled before the last preemption."""
        self.drop_stale = False
        """``drop_stale_output``: the stale output is dropped, not delivered (a ``reset_prefix_cache`` preemption)."""
        self.next_decode = 0
        """``next_decode_eligible_step`` (V2 runner + pipeline parallelism + async: the decode stagger)."""
        self.room = -1
        """The running loop's steady-decode test (derived, kept by the scheduler): a
        ``num_tokens + placeholders`` up to which a one-token step needs no new block and fills
        no block to cache, ``FastScheduler._room``, or -1 (no blocks, a prefill chunk, or
        drafts). It may lag behind (a block cached after the update only raises the true bound)."""

    @property
    def num_tokens(self) -> int:
        """Prompt plus outputs."""
        return len(self.tokens)

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far (kept across preemptions)."""
        return len(self.tokens) - self.num_prompt

    @property
    def output_token_ids(self) -> list[int]:
        """The sampled tokens, in order."""
        return self.tokens[self.num_prompt :]

    @property
    def is_finished(self) -> bool:
        """True once the request reached a FINISHED_* status."""
        return self.status >= FINISHED_STOPPED


class BlockPool:
    """Blocks as flat lists: reference counts, hashes, and the free queue's links.

    The free queue is in eviction order (front reused first) and holds exactly
    the blocks with ``ref_cnt == 0`` other than the null block 0. Two sentinel
    ids, ``num_blocks`` (head) and ``num_blocks + 1`` (tail), bound it.
    ``cached`` maps a block hash to the blocks carrying it, first inserted
    first (a lookup returns the first). A cached block not indexed yet has the
    hash ``NOT_HASHED`` and an entry in ``unindexed`` (block id to its request
    and index in that request's block table, in the order the blocks were
    cached); the scheduler indexes them before a lookup. ``gen[b]`` counts how
    often block ``b`` was taken from the free queue: a model runner compares it
    with the generation it wrote the block's KV in, to know whether the KV a
    prefix hit points to was ever computed (see ``impl/runner.py``).
    """

    __slots__ = (
        "num_blocks",
        "ref",
        "block_hash",
        "nxt",
        "prv",
        "head",
        "tail",
        "num_free",
        "cached",
        "unindexed",
        "caching",
        "gen",
    )

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self.ref = [0] * num_blocks
        self.ref[0] = 1 << 30  # the null block is never free
        self.block_hash: list[bytes | None] = [None] * num_blocks
        head, tail = num_blocks, num_blocks + 1
        self.head, self.tail = head, tail
        # Initially blocks 1..N-1 in id order.
        self.nxt = list(range(1, num_blocks + 2))
        self.prv = list(range(-1, num_blocks + 1))
        self.nxt.append(0)  # tail's next (unused)
        self.nxt[head] = 1 if num_blocks > 1 else tail
        self.prv[1 if num_blocks > 1 else tail] = head
        self.nxt[num_blocks - 1] = tail
        self.prv[tail] = num_blocks - 1 if num_blocks > 1 else head
        self.num_free = num_blocks - 1
        self.cached: dict[bytes, list[int]] = {}
        self.unindexed: dict[int, tuple[Any, int]] = {}
        self.gen = [0] * num_blocks

    def free_queue(self) -> list[int]:
        """The free queue, front (evicted first) to back."""
        out: list[int] = []
        nxt, b, tail = self.nxt, self.nxt[self.head], self.tail
        while b != tail:
            out.append(b)
            b = nxt[b]
        return out

    def pop_front(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front, evict their hashes, give each ``ref_cnt`` 1."""
        nxt, ref, block_hash, gen = self.nxt, self.ref, self.block_hash, self.gen
        out: list[int] = []
        b = nxt[self.head]
        for _ in range(n):
            out.append(b)
            ref[b] = 1
            gen[b] += 1
            if block_hash[b] is not None:
                self._evict(b)
            b = nxt[b]
        nxt[self.head] = b
        self.prv[b] = self.head
        self.num_free -= n
        return out

    def pop_one(self) -> int:
        """``pop_front(1)``'s block, without the list."""
        nxt, head = self.nxt, self.head
        b = nxt[head]
        self.ref[b] = 1
        self.gen[b] += 1
        if self.block_hash[b] is not None:
            self._evict(b)
        after = nxt[b]
        nxt[head] = after
        self.prv[after] = head
        self.num_free -= 1
        return b

    def _evict(self, b: int) -> None:
        """Drop block ``b`` from the prefix cache (it is being reused)."""
        h = self.block_hash[b]
        assert h is not None
        if h is NOT_HASHED:
            del self.unindexed[b]
            self.block_hash[b] = None
            return
        entries = self.cached.get(h)
        if entries is not None:
            entries.remove(b)
            if not entries:
                del self.cached[h]
        self.block_hash[b] = None

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks, unlinking the free ones from the queue."""
        ref, nxt, prv = self.ref, self.nxt, self.prv
        for b in blocks:
            if ref[b] == 0:
                p, q = prv[b], nxt[b]
                nxt[p] = q
                prv[q] = p
                self.num_free -= 1
            ref[b] += 1

    def release(self, blocks_tail_first: Iterable[int]) -> None:
        """Drop one reference from each block; the first given is evicted first.

        Blocks reaching 0 without a hash go to the front of the queue (in the
        given order), hashed ones to the back (in the given order).
        """
        ref, block_hash = self.ref, self.block_hash
        front: list[int] = []
        back: list[int] = []
        caching = self.caching
        for b in blocks_tail_first:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if caching and block_hash[b] is not None:
                    back.append(b)
                else:
                    front.append(b)
        nxt, prv = self.nxt, self.prv
        if front:
            first = nxt[self.head]
            prev = self.head
            for b in front:
                nxt[prev] = b
                prv[b] = prev
                prev = b
            nxt[prev] = first
            prv[first] = prev
        if back:
            prev = prv[self.tail]
            for b in back:
                nxt[prev] = b
                prv[b] = prev
                prev = b
            nxt[prev] = self.tail
            prv[self.tail] = prev
        self.num_free += len(front) + len(back)


class StepOutput:
    """The decisions of one ``schedule()`` call.

    ``entries`` holds one ``(request, num_new_tokens, num_computed_before,
    num_tokens_at_schedule, blocks)`` tuple per scheduled request, in vLLM's
    ``num_scheduled_tokens`` order: the running loop's requests first, then the
    waiting loop's admissions (``kinds`` tells new from resumed for those).
    ``num_tokens_at_schedule`` counts the request's output placeholders (async
    profiles): positions from ``len(request.tokens)`` at scheduling time up to it
    hold tokens that steps still in flight are sampling. ``blocks`` are the
    blocks allocated this step for a running request and the whole table for an
    admitted one. ``spec_tokens`` are the drafts scheduled per request id. A
    request *samples* iff ``before + n >= num_tokens_at_schedule``.
    """

    __slots__ = (
        "step",
        "entries",
        "num_running",
        "kinds",
        "spec_tokens",
        "finished_req_ids",
        "preempted_req_ids",
        "total_num_scheduled_tokens",
        "v2_layout",
        "changed_in_flight",
    )

    def __init__(
        self,
        step: int,
        entries: list[tuple[Req, int, int, int, Sequence[int]]],
        num_running: int,
        kinds: list[int],
        spec_tokens: dict[str, list[int]],
        finished_req_ids: set[str],
        preempted_req_ids: set[str],
        total: int,
    ) -> None:
        self.step = step
        self.entries = entries
        self.num_running = num_running
        self.kinds = kinds
        self.spec_tokens = spec_tokens
        self.finished_req_ids = finished_req_ids
        self.preempted_req_ids = preempted_req_ids
        self.total_num_scheduled_tokens = total
        self.v2_layout = False
        """``use_v2_model_runner``: resumed requests are listed after the new ones, as new requests."""
        self.changed_in_flight = False
        """Set once a request finished or was preempted while this step was in flight (by the
        scheduler, for ``update_from_output``: then it checks each request for both)."""

    @property
    def req_ids(self) -> list[str]:
        """The scheduled request ids, in batch order."""
        return [e[0].req_id for e in self.entries]

    def samples(self, index: int) -> bool:
        """Does scheduled entry ``index`` reach the end of its sequence (and so sample)?"""
        _, n, before, ntok, _ = self.entries[index]
        return before + n >= ntok

    def to_canonical(self) -> dict[str, Any]:
        """The trace form, exactly as ``schedconf.spec.output.SchedulerOutput.to_canonical``."""
        new: list[dict[str, Any]] = []
        running: list[dict[str, Any]] = []
        resumed: list[dict[str, Any]] = []
        resumed_as_new: list[dict[str, Any]] = []
        num_scheduled: dict[str, int] = {}
        for index, (req, n, before, ntok, blocks) in enumerate(self.entries):
            num_scheduled[req.req_id] = n
            kind = KIND_RUNNING if index < self.num_running else self.kinds[index - self.num_running]
            if kind == KIND_NEW or (kind == KIND_RESUMED and self.v2_layout):
                (new if kind == KIND_NEW else resumed_as_new).append(
                    {"req_id": req.req_id, "block_ids": list(blocks), "num_computed_tokens": before}
                )
            else:
                (running if kind == KIND_RUNNING else resumed).append(
                    {
                        "req_id": req.req_id,
                        "resumed": kind == KIND_RESUMED,
                        "new_block_ids": list(blocks),
                        "num_computed_tokens": before,
                        "num_output_tokens": ntok - req.num_prompt,
                    }
                )
        return {
            "scheduled_new_reqs": new + resumed_as_new,
            "scheduled_cached_reqs": running + resumed,
            "num_scheduled_tokens": dict(sorted(num_scheduled.items())),
            "total_num_scheduled_tokens": self.total_num_scheduled_tokens,
            "scheduled_spec_decode_tokens": {k: list(v) for k, v in sorted(self.spec_tokens.items())},
            "finished_req_ids": sorted(self.finished_req_ids),
            "preempted_req_ids": sorted(self.preempted_req_ids),
        }


RequestOutputTuple = tuple[str, Sequence[int], str | None, int | None]
"""``(req_id, new_token_ids, finish_reason, stop_reason)``, one per request that gained tokens or stopped."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAX_TOKEN_ID = 2**31 - 1
"""Token ids are int32 (vLLM's input ids); larger ids are refused with ``invalid_token_id``."""


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _is_arrival(value: object) -> bool:
    """A finite int or float (not a boolean, NaN or infinity), as the reference accepts."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


class FastScheduler:
    """The v1 scheduler for one config and profile ``vllm-0.33`` or ``vllm-0.32`` (or their ``-async`` forms).

    Every ``schedule()`` is answered by exactly one ``update_from_output()``, in
    schedule order; up to ``config.max_concurrent_batches`` steps may be in
    flight (1: the synchronous loop). ``add_request`` and ``abort`` may come
    between any two calls.
    """

    def __init__(self, config: SchedulerConfig, profile: str = "vllm-0.33") -> None:
        if profile not in SUPPORTED_PROFILES:
            raise UnsupportedProfile(f"impl supports the profiles {', '.join(SUPPORTED_PROFILES)}, not {profile!r}")
        release = profile.removesuffix(ASYNC_SUFFIX)
        self.async_scheduling = profile != release
        check_config_for_profile(config, get_profile(profile))  # the release's start-up refusals
        # Several GPUs as the scheduler sees them (spec/v1/profiles.py pp_decode_stagger,
        # prefill_throttle, local_prefill_cadence): the decode stagger (V2 runner, async), and
        # prefill deferral on a throttled step or off the local cadence, with its capacity escape.
        rules = get_profile(profile)
        pp = getattr(config, "pipeline_parallel_size", 1)
        v2 = bool(getattr(config, "use_v2_model_runner", False))
        self.decode_stagger = pp if (self.async_scheduling and v2 and rules.pp_decode_stagger) else 0
        self.prefill_interval = getattr(config, "prefill_schedule_interval", 1)
        self.prefill_capacity_bound = False
        self.num_executed_steps = 0
        self.last_prefill_step = -self.prefill_interval
        self.deferred_waiting: set[str] = set()  # waiting ids skipped for stale output, not admitted since
        self._prefill_admitted = False
        self.max_concurrent_batches = getattr(config, "max_concurrent_batches", 1)
        if not _is_int(self.max_concurrent_batches) or self.max_concurrent_batches < 1:
            raise InvalidConfig("invalid_max_concurrent_batches", "max_concurrent_batches must be >= 1")
        self.count_in_flight = self.max_concurrent_batches > 1
        """Keep ``Req.in_flight``. In the synchronous loop a step's output is applied before the
        next ``schedule()``, so only a reset between the two finds tokens in flight, and it reads
        them from that step (``reset_prefix_cache``)."""
        self.config = config
        self.profile = profile
        self.bs = config.block_size
        self.mml = config.max_model_len
        self.budget = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        # vLLM 0.32+ knobs (check_config_for_profile refuses them where absent):
        # the waiting loop's admission cap, the adaptive threshold, the V2
        # model runner's output layout.
        active = getattr(config, "max_num_active_seqs", None)
        self.max_num_active = config.max_num_seqs if active is None else active
        self.adaptive_threshold = bool(getattr(config, "long_prefill_token_threshold_adaptive", False))
        self.v2_layout = bool(getattr(config, "use_v2_model_runner", False))
        self.threshold = config.long_prefill_token_threshold
        self.chunked = config.enable_chunked_prefill
        self.caching = config.enable_prefix_caching
        self.priority = config.policy == "priority"
        self.k = config.num_spec_tokens
        self.lookahead = config.num_lookahead_tokens
        # Both supported profiles default to the full-sequence admission gate.
        self.reserve_full = True if config.scheduler_reserve_full_isl is None else config.scheduler_reserve_full_isl
        self.self_preempt_continue = release == "vllm-0.33"
        # On a stop inside a multi-token output: 0.33 forgets the trimmed
        # tokens' num_computed_tokens and resolves a placeholder for every
        # returned token; 0.32 does neither (only the kept tokens resolve theirs).
        self.trim_on_stop = release == "vllm-0.33"
        self.resolve_trimmed = release == "vllm-0.33"
        self.spec_placeholders: list[int] = [-1] * self.k
        """Async + spec decode: the drafts a scheduled request gets for its next step (the worker fills them in)."""
        # After appending a running request's tokens, cache the blocks its
        # settled tokens fill: 0.33 does it when the request had placeholders
        # or with spec decode, up to ``num_computed - in_flight``; 0.32 only in
        # AsyncScheduler (where every request that samples had placeholders),
        # up to ``num_computed - placeholders``.
        self.cache_after_spec_update = (release == "vllm-0.33" and self.k > 0) or self.async_scheduling
        self.cache_minus_placeholders = release == "vllm-0.32"
        self.pool = BlockPool(config.num_gpu_blocks, self.caching)
        self._pack_block = struct.Struct(f"{self.bs}q").pack  # one block's token ids as native int64s
        self.requests: dict[str, Req] = {}
        self.seen_ids: set[str] = set()
        self.running: list[Req] = []
        self._fcfs: deque[Req] = deque()
        self._heap: list[tuple[int, int, str, Req]] = []
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        self.current_step = 0
        self.in_flight: deque[StepOutput] = deque()
        """Steps scheduled whose model output is not applied yet, oldest first."""
        self.num_preemptions = 0
        self.num_stale_outputs = 0
        """Model outputs delivered to a request preempted after the step that sampled them (counted per request)."""
        self.crashed: str | None = None  # the engine crash that killed this scheduler

    # ------------------------------------------------------------------ waiting queue

    def _waiting_len(self) -> int:
        return len(self._heap) if self.priority else len(self._fcfs)

    def _waiting_peek(self) -> Req:
        return self._heap[0][3] if self.priority else self._fcfs[0]

    def _waiting_pop(self) -> None:
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()

    def _waiting_push_front(self, req: Req) -> None:
        """A preempted request goes to the head (FCFS) or back by its key (priority)."""
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival, req.req_id, req))
        else:
            self._fcfs.appendleft(req)

    def _waiting_remove(self, reqs: set[Req]) -> None:
        if self.priority:
            self._heap = [item for item in self._heap if item[3] not in reqs]
            heapq.heapify(self._heap)
        else:
            self._fcfs = deque(r for r in self._fcfs if r not in reqs)

    def waiting_ids(self) -> list[str]:
        """The waiting queue in admission order."""
        if self.priority:
            return [item[3].req_id for item in sorted(self._heap, key=lambda item: item[:3])]
        return [r.req_id for r in self._fcfs]

    @property
    def pending(self) -> StepOutput | None:
        """The newest step in flight (the last ``schedule()``'s), or None."""
        return self.in_flight[-1] if self.in_flight else None

    def is_scheduled_in_flight(self, request_id: str) -> bool:
        """True if a step still in flight scheduled ``request_id``."""
        for out in self.in_flight:
            for e in out.entries:
                if e[0].req_id == request_id:
                    return True
        return False

    def get_in_flight_output(self, step: int) -> StepOutput:
        """The step whose model output is to be applied, if it is ``step``; refusals change nothing.

        ``unscheduled_step``: never scheduled (``step < 1`` or past the last
        step); ``duplicate_model_output``: its output was applied already;
        ``model_output_out_of_order``: an older step is still in flight (outputs
        are applied in schedule order, as vLLM's batch queue does).
        """
        self._require_alive()
        if not _is_int(step) or not 1 <= step <= self.current_step:
            raise InvalidEvent(
                "unscheduled_step",
                f"model output for step {step!r}, which was never scheduled (last step: {self.current_step})",
                step=step,
            )
        oldest = self.in_flight[0].step if self.in_flight else self.current_step + 1
        if step < oldest:
            raise InvalidEvent(
                "duplicate_model_output", f"model output for step {step}, whose output was already applied", step=step
            )
        if step > oldest:
            raise InvalidEvent(
                "model_output_out_of_order",
                f"model output for step {step} while step {oldest} is "
                "still in flight (outputs are applied in schedule order)",
                step=step,
            )
        return self.in_flight[0]

    def _require_alive(self) -> None:
        """After an engine crash every call is refused (``engine_dead``)."""
        if self.crashed is not None:
            raise EngineCrash(
                "engine_dead",
                f"the engine core died in step {self.current_step} ({self.crashed})",
                step=self.current_step,
            )

    # ------------------------------------------------------------------ inputs

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        *,
        priority: int = 0,
        arrival_time: int | float = 0,
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        min_tokens: int = 0,
    ) -> None:
        """Queue a new request at the tail of ``waiting``; refuse invalid ones unchanged.

        Rules, checked in this order (first failure wins): list-like prompt and
        stop ids and a boolean ``ignore_eos``; a non-empty string id; not a live
        id; a non-empty prompt shorter than ``max_model_len``; integer
        ``max_tokens``/``min_tokens``/``priority``; a finite int or float
        ``arrival_time``; ``max_tokens >= 1``; ``0 <= min_tokens <= max_tokens``;
        integer token ids in ``[0, 2**31 - 1]`` (prompt, stop ids, EOS); not the
        id of a request that a step still in flight scheduled (aborted or
        finished since: vLLM would hand that step's output to the new request).
        """
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
        if len(prompt) >= self.mml:
            raise InvalidEvent(
                "prompt_too_long", f"prompt of {len(prompt)} tokens leaves no room to generate", request_id=request_id
            )
        for name, value in (("max_tokens", max_tokens), ("min_tokens", min_tokens), ("priority", priority)):
            if not _is_int(value):
                raise InvalidEvent("invalid_field_type", f"{name} must be an integer", request_id=request_id)
        if not _is_arrival(arrival_time):
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
        if request_id in self.seen_ids and self.is_scheduled_in_flight(request_id):
            raise InvalidEvent(
                "request_id_in_flight",
                f"request {request_id!r} was aborted while a step that scheduled it is in flight",
                request_id=request_id,
            )
        eos = None if ignore_eos else eos_token_id
        req = Req(
            request_id,
            prompt,
            max_tokens,
            min_tokens,
            priority,
            arrival_time,
            eos,
            stops,
            min(self.mml, len(prompt) + max_tokens),
        )
        if self.priority:
            heapq.heappush(self._heap, (priority, arrival_time, request_id, req))
        else:
            self._fcfs.append(req)
        self.requests[request_id] = req
        self.seen_ids.add(request_id)

    def abort(self, request_id: str) -> list[str]:
        """Abort one request: dequeue it, free its blocks, report it next step.

        An id never added is refused (``unknown_request_id``); an id that already
        finished is ignored. Returns the ids finished.
        """
        self._require_alive()
        if request_id not in self.seen_ids:
            raise InvalidEvent(
                "unknown_request_id", f"abort of request {request_id!r}, which was never added", request_id=request_id
            )
        req = self.requests.get(request_id)
        if req is None or req.status >= FINISHED_STOPPED:
            return []
        if req.status == RUNNING:
            self.running = [r for r in self.running if r is not req]
        else:
            self._waiting_remove({req})
        req.status = FINISHED_ABORTED
        self._free(req)
        return [request_id]

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached block hash (vLLM's ``Scheduler.reset_prefix_cache``); True if it was reset.

        With ``reset_running_requests`` every running request is preempted
        first, tail first (FCFS: back at the head of ``waiting`` in running
        order), its output in flight dropped rather than delivered, so it may
        resume at once. Otherwise the reset fails (False, nothing changed)
        while any request holds blocks. The free queue keeps its order.
        """
        self._require_alive()
        if not isinstance(reset_running_requests, bool):
            raise InvalidEvent("invalid_field_type", "reset_running_requests must be a boolean")
        if reset_running_requests:
            # The synchronous loop counts no Req.in_flight: the tokens in flight are the step's.
            sync_in_flight = None if self.count_in_flight else {e[0]: e[1] for o in self.in_flight for e in o.entries}
            while self.running:
                req = self.running.pop()
                self._preempt(req, True, None if sync_in_flight is None else sync_in_flight.get(req, 0))
        pool = self.pool
        if pool.num_free != pool.num_blocks - 1:
            return False
        pool.cached.clear()
        pool.unindexed.clear()
        pool.block_hash[:] = [None] * pool.num_blocks
        return True

    # ------------------------------------------------------------------ blocks

    def _hashes(self, req: Req, upto: int) -> list[bytes]:
        """The request's chained block hashes, extended to at least ``upto`` blocks.

        A block's hash is the SHA-256 of its parent's hash (``_HASH_SEED`` for the
        first block) and its token ids as native int64s: equality of prefixes is
        all that matters.
        """
        hashes = req.hashes
        num_hashed = len(hashes)
        if num_hashed < upto:
            bs, tokens, pack, sha256 = self.bs, req.tokens, self._pack_block, hashlib.sha256
            parent = hashes[-1] if num_hashed else _HASH_SEED
            for first in range(num_hashed * bs, upto * bs, bs):
                parent = sha256(parent + pack(*tokens[first : first + bs])).digest()
                hashes.append(parent)
        return hashes

    def _cache_full(self, req: Req, num_full: int) -> None:
        """Cache the request's blocks ``[num_cached, num_full)``: hashed and indexed before the next lookup."""
        blocks = req.blocks
        assert blocks is not None
        pool = self.pool
        block_hash, unindexed = pool.block_hash, pool.unindexed
        for i in range(req.num_cached, num_full):
            b = blocks[i]
            block_hash[b] = NOT_HASHED
            unindexed[b] = (req, i)
        req.num_cached = num_full

    def _index_cached(self) -> None:
        """Hash the cached blocks not indexed yet and index them, in the order they were cached.

        The index then holds what indexing each block when it was cached would
        have given: a block leaves ``unindexed`` only when it is evicted (which
        drops it from the index) or here, and the tokens of a full block never
        change.
        """
        pool = self.pool
        block_hash, cached = pool.block_hash, pool.cached
        for b, (req, i) in pool.unindexed.items():
            h = self._hashes(req, i + 1)[i]
            block_hash[b] = h
            entries = cached.get(h)
            if entries is None:
                cached[h] = [b]
            else:
                entries.append(b)
        pool.unindexed.clear()

    def _cache_upto(self, req: Req, num_tokens: int) -> None:
        """Cache the blocks ``num_tokens`` tokens fill (capped at the request's tokens)."""
        num_full = min(num_tokens, len(req.tokens)) // self.bs
        if num_full > req.num_cached:
            self._cache_full(req, num_full)

    def _room(self, req: Req) -> int:
        """``Req.room`` of a running request that is no prefill chunk (its definition)."""
        assert req.blocks is not None
        room = min(len(req.blocks) * self.bs - self.lookahead, self.mml - 1)
        if self.caching:
            room = min(room, (req.num_cached + 1) * self.bs - 1)
        return room

    def _free(self, req: Req) -> None:
        """Forget a finished request: free its blocks tail first, report it next step."""
        if req.blocks is not None:
            self.pool.release(reversed(req.blocks))
            req.blocks = None
            req.num_cached = 0
            req.room = -1
        self.finished_req_ids.add(req.req_id)
        self.deferred_waiting.discard(req.req_id)
        del self.requests[req.req_id]
        for out in self.in_flight:
            out.changed_in_flight = True

    def _preempt(self, req: Req, drop_stale: bool = False, num_in_flight: int | None = None) -> None:
        """Preempt by recompute: free the blocks, forget computed tokens and drafts, requeue.

        Output of the request's steps still in flight (``num_in_flight`` tokens,
        ``req.in_flight`` unless given) becomes stale: it will be appended
        without touching the counters reset here, or dropped (``drop_stale``: a
        reset's preemption; an undrained dropped share stays dropped).
        """
        if req.blocks is not None:
            self.pool.release(reversed(req.blocks))
            req.blocks = None
            req.num_cached = 0
            req.room = -1
        req.status = PREEMPTED
        req.num_computed = 0
        req.spec = []
        req.drop_stale = drop_stale or (req.drop_stale and req.stale > 0)
        req.stale = req.in_flight if num_in_flight is None else num_in_flight
        req.placeholders = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting_push_front(req)
        self.preempted_req_ids.add(req.req_id)
        for out in self.in_flight:
            out.changed_in_flight = True

    # ------------------------------------------------------------------ schedule

    def schedule(self, throttle_prefills: bool = False) -> StepOutput:
        """Decide this step's batch: the running loop, then (without preemption) the waiting loop.

        ``throttle_prefills``: vLLM's data-parallel prefill throttle (0.32+).
        """
        self._require_alive()
        if throttle_prefills is not True and throttle_prefills is not False:
            raise InvalidEvent("invalid_field_type", "throttle_prefills must be a boolean", field="throttle_prefills")
        if len(self.in_flight) >= self.max_concurrent_batches:
            raise InvalidEvent(
                "output_not_processed",
                f"schedule() called while {len(self.in_flight)} step(s) await "
                f"their model output (max_concurrent_batches={self.max_concurrent_batches})",
                step=self.current_step,
            )
        self.current_step += 1
        running = self.running
        interval = self.prefill_interval
        defer = (
            (throttle_prefills or (interval > 1 and (self.num_executed_steps + 1) - self.last_prefill_step < interval))
            and not self.prefill_capacity_bound
            and any(not r.is_prefill_chunk for r in running)
        )  # the scan of running only on a step that may hold prefill
        self._prefill_admitted = False
        stagger = self.decode_stagger
        step = self.current_step
        threshold = self.threshold
        if threshold:
            num_eligible = len(running) + self._waiting_len()
            if num_eligible <= 1:
                threshold = 0  # a lone request is not capped
            elif self.adaptive_threshold:
                threshold = max(threshold, self.budget // num_eligible)  # floored at a fair share
        budget = self.budget
        entries: list[tuple[Req, int, int, int, Sequence[int]]] = []
        spec_out: dict[str, list[int]] = {}
        pool = self.pool
        bs, mml = self.bs, self.mml
        mml1 = mml - 1
        lookahead = self.lookahead
        caching = self.caching
        prefill_scheduled = False
        preempted = False
        append = entries.append
        async_scheduling = self.async_scheduling
        k_spec = self.k
        spec_placeholders = self.spec_placeholders
        count_in_flight = self.count_in_flight
        block_hash, unindexed = pool.block_hash, pool.unindexed

        # ---- running loop
        # One pass in running order. A request in steady decode (one token to
        # compute, no drafts, not a prefill chunk, the token's slot already in its
        # block table and no block to cache: ``start + 1 == total <= req.room``)
        # costs a few integer operations; the others take the general path below.
        # Only a priority preemption moves requests the pass has visited: the pass
        # then goes on from the cursor's new index.
        gate = stagger or defer
        priority = self.priority
        no_blocks = _NO_BLOCKS
        # The pass runs while budget is left: every path that takes tokens ends it at 0.
        resume_at: int | None = 0
        while resume_at is not None and budget > 0:
            cursor, resume_at = resume_at, None
            for req in running if cursor == 0 else islice(running, cursor, None):
                start = req.num_computed
                total = ntok = len(req.tokens)
                if async_scheduling:
                    ph = req.placeholders  # (0 outside async profiles)
                    if ph:
                        if start + 2 - ph >= req.num_prompt + req.max_tokens:
                            # Async: the steps in flight are sure to reach max_tokens
                            # (even if all their drafts were rejected).
                            continue
                        total = ntok + ph  # tokens to compute, placeholders included
                if gate and (step < req.next_decode or (defer and req.is_prefill_chunk)):
                    # The decode stagger; a held prefill chunk (decodes still fill the step).
                    continue
                if start + 1 == total:
                    # Steady decode, the common case: exactly one token to compute (the
                    # budget is positive, a threshold is >= 1); with ``room >= 0``, no
                    # drafts and no prefill chunk.
                    room = req.room
                    new_blocks: Sequence[int] | None = None
                    if total <= room:
                        # Its slot is already held and no block fills: nothing else to decide.
                        new_blocks = no_blocks
                    elif room >= 0 and total < mml:
                        # At most one new block, and a block may fill: the general path's
                        # outcome without its clamps (none applies), unless it must preempt.
                        blocks = req.blocks
                        assert blocks is not None
                        end = total + lookahead
                        if end > mml:
                            end = mml
                        need = (end + bs - 1) // bs - len(blocks)
                        if need <= 0 or (need == 1 and pool.num_free):
                            new_blocks = no_blocks
                            if need > 0:
                                new_block = pool.pop_one()
                                blocks.append(new_block)
                                new_blocks = [new_block]
                            room = len(blocks) * bs - lookahead  # FastScheduler._room, inline
                            if room > mml1:
                                room = mml1
                            if caching:
                                num_cached = req.num_cached
                                if ntok // bs > num_cached:
                                    if ntok // bs == num_cached + 1:
                                        # One block fills (steady decode): _cache_full, inline.
                                        b = blocks[num_cached]
                                        block_hash[b] = NOT_HASHED
                                        unindexed[b] = (req, num_cached)
                                        req.num_cached = num_cached = num_cached + 1
                                    else:
                                        self._cache_full(req, ntok // bs)
                                        num_cached = req.num_cached
                                if room >= (num_cached + 1) * bs:
                                    room = (num_cached + 1) * bs - 1
                    if new_blocks is not None:
                        append((req, 1, start, total, new_blocks))
                        req.num_computed = total
                        req.room = room
                        if count_in_flight:
                            req.in_flight += 1
                        if async_scheduling:
                            req.placeholders = ph + 1
                            if k_spec:
                                req.spec = spec_placeholders
                                req.room = -1
                        budget -= 1
                        if budget:
                            continue
                        break
                spec = req.spec
                n = total + len(spec) - start
                if 0 < threshold < n:
                    n = threshold
                if n > budget:
                    n = budget
                if n > mml1 - start:
                    n = mml1 - start
                if n <= 0:
                    continue
                blocks = req.blocks
                assert blocks is not None
                end = start + n + lookahead
                if end > mml:
                    end = mml
                need = (end + bs - 1) // bs - len(blocks)
                new_blocks = no_blocks
                if need > 0:
                    if need > pool.num_free:
                        preempted = True
                        # FCFS pops its victims from the tail, past the cursor. A priority
                        # victim may stand before it: the pass goes on from the index after
                        # ``req`` (or from the one ``req`` left, if it preempted itself
                        # and 0.33's rule goes on).
                        i = running.index(req) if priority else 0
                        i, budget, ok = self._preempt_until_fits(req, need, i, entries, spec_out, budget)
                        if not ok:
                            if priority and self.self_preempt_continue:
                                resume_at = i
                            break
                        if priority:
                            resume_at = i + 1
                    new_blocks = pool.pop_front(need)
                    blocks.extend(new_blocks)
                if caching:
                    c = start + n
                    if c > ntok:
                        c = ntok
                    if c // bs > req.num_cached:
                        self._cache_full(req, c // bs)
                if req.is_prefill_chunk:
                    prefill_scheduled = True
                append((req, n, start, total, new_blocks))
                budget -= n
                req.num_computed = start + n
                req.is_prefill_chunk = is_chunk = start + n < total
                if count_in_flight:
                    req.in_flight += n
                if spec:
                    k = start + n - total
                    if k > 0:
                        spec_out[req.req_id] = spec[:k]
                    req.spec = []
                if async_scheduling and not is_chunk:
                    req.placeholders += 1 + len(spec_out.get(req.req_id, ()))
                    if k_spec:
                        # The worker proposes the next step's drafts; the scheduler
                        # only learns how many: placeholders (-1).
                        req.spec = spec_placeholders
                req.room = -1 if is_chunk or req.spec else self._room(req)
                if resume_at is not None or budget <= 0:
                    break
        num_running = len(entries)

        # ---- waiting loop
        kinds: list[int] = []
        if not preempted and budget > 0 and self._waiting_len():
            budget = self._schedule_waiting(
                entries, kinds, spec_out, budget, threshold, prefill_scheduled, num_running, defer
            )
        if stagger:
            # The next decode of each request this step samples waits pipeline_parallel_size steps
            # (set once the step is final: a priority victim taken out of it keeps its old gate).
            for entry in entries:
                req = entry[0]
                if not req.is_prefill_chunk:
                    req.next_decode = step + stagger
        if not preempted and not defer:
            # A releasing step records whether it could not drain the waiting queue.
            self.prefill_capacity_bound = self._waiting_len() > len(self.deferred_waiting)
        if budget < self.budget:
            self.num_executed_steps += 1
        if self.prefill_interval > 1 and (prefill_scheduled or self._prefill_admitted):
            self.last_prefill_step = self.num_executed_steps

        out = StepOutput(
            self.current_step,
            entries,
            num_running,
            kinds,
            spec_out,
            self.finished_req_ids,
            self.preempted_req_ids,
            self.budget - budget,
        )
        out.v2_layout = self.v2_layout
        self.finished_req_ids = set()
        self.preempted_req_ids = set()
        self.in_flight.append(out)
        return out

    def _preempt_until_fits(
        self,
        req: Req,
        need: int,
        i: int,
        entries: list[tuple[Req, int, int, int, Sequence[int]]],
        spec_out: dict[str, list[int]],
        budget: int,
    ) -> tuple[int, int, bool]:
        """Preempt victims until ``req`` gets ``need`` more blocks (or preempts itself).

        Returns the moved cursor, the repaired budget, and whether ``req`` fits.
        Under priority a victim scheduled earlier in this step is taken out of
        the step: its tokens go back to the budget and its entry and drafts are
        dropped; the cursor moves back iff the victim stood before it.
        """
        running = self.running
        pool = self.pool
        while need > pool.num_free:
            if self.priority:
                victim = max(running, key=lambda r: (r.priority, r.arrival))
                vi = running.index(victim)
                del running[vi]
                if vi < i:
                    i -= 1
                for j in range(len(entries)):
                    if entries[j][0] is victim:
                        budget += entries[j][1]
                        if self.count_in_flight:
                            victim.in_flight -= entries[j][1]  # (its placeholders go with the preemption)
                        del entries[j]
                        spec_out.pop(victim.req_id, None)
                        break
            else:
                victim = running.pop()
            self._preempt(victim)
            if victim is req:
                return i, budget, False
        return i, budget, True

    def _schedule_waiting(
        self,
        entries: list[tuple[Req, int, int, int, Sequence[int]]],
        kinds: list[int],
        spec_out: dict[str, list[int]],
        budget: int,
        threshold: int,
        prefill_scheduled: bool,
        num_running: int,
        defer: bool = False,
    ) -> int:
        """The waiting loop: admit from the head while budget, seats and blocks last. Returns the budget left."""
        pool = self.pool
        bs, mml = self.bs, self.mml
        k = self.k
        cached = pool.cached
        ref = pool.ref
        running = self.running
        skipped: list[Req] = []
        try:
            while budget > 0 and self._waiting_len():
                if len(running) >= self.max_num_active:
                    break
                req = self._waiting_peek()
                if req.stale and not req.drop_stale:
                    # Its stale output is still in flight: resuming now could
                    # resample a position that output will deliver. Skipped, and
                    # put back at the head (in order) after the loop.
                    self._waiting_pop()
                    skipped.append(req)
                    self.deferred_waiting.add(req.req_id)
                    continue
                ntok = len(req.tokens)
                hit_blocks: list[int] = []
                if self.caching:
                    if pool.unindexed:
                        self._index_cached()
                    max_blocks = (ntok - 1) // bs
                    for h in self._hashes(req, max_blocks)[:max_blocks]:
                        found = cached.get(h)
                        if not found:
                            break
                        hit_blocks.append(found[0])
                hit = len(hit_blocks) * bs
                start = req.num_computed if req.num_computed else hit
                if defer and start < ntok - 1:
                    break  # held prefill: no admission with more than one token to compute
                n = ntok - hit
                pad = False
                if k > 0 and n == 1 and not prefill_scheduled and (num_running > 0 or hit > 0):
                    padded = 1 + k
                    if hit + padded + 1 <= mml:
                        if padded > budget:
                            break  # prefer not scheduling to scheduling unpadded
                        n = padded
                        pad = True
                if 0 < threshold < n:
                    n = threshold
                if not self.chunked and n > budget:
                    break
                if n > budget:
                    n = budget
                evictable = 0
                for b in hit_blocks:
                    if ref[b] == 0:
                        evictable += 1
                num_free = pool.num_free
                if self.reserve_full:
                    full = ntok if ntok < mml else mml
                    if max((full + bs - 1) // bs - len(hit_blocks), 0) + evictable > num_free:
                        break
                end = hit + n + self.lookahead
                if end > mml:
                    end = mml
                num_new = (end + bs - 1) // bs - len(hit_blocks)
                if max(num_new, 0) + evictable > num_free:
                    break
                pool.touch(hit_blocks)
                req.num_cached = len(hit_blocks)
                blocks = hit_blocks
                if num_new > 0:
                    blocks.extend(pool.pop_front(num_new))
                req.blocks = blocks
                if self.caching:
                    self._cache_upto(req, hit + n)
                self._waiting_pop()
                self.deferred_waiting.discard(req.req_id)
                self._prefill_admitted |= hit < ntok - 1
                running.append(req)
                kinds.append(KIND_NEW if req.status == WAITING else KIND_RESUMED)
                entries.append((req, n, hit, ntok, list(blocks)))
                budget -= n
                req.status = RUNNING
                req.num_computed = hit + n
                req.is_prefill_chunk = hit + n < ntok
                if pad:
                    if n != 1 + k:
                        # vLLM 0.32/0.33 assert a padded admission kept all 1 + k
                        # tokens; the threshold cut it, so their engine core dies
                        # here (a vLLM bug the reference models; reports/findings.md 3).
                        self.crashed = "engine_assertion_padded_admission"
                        raise EngineCrash(
                            "engine_assertion_padded_admission",
                            f"step {self.current_step}: {req.req_id!r} padded to {1 + k} tokens, "
                            f"cut to {n} by long_prefill_token_threshold",
                            request_id=req.req_id,
                        )
                    spec_out[req.req_id] = [-1] * k
                if self.count_in_flight:
                    req.in_flight += n
                if self.async_scheduling and not req.is_prefill_chunk:
                    req.placeholders += 1 + len(spec_out.get(req.req_id, ()))
                    if k:
                        req.spec = self.spec_placeholders
                req.room = -1 if req.is_prefill_chunk or req.spec else self._room(req)
        finally:
            if skipped:
                if self.priority:
                    for req in skipped:
                        heapq.heappush(self._heap, (req.priority, req.arrival, req.req_id, req))
                else:
                    self._fcfs.extendleft(reversed(skipped))
        return budget

    # ------------------------------------------------------------------ update

    def validate_model_output(
        self, out: StepOutput, sampled: Mapping[str, Sequence[int]], drafts: Mapping[str, Sequence[int]]
    ) -> None:
        """Refuse model output no model could have produced for ``out`` (the reference's rules).

        Sampled ids must be scheduled and tokens non-negative integers; a live
        request that reached the end of its sequence samples 1 to 1 + its
        drafts tokens (or none, when it had no drafts), a prefill chunk none; drafts need spec decode, at most
        ``num_spec_tokens`` of them, for scheduled requests.
        """
        self._require_alive()
        if not self.in_flight or out is not self.in_flight[0]:
            raise InvalidEvent("unexpected_model_output", "model output needs the oldest in-flight step's output, once")
        scheduled = {e[0].req_id: e for e in out.entries}
        for rid, tokens in sampled.items():
            if rid not in scheduled:
                raise InvalidEvent("unscheduled_model_output", f"sampled tokens for unscheduled {rid!r}")
            for t in tokens:
                if not _is_token(t):
                    raise InvalidEvent("invalid_token_id", f"sampled token ids must be integers in [0, {MAX_TOKEN_ID}]")
        for rid, (scheduled_req, n, before, ntok, _) in scheduled.items():
            req = self.requests.get(rid)
            if req is not scheduled_req or req.status >= FINISHED_STOPPED:
                continue
            got = len(sampled.get(rid, ()))
            if before + n >= ntok:
                # Nothing sampled is skipped (as vLLM does; with drafts scheduled the
                # drafts stay computed and the running loop never schedules the
                # request again, n <= 0), except under async scheduling: refused,
                # as the reference does.
                num_drafts = len(out.spec_tokens.get(rid, ()))
                if got > 1 + num_drafts or (got == 0 and self.async_scheduling):
                    raise InvalidEvent(
                        "bad_num_sampled_tokens", f"request {rid!r} must sample 0 (not async) to 1 + drafts tokens"
                    )
            elif got != 0:
                raise InvalidEvent("bad_num_sampled_tokens", f"request {rid!r} ran a prefill chunk and samples nothing")
        for rid, d in drafts.items():
            if self.k <= 0:
                raise InvalidEvent("drafts_without_spec_decode", "draft tokens given but num_spec_tokens is 0")
            if d and self.async_scheduling:
                raise InvalidEvent(
                    "drafts_under_async_scheduling",
                    f"draft tokens for {rid!r} under {self.profile}: AsyncScheduler's drafts stay in the worker",
                )
            if rid not in scheduled:
                raise InvalidEvent("unscheduled_draft_tokens", f"draft tokens for unscheduled {rid!r}")
            if len(d) > self.k:
                raise InvalidEvent("too_many_draft_tokens", f"{len(d)} drafts exceed num_spec_tokens={self.k}")
            for t in d:
                if not _is_token(t):
                    raise InvalidEvent("invalid_token_id", f"draft token ids must be integers in [0, {MAX_TOKEN_ID}]")

    def update_from_output(
        self, out: StepOutput, sampled: Sequence[Sequence[int]], drafts: Mapping[str, Sequence[int]] | None = None
    ) -> list[RequestOutputTuple]:
        """Apply the model output of the oldest step in flight; ``sampled[i]`` belongs to ``out.entries[i]``.

        Per scheduled request, in batch order: settle its in-flight (and stale)
        tokens, roll back rejected drafts, append tokens with the stop check,
        resolve output placeholders, cache full blocks of settled tokens (0.33
        spec decode; async profiles), free the request if it stopped. Output of
        a step scheduled before the request's last preemption is *stale*: its
        tokens are appended, no counter moves. Then store the next drafts.
        Trusts its input: run ``validate_model_output`` first for untrusted output.
        """
        self._require_alive()
        in_flight = self.in_flight
        if not in_flight or out is not in_flight[0]:
            raise InvalidEvent("unexpected_model_output", "model output needs the oldest in-flight step's output, once")
        in_flight.popleft()
        results: list[RequestOutputTuple] = []
        spec_out = out.spec_tokens
        requests = self.requests
        any_stopped = False
        cache_after = self.cache_after_spec_update
        minus_placeholders = self.cache_minus_placeholders
        # A plain step: no drafts scheduled, no placeholders and nothing to cache after the
        # update (``cache_after`` is set under every async profile), and no request of the step
        # finished or preempted since it was scheduled (so none is freed or has stale output).
        # Then one sampled token that does not stop its request is appended and reported,
        # nothing else.
        plain = not spec_out and not cache_after and not out.changed_in_flight
        append_result = results.append
        count_in_flight = self.count_in_flight
        for entry, toks in zip(out.entries, sampled):
            req = entry[0]
            if plain and len(toks) == 1:
                t = toks[0]
                if t not in req.stopset:
                    tokens: list[int] = req.tokens
                    tokens.append(t)
                    if len(tokens) < req.length_cap:
                        if count_in_flight:
                            req.in_flight -= entry[1]
                        append_result((req.req_id, toks, None, None))
                        continue
                    tokens.pop()
            if req.status >= FINISHED_STOPPED:
                continue  # aborted or finished since it was scheduled (and freed: no longer in requests)
            if count_in_flight:
                req.in_flight -= entry[1]
            if req.stale:
                req.stale -= entry[1]
                if toks and not req.drop_stale:
                    self.num_stale_outputs += 1
                    self._append_stale(req, toks, results)
                continue
            if not toks:
                continue
            if spec_out:
                d = spec_out.get(req.req_id)
                if d:
                    rejected = len(d) - (len(toks) - 1)
                    if req.num_computed > 0:
                        req.num_computed -= rejected
                    if req.placeholders > 0:
                        req.placeholders -= rejected  # async: the rejected drafts' placeholders
            had_placeholders = req.placeholders > 0
            if len(toks) == 1:
                tokens = req.tokens
                t = toks[0]
                tokens.append(t)
                if t not in req.stopset and len(tokens) < req.length_cap:
                    if had_placeholders:
                        req.placeholders -= 1
                    if cache_after:
                        self._cache_upto(
                            req, req.num_computed - (req.placeholders if minus_placeholders else req.in_flight)
                        )
                    results.append((req.req_id, toks, None, None))
                    continue
                tokens.pop()
            kept, status = self._append_slow(req, toks)
            if had_placeholders:
                # 0.33: every token returned resolves one, trimmed ones
                # included; 0.32 (AsyncScheduler): only the kept ones.
                req.placeholders -= len(toks) if self.resolve_trimmed else len(kept)
            if cache_after:
                self._cache_upto(req, req.num_computed - (req.placeholders if minus_placeholders else req.in_flight))
            if status:
                req.status = status
                self._free(req)
                any_stopped = True
                results.append((req.req_id, kept, FINISH_REASONS[status], req.stop_reason))
            else:
                results.append((req.req_id, kept, None, req.stop_reason))
        if any_stopped:
            self.running = [r for r in self.running if r.status == RUNNING]
        if drafts and not self.async_scheduling:
            # (Under AsyncScheduler the engine core never hands drafts over:
            # they stay in the worker; validate_model_output refuses them.)
            for rid, proposed in drafts.items():
                target = requests.get(rid)
                if target is None:
                    continue
                target.spec = [] if target.is_prefill_chunk else list(proposed)
                if target.spec:
                    target.room = -1  # drafts to schedule: not a steady decode
        return results

    def _append_stale(self, req: Req, toks: Sequence[int], results: list[RequestOutputTuple]) -> None:
        """Append the tokens of a step scheduled before ``req``'s last preemption (stale output).

        No counter moves (no draft rollback, no trim, no placeholder, no
        caching); a stop finishes the request, which leaves ``waiting`` if it
        is there (a request resumed since could not be: the waiting loop skips
        requests with stale output in flight).
        """
        computed = req.num_computed
        kept, status = self._append_slow(req, toks)
        req.num_computed = computed
        if status:
            was_running = req.status == RUNNING
            req.status = status
            self._free(req)
            if was_running:
                self.running = [r for r in self.running if r is not req]
            else:
                self._waiting_remove({req})
            results.append((req.req_id, kept, FINISH_REASONS[status], req.stop_reason))
        else:
            results.append((req.req_id, kept, None, req.stop_reason))

    def _append_slow(self, req: Req, toks: Sequence[int]) -> tuple[Sequence[int], int]:
        """Append tokens one by one with the stop check; trim what follows a stop.

        The check for the last appended token: EOS (stop), a stop id (stop,
        ``stop_reason`` = it), then length (``num_tokens >= max_model_len`` or
        ``max_tokens`` outputs). Returns the kept tokens and the finish status (0: none).
        """
        tokens = req.tokens
        for i, t in enumerate(toks, 1):
            tokens.append(t)
            status = 0
            if t == req.eos:
                status = FINISHED_STOPPED
            elif t in req.stop_ids:
                status = FINISHED_STOPPED
                req.stop_reason = t
            elif len(tokens) >= req.length_cap:
                status = FINISHED_LENGTH_CAPPED
            if status:
                if self.trim_on_stop:
                    req.num_computed -= len(toks) - i
                return list(toks[:i]), status
        return toks, 0

    # ------------------------------------------------------------------ queries

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.running) or self._waiting_len() > 0

    def has_requests(self) -> bool:
        """True while there is work, including the one extra step that reports the last finished ids."""
        return self.has_unfinished_requests() or bool(self.finished_req_ids)

    def observe(self) -> dict[str, Any]:
        """The state a strict comparison looks at: the free queue, front first, and its length."""
        return {"free_block_queue": self.pool.free_queue(), "num_free_blocks": self.pool.num_free}
