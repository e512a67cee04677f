"""The block pool: blocks, their reference counts, the free queue and the prefix-cache map.

Models ``vllm/v1/core/block_pool.py`` and ``FreeKVCacheBlockQueue`` in
``kv_cache_utils.py`` (0.33.0), §9.2-9.3 of the notes.

Rules:

* Block 0 is the null block. It is never free, never allocated, never counted.
* The free queue is in *eviction order*: the front is reused first. Initially
  it holds blocks 1..N-1 in id order.
* A free block may still carry a hash (a cached block with ``ref_cnt == 0``):
  it can be hit by a prefix lookup (and is then taken out of the queue by
  ``touch``) or evicted when ``get_new_blocks`` pops it.
* ``free_blocks`` takes blocks in the order they should be evicted: those
  reaching ``ref_cnt`` 0 without a hash go to the front, hashed ones to the
  back (0.25+); older releases append all of them to the back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """One KV-cache block: id, reference count, hash when full and cached, queue links."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    prev_free: KVCacheBlock | None = field(default=None, repr=False)
    next_free: KVCacheBlock | None = field(default=None, repr=False)
    is_null: bool = False


class FreeKVCacheBlockQueue:
    """A doubly linked list of free blocks with O(1) unlink from the middle.

    The front is evicted (reused) first.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the front block; ValueError when the queue is empty."""
        block = self._head.next_free
        # vLLM's FreeKVCacheBlockQueue.popleft raises ValueError here; an
        # assert would vanish under ``python -O``.
        if block is None or block is self._tail:
            raise ValueError("No free blocks available")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the ``n`` front blocks, front first."""
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the queue."""
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add blocks at the back, keeping their order."""
        for block in blocks:
            last = self._tail.prev_free
            assert last is not None
            last.next_free = block
            block.prev_free = last
            block.next_free = self._tail
            self._tail.prev_free = block
            self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Add blocks at the front, keeping their order: ``[b4,b5]`` on ``[b0]`` gives ``[b4,b5,b0]``."""
        for block in reversed(blocks):
            first = self._head.next_free
            assert first is not None
            block.prev_free = self._head
            block.next_free = first
            first.prev_free = block
            self._head.next_free = block
            self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Iterate front (evicted first) to back."""
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Return the queue as a list, front first."""
        return list(self)


class BlockPool:
    """All blocks of one KV-cache group, the free queue and the hash -> blocks map."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, free_uncached_to_front: bool) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.free_uncached_to_front = free_uncached_to_front
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # Block 0 is taken out of the queue once, at construction, and never returns.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # hash -> {block_id: block}, in insertion order. A second block with the
        # same content is inserted alongside the first (no deduplication).
        self.cached_block_hash_to_block: dict[bytes, dict[int, KVCacheBlock]] = {}

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, cached ones with ``ref_cnt == 0`` included."""
        return self.free_block_queue.num_free_blocks

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """Return the first block inserted under ``block_hash``, or None on a miss."""
        blocks = self.cached_block_hash_to_block.get(block_hash)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    def cache_full_blocks(
        self, blocks: list[KVCacheBlock], block_hashes: list[bytes], num_cached_blocks: int, num_full_blocks: int
    ) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes and index them."""
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"block {block.block_id} is already cached"
            block_hash = block_hashes[i]
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        """Drop ``block`` from the prefix cache if it is in it (it is being reused)."""
        if block.block_hash is None:
            return
        entries = self.cached_block_hash_to_block.get(block.block_hash)
        if entries is not None:
            entries.pop(block.block_id, None)
            if not entries:
                del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the front, evict their cached hashes, set ``ref_cnt = 1``."""
        assert num_blocks <= self.get_num_free_blocks(), "get_new_blocks beyond the free blocks"
        new_blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in new_blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return new_blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, unlinking those that were free."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, if no block but the null block is in use.

        Returns False (nothing changed) while any request holds a block. The
        free queue keeps its order: a reset only makes the cached blocks
        plain free blocks.
        """
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block counts as used
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
        return True

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; the first given is evicted first.

        Blocks reaching 0 without a hash go to the front (reused first, LIFO),
        hashed ones to the back (LRU), each group in the given order. With
        ``free_uncached_to_front`` off (<=0.20), all go to the back in order.
        """
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed more often than taken"
            if block.ref_cnt == 0:
                if not self.free_uncached_to_front:
                    evict_last.append(block)
                elif block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)
