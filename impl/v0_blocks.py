"""Block allocators of vLLM 0.10.2's legacy (v0) block manager, flat and fast.

vLLM builds one ``Block`` object per table slot and routes every operation
through ``CpuGpuBlockAllocator``; here a device is one allocator over integer
block ids ``0..n-1`` (vLLM's physical ids: CPU ids are numbered from 0 too),
and a sequence's table is kept by the scheduler as lists of ids and hashes.
The observable behaviour is vLLM's:

* :class:`NaiveAllocator` (prefix caching off): a deque of free ids, taken
  from the left, freed to the left (the block freed last is reused first);
  reference counts.
* :class:`PrefixCachingAllocator` (prefix caching on): the same deque for
  hashless ids, a ``hash -> id`` map of cached (full, immutable) blocks, and
  vLLM's ``LRUEvictor``: a heap of ``(last_accessed, -num_hashed_tokens,
  block_id, hash)`` with lazily skipped stale entries, rebuilt when it grows
  past 50 entries per evictable block. A block is "computed" (may count as a
  prefix hit) when it was hit, or when the schedule() that registered it has
  ended (``mark_blocks_as_computed``), or while it sits in the evictor.

Each allocator also counts, per id, how often the id was handed out fresh
(``gen``): a cache hit keeps the content and the generation. The model runner
uses it to know whether the KV bytes it wrote into a block still belong to it;
the scheduler never reads it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

FIRST_BLOCK = -0x5EED_0F_B10C
"""The parent hash of a sequence's first block (vLLM's ``hash('None')``, made deterministic)."""


def compute_block_hash(parent: int, tokens: Sequence[int]) -> int:
    """Content hash of one full block: its parent's hash and its token ids (deterministic: ints only)."""
    return hash((parent, *tokens))


class NoFreeBlocks(RuntimeError):
    """An allocation found no free block (vLLM's ``NoFreeBlocksError``; the scheduler's checks prevent it)."""


class StaleEvictorEntry(RuntimeError):
    """The evictor returned a stale heap entry of a reused block (vLLM's allocator assertions fail)."""


class NaiveAllocator:
    """vLLM's ``NaiveBlockAllocator`` over ids ``0..num_blocks-1``."""

    caching = False

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.ref = [0] * num_blocks
        self.gen = [0] * num_blocks

    def get_num_free_blocks(self) -> int:
        return len(self.free_ids)

    def allocate_fresh(self) -> int:
        """A free id from the left of the deque, reference count 1."""
        if not self.free_ids:
            raise NoFreeBlocks("no free block")
        b = self.free_ids.popleft()
        self.ref[b] += 1
        self.gen[b] += 1
        return b

    def allocate_full(self, h: int) -> int:
        """``allocate_immutable_block`` of a full block of hash ``h``: without caching, a fresh block."""
        return self.allocate_fresh()

    def free_block(self, b: int, h: int | None, num_tokens_total: int) -> None:
        """Drop one reference; a free id goes back to the left of the deque."""
        ref = self.ref
        ref[b] -= 1
        if ref[b] == 0:
            self.free_ids.appendleft(b)

    def count_full_blocks_touched(self, hashes: Sequence[int | None], num_full: int) -> int:
        """``get_num_full_blocks_touched``: every full block needs a new block."""
        return num_full


class _Evictor:
    """vLLM's ``LRUEvictor``: heap with lazy deletion, ``free_table`` as dict id -> [hash, ntok, last]."""

    CLEANUP_THRESHOLD = 50

    def __init__(self) -> None:
        self.table: dict[int, list] = {}
        self.heap: list[tuple[float, int, int, int]] = []

    def add(self, b: int, h: int, num_hashed_tokens: int, last: float) -> None:
        self.table[b] = [h, num_hashed_tokens, last]
        heapq.heappush(self.heap, (last, -num_hashed_tokens, b, h))
        if len(self.heap) > self.CLEANUP_THRESHOLD * len(self.table):
            self.heap = [(m[2], -m[1], bid, m[0]) for bid, m in self.table.items()]
            heapq.heapify(self.heap)

    def evict(self) -> tuple[int, int]:
        table, heap = self.table, self.heap
        while heap:
            last, _, b, h = heapq.heappop(heap)
            meta = table.get(b)
            if meta is not None and meta[2] == last:
                del table[b]
                return b, h
        raise NoFreeBlocks("no usable cache memory left")


