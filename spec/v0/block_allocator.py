"""Block allocators: ``NaiveBlockAllocator`` and ``PrefixCachingBlockAllocator`` (0.10.2).

Models ``vllm/core/block/{naive_block,prefix_caching_block,common}.py`` for
single-sequence groups. Block ids are absolute, as in vLLM's
``CpuGpuBlockAllocator``: GPU ``0..N-1``, CPU ``N..N+M-1``.

Naive: a free deque; allocation pops the front, a block whose ref count drops
to 0 is pushed back at the front (so the last freed is reused first).

Prefix caching: a hashless naive allocator over the same ids, plus a map
``content_hash -> block_id`` of every full block (held or free), the
:class:`LRUEvictor` holding the free ones, and per block a tracker
(``active``, ``last_accessed``, ``computed``). A block becomes "computed" when
it is revived from the cache, or at the end of the ``schedule()`` that
promoted it (``mark_blocks_as_computed``).

Copy-on-write never happens with n = 1 (no block table is ever forked), so
``blocks_to_copy`` is always empty; we do not model it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from schedconf.spec.errors import EngineCrash
from schedconf.spec.hashing import NONE_HASH, compute_block_hash
from schedconf.spec.v0.evictor import LRUEvictor


class NoFreeBlocksError(Exception):
    """``BlockAllocator.NoFreeBlocksError``: no block to hand out (a vLLM crash if it escapes)."""


@dataclass(eq=False)
class Block:
    """One logical block of a block table; ``block_id`` is the physical block it sits in.

    ``num_tokens_total`` counts the tokens of this block and every block
    before it (the evictor's ``num_hashed_tokens``). ``content_hash`` is set
    by the prefix-caching allocator once the block is full.
    """

    prev_block: Block | None
    block_size: int
    token_ids: list[int] = field(default_factory=list)
    block_id: int | None = None
    content_hash: bytes | None = None

    @property
    def is_full(self) -> bool:
        return len(self.token_ids) == self.block_size

    @property
    def num_empty_slots(self) -> int:
        return self.block_size - len(self.token_ids)

    @property
    def num_tokens_total(self) -> int:
        prev = self.prev_block.num_tokens_total if self.prev_block is not None else 0
        return prev + len(self.token_ids)


class NaiveBlockAllocator:
    """Ref-counted block ids with a free deque (front = next to hand out)."""

    enable_caching = False

    def __init__(self, block_ids: list[int]) -> None:
        self.all_block_ids = tuple(block_ids)
        self.free_block_ids: deque[int] = deque(block_ids)
        self.refcounts: dict[int, int] = {b: 0 for b in block_ids}

    # -- ids
    def allocate_block_id(self) -> int:
        """Pop the front free id (``_allocate_block_id``)."""
        if not self.free_block_ids:
            raise NoFreeBlocksError()
        block_id = self.free_block_ids.popleft()
        self.refcounts[block_id] += 1
        return block_id

    def free_block_id(self, block_id: int) -> None:
        """Drop one reference; at 0 the id goes to the FRONT of the free deque."""
        assert self.refcounts[block_id] > 0
        self.refcounts[block_id] -= 1
        if self.refcounts[block_id] == 0:
            self.free_block_ids.appendleft(block_id)

    # -- blocks
    def allocate_mutable_block(self, prev_block: Block | None, block_size: int) -> Block:
        return Block(prev_block, block_size, [], self.allocate_block_id())

    def allocate_immutable_block(self, prev_block: Block | None, token_ids: list[int], block_size: int) -> Block:
        block = self.allocate_mutable_block(prev_block, block_size)
        block.token_ids.extend(token_ids)
        return block

    def append_token_ids(self, block: Block, token_ids: list[int]) -> None:
        """Append into a block (no copy-on-write with n = 1)."""
        assert len(token_ids) <= block.num_empty_slots
        block.token_ids.extend(token_ids)

    def free(self, block: Block) -> None:
        assert block.block_id is not None
        self.free_block_id(block.block_id)
        block.block_id = None

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def get_num_total_blocks(self) -> int:
        return len(self.all_block_ids)

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Full blocks a swap onto this device needs (partial ones are not counted)."""
        return len({id(b) for b in blocks if b.is_full})

    def swap_out(self, blocks: list[Block]) -> None:
        for block in blocks:
            self.free(block)

    def swap_in(self, blocks: list[Block]) -> None:
        for block in blocks:
            block.block_id = self.allocate_block_id()

    def mark_blocks_as_accessed(self, block_ids: list[int], now: int | float) -> None:
        """No prefix cache, nothing to do."""

    def mark_blocks_as_computed(self) -> None:
        """No prefix cache, nothing to do."""

    def find_cached_blocks_prefix(self, block_hashes: list[bytes]) -> list[bytes]:
        return []


@dataclass
class BlockTracker:
    """``BlockTracker``: is the id in use, when was it last accessed, is its KV computed."""

    active: bool = False
    last_accessed: int | float = -1
    computed: bool = False


def get_content_hash(block: Block) -> bytes | None:
    """``PrefixCachingBlock.content_hash``: chained hash of a full block, cached once computed."""
    if block.content_hash is not None:
        return block.content_hash
    if not block.is_full:
        return None
    parent: bytes | None
    if block.prev_block is None:
        parent = NONE_HASH
    else:
        parent = get_content_hash(block.prev_block)
        if parent is None:
            return None
    block.content_hash = compute_block_hash(parent, block.token_ids)
    return block.content_hash


class PrefixCachingBlockAllocator:
    """Content-addressed blocks over a hashless naive allocator, with an LRU evictor."""

    enable_caching = True

    def __init__(self, block_ids: list[int]) -> None:
        self.all_block_ids = tuple(block_ids)
        self.hashless_allocator = NaiveBlockAllocator(block_ids)
        self.refcounts = self.hashless_allocator.refcounts  # shared, as in vLLM
        self.cached_blocks: dict[bytes, int] = {}
        self.touched_blocks: set[int] = set()
        self.block_tracker: dict[int, BlockTracker] = {b: BlockTracker() for b in block_ids}
        self.evictor = LRUEvictor()

    # -- trackers
    def _track_block_id(self, block_id: int, computed: bool) -> None:
        assert not self.block_tracker[block_id].active
        self.block_tracker[block_id] = BlockTracker(active=True, last_accessed=-1, computed=computed)

    def _untrack_block_id(self, block_id: int) -> None:
        assert self.block_tracker[block_id].active
        self.block_tracker[block_id] = BlockTracker()

    # -- ids
    def _allocate_block_id(self) -> int:
        """A hashless free id first, else evict the LRU cached block."""
        if self.hashless_allocator.free_block_ids:
            block_id = self.hashless_allocator.allocate_block_id()
            self._track_block_id(block_id, computed=False)
            return block_id
        if self.evictor.num_blocks == 0:
            raise NoFreeBlocksError()
        block_id, content_hash = self.evictor.evict()
        if self.cached_blocks.get(content_hash) != block_id:
            # vLLM asserts content_hash_to_evict in _cached_blocks and that it maps to the block:
            # a stale heap entry of a reused block can break both (see evictor.py).
            raise EngineCrash(
                "engine_evictor_stale_entry",
                "vLLM's evictor returned a stale entry and its allocator assertion fails",
                block_id=block_id,
            )
        del self.cached_blocks[content_hash]
        self.refcounts[block_id] += 1
        self._track_block_id(block_id, computed=False)
        return block_id

    def _incr_refcount_cached_block(self, block_id: int) -> None:
        self.refcounts[block_id] += 1
        if self.refcounts[block_id] == 1:
            if block_id in self.evictor:
                self.evictor.remove(block_id)
            self._track_block_id(block_id, computed=True)

    def _decr_refcount_cached_block(self, block: Block) -> None:
        block_id = block.block_id
        assert block_id is not None and block.content_hash in self.cached_blocks
        self.refcounts[block_id] -= 1
        if self.refcounts[block_id] == 0:
            self.evictor.add(
                block_id, block.content_hash, block.num_tokens_total, self.block_tracker[block_id].last_accessed
            )
            self._untrack_block_id(block_id)
        block.block_id = None

    def _decr_refcount_hashless_block(self, block: Block) -> None:
        block_id = block.block_id
        assert block_id is not None
        if self.refcounts[block_id] == 1:
            self._untrack_block_id(block_id)
        self.hashless_allocator.free_block_id(block_id)
        block.block_id = None

    # -- blocks
    def allocate_mutable_block(self, prev_block: Block | None, block_size: int) -> Block:
        return Block(prev_block, block_size, [], self._allocate_block_id())

    def allocate_immutable_block(self, prev_block: Block | None, token_ids: list[int], block_size: int) -> Block:
        """Reuse the cached block with this content if any, else a new one filled and promoted."""
        probe = Block(prev_block, block_size, list(token_ids))
        content_hash = get_content_hash(probe)
        assert content_hash is not None
        cached_id = self.cached_blocks.get(content_hash)
        if cached_id is not None:
            probe.block_id = cached_id
            self._incr_refcount_cached_block(cached_id)
            return probe
        block = self.allocate_mutable_block(prev_block, block_size)
        self.append_token_ids(block, list(token_ids))
        return block

    def append_token_ids(self, block: Block, token_ids: list[int]) -> None:
        """Append into a mutable block; a block that becomes full is promoted."""
        assert block.content_hash is None and len(token_ids) <= block.num_empty_slots
        if not token_ids:
            return
        block.token_ids.extend(token_ids)
        if get_content_hash(block) is not None:
            self.promote_to_immutable_block(block)

    def promote_to_immutable_block(self, block: Block) -> None:
        """Register a newly full block, or move it onto the cached block with the same content."""
        assert block.content_hash is not None and block.block_id is not None
        if block.content_hash not in self.cached_blocks:
            self.cached_blocks[block.content_hash] = block.block_id
            self.touched_blocks.add(block.block_id)
            return
        self._decr_refcount_hashless_block(block)
        block.block_id = self.cached_blocks[block.content_hash]
        self._incr_refcount_cached_block(block.block_id)

    def free(self, block: Block) -> None:
        """Full (hashed) blocks may go to the evictor; partial ones back to the hashless deque."""
        if block.content_hash is not None:
            self._decr_refcount_cached_block(block)
        else:
            self._decr_refcount_hashless_block(block)

    def get_num_free_blocks(self) -> int:
        """Hashless free ids plus evictable cached blocks."""
        return self.hashless_allocator.get_num_free_blocks() + self.evictor.num_blocks

    def get_num_total_blocks(self) -> int:
        return len(self.all_block_ids)

    def is_block_cached(self, block: Block) -> bool:
        return block.content_hash in self.cached_blocks

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Full blocks not cached on this device, or cached only in its evictor."""
        count = 0
        for block in blocks:
            h = block.content_hash
            if block.is_full and (
                h is None or not self.is_block_cached(block) or self.cached_blocks[h] in self.evictor
            ):
                count += 1
        return count

    def swap_out(self, blocks: list[Block]) -> None:
        for block in blocks:
            self.free(block)

    def swap_in(self, blocks: list[Block]) -> None:
        """Give each block an id on this device (full ones through the cache)."""
        for block in blocks:
            if block.is_full:
                tmp = self.allocate_immutable_block(block.prev_block, list(block.token_ids), block.block_size)
            else:
                tmp = self.allocate_mutable_block(block.prev_block, block.block_size)
                self.append_token_ids(tmp, list(block.token_ids))
            block.block_id = tmp.block_id

    def mark_blocks_as_accessed(self, block_ids: list[int], now: int | float) -> None:
        """Set ``last_accessed`` of held blocks (or of free ones in the evictor)."""
        for block_id in block_ids:
            tracker = self.block_tracker.get(block_id)
            if tracker is None:
                # vLLM indexes its GPU tracker with a CPU block id: KeyError.
                raise EngineCrash(
                    "engine_abort_swapped_prefix_cache",
                    "vLLM marks a swapped sequence's CPU blocks as accessed on the GPU allocator "
                    "(KeyError) when it is freed",
                    block_id=block_id,
                )
            if tracker.active:
                tracker.last_accessed = now
            elif block_id in self.evictor:
                self.evictor.update(block_id, now)
            else:
                raise AssertionError("Mark block as accessed which is not belonged to GPU")

    def mark_blocks_as_computed(self) -> None:
        """Every block promoted since the last call is now computed."""
        for block_id in self.touched_blocks:
            self.block_tracker[block_id].computed = True
        self.touched_blocks.clear()

    def block_is_computed(self, block_id: int) -> bool:
        tracker = self.block_tracker[block_id]
        return tracker.computed if tracker.active else block_id in self.evictor

    def find_cached_blocks_prefix(self, block_hashes: list[bytes]) -> list[bytes]:
        """vLLM's binary search for the first uncached hash.

        It assumes cached blocks form a prefix; when they do not (a prefix
        block evicted before a deeper one), the bisection answers what vLLM
        answers, not the true prefix.
        """

        def is_uncached(h: bytes) -> bool:
            block_id = self.cached_blocks.get(h)
            return block_id is None or not self.block_is_computed(block_id)

        lo, hi = 0, len(block_hashes)
        while lo < hi:  # bisect_left(block_hashes, True, key=is_uncached)
            mid = (lo + hi) // 2
            if not is_uncached(block_hashes[mid]):
                lo = mid + 1
            else:
                hi = mid
        return block_hashes[:lo]
