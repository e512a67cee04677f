"""The LRU evictor of the prefix-caching allocator (``vllm/core/evictor.py``, 0.10.2).

A heap of ``(last_accessed, -num_hashed_tokens, block_id, content_hash)`` with
lazy deletion: ``update`` and ``remove`` touch only ``free_table``, and
``evict`` skips heap entries whose block is gone or whose time is stale. So
the least recently accessed block goes first; on a tie the one with more
hashed tokens (the deeper block of a prefix chain), then the lower block id.
The heap is rebuilt from ``free_table`` when it grows past 50 entries per
free block, as vLLM does; both matter for which stale entries survive.

DEVIATION(vllm 0.10.2): the last tie-break compares content hashes, which are
Python ``hash()`` values in vLLM and sha256 digests here. Two entries differ
only there when a stale entry of a block and its current entry share time,
depth and block id; then vLLM's order is process-dependent, ours is fixed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

CLEANUP_THRESHOLD = 50


@dataclass
class BlockMetaData:
    """What the evictor knows of one free cached block."""

    content_hash: bytes
    num_hashed_tokens: int
    last_accessed: int | float


class LRUEvictor:
    """Free cached blocks (ref count 0) that keep their content until evicted."""

    def __init__(self) -> None:
        self.free_table: dict[int, BlockMetaData] = {}
        self.priority_queue: list[tuple[int | float, int, int, bytes]] = []

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.free_table

    @property
    def num_blocks(self) -> int:
        """Blocks the evictor can hand out."""
        return len(self.free_table)

    def evict(self) -> tuple[int, bytes]:
        """Pop the first valid heap entry: ``(block_id, content_hash)``.

        An entry is valid when its block is still free and its time is the
        block's current ``last_accessed`` (vLLM's check; the content hash is
        not compared, see ``Scheduler`` for the assertion that follows).
        """
        assert self.free_table, "No usable cache memory left"
        while self.priority_queue:
            last_accessed, _, block_id, content_hash = heapq.heappop(self.priority_queue)
            meta = self.free_table.get(block_id)
            if meta is not None and meta.last_accessed == last_accessed:
                del self.free_table[block_id]
                return block_id, content_hash
        raise AssertionError("No usable cache memory left")

    def add(self, block_id: int, content_hash: bytes, num_hashed_tokens: int, last_accessed: int | float) -> None:
        """Make a block evictable, pushing a fresh heap entry."""
        self.free_table[block_id] = BlockMetaData(content_hash, num_hashed_tokens, last_accessed)
        heapq.heappush(self.priority_queue, (last_accessed, -num_hashed_tokens, block_id, content_hash))
        if len(self.priority_queue) > CLEANUP_THRESHOLD * len(self.free_table):
            self._cleanup()

    def update(self, block_id: int, last_accessed: int | float) -> None:
        """Change a free block's time (the heap entry goes stale; no new entry)."""
        self.free_table[block_id].last_accessed = last_accessed

    def remove(self, block_id: int) -> None:
        """Take a block back out (a cache hit revives it); its heap entry goes stale."""
        assert block_id in self.free_table, "Attempting to remove block that's not in the evictor"
        del self.free_table[block_id]

    def get_eviction_order(self) -> list[int]:
        """Free block ids in the order ``evict`` would hand them out (ignoring stale heap entries)."""
        return sorted(
            self.free_table, key=lambda b: (self.free_table[b].last_accessed, -self.free_table[b].num_hashed_tokens, b)
        )

    def _cleanup(self) -> None:
        """Rebuild the heap from ``free_table`` (drops every stale entry)."""
        self.priority_queue = [
            (m.last_accessed, -m.num_hashed_tokens, block_id, m.content_hash) for block_id, m in self.free_table.items()
        ]
        heapq.heapify(self.priority_queue)