class PrefixCachingAllocator(NaiveAllocator):
    """vLLM's ``PrefixCachingBlockAllocator`` (with its ``BlockTracker`` and ``LRUEvictor``)."""

    caching = True

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.cached: dict[int, int] = {}
        self.evictor = _Evictor()
        self.active = [False] * num_blocks
        self.last = [-1.0] * num_blocks
        self.computed = [False] * num_blocks
        self.touched: set[int] = set()

    def get_num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictor.table)

    def _track(self, b: int, computed: bool) -> None:
        self.active[b] = True
        self.last[b] = -1.0
        self.computed[b] = computed

    def _untrack(self, b: int) -> None:
        self.active[b] = False
        self.last[b] = -1.0
        self.computed[b] = False

    def allocate_fresh(self) -> int:
        """``_allocate_block_id``: a hashless free id, else the evictor's choice (its hash forgotten)."""
        if self.free_ids:
            b = self.free_ids.popleft()
        elif self.evictor.table:
            b, h = self.evictor.evict()
            if self.cached.get(h) != b:
                raise StaleEvictorEntry(f"evicted block {b} is not the cached block of its hash")
            del self.cached[h]
        else:
            raise NoFreeBlocks("no free block")
        self.ref[b] += 1
        self.gen[b] += 1
        self._track(b, False)
        return b

    def _incr_cached(self, b: int) -> None:
        self.ref[b] += 1
        if self.ref[b] == 1:
            self.evictor.table.pop(b, None)
            self._track(b, True)

    def allocate_full(self, h: int) -> int:
        """``allocate_immutable_block``: a hit shares the cached block, a miss registers a fresh one."""
        b = self.cached.get(h)
        if b is not None:
            self._incr_cached(b)
            return b
        b = self.allocate_fresh()
        self.cached[h] = b
        self.touched.add(b)
        return b

    def promote(self, b: int, h: int) -> int:
        """``promote_to_immutable_block`` of a block that just became full: register it, or share the cached one."""
        cached = self.cached.get(h)
        if cached is None:
            self.cached[h] = b
            self.touched.add(b)
            return b
        self._free_hashless(b)
        self._incr_cached(cached)
        return cached

    def _free_hashless(self, b: int) -> None:
        ref = self.ref
        if ref[b] == 1:
            self._untrack(b)
        ref[b] -= 1
        if ref[b] == 0:
            self.free_ids.appendleft(b)

    def free_block(self, b: int, h: int | None, num_tokens_total: int) -> None:
        """A hashed block at reference count 0 goes to the evictor (with its last access), others to the deque."""
        if h is None:
            self._free_hashless(b)
            return
        ref = self.ref
        ref[b] -= 1
        if ref[b] > 0:
            return
        self.evictor.add(b, h, num_tokens_total, self.last[b])
        self._untrack(b)

    def mark_accessed(self, blocks: Sequence[int], now: float) -> None:
        """``mark_blocks_as_accessed`` (when a sequence is freed, with its last schedule time)."""
        table = self.evictor.table
        for b in blocks:
            if self.active[b]:
                self.last[b] = now
            elif b in table:
                table[b][2] = now
            else:
                raise ValueError(f"mark block {b} as accessed, which is neither in use nor evictable")

    def mark_computed(self) -> None:
        """``mark_blocks_as_computed``: blocks registered since the last call count as computed."""
        computed = self.computed
        for b in self.touched:
            computed[b] = True
        self.touched.clear()

    def is_block_computed(self, b: int) -> bool:
        return self.computed[b] if self.active[b] else b in self.evictor.table

    def count_cached_prefix(self, hashes: Sequence[int]) -> int:
        """``find_cached_blocks_prefix``: vLLM's bisection over "cached and computed" (not a scan)."""
        cached = self.cached
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            b = cached.get(hashes[mid])
            if b is not None and self.is_block_computed(b):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def count_full_blocks_touched(self, hashes: Sequence[int | None], num_full: int) -> int:
        """Full blocks not cached here, or cached only in the evictor."""
        cached, table = self.cached, self.evictor.table
        n = 0
        for j in range(num_full):
            b = cached.get(hashes[j])  # type: ignore[arg-type]
            if b is None or b in table:
                n += 1
        return n
