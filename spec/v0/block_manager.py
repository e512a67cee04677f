"""``SelfAttnBlockSpaceManager`` (``vllm/core/block_manager.py``, 0.10.2) for n = 1.

Per sequence a :class:`BlockTable` (logical blocks on the GPU, or on the CPU
while swapped), the two allocators of ``CpuGpuBlockAllocator``, the
``ComputedBlocksTracker`` (prefix-cached token counts, frozen per sequence
while it is in prefill) and the ``LastAccessBlocksTracker`` (the logical time
each sequence was last scheduled, copied to its blocks when it is freed).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from schedconf.spec.errors import EngineCrash
from schedconf.spec.hashing import NONE_HASH, compute_block_hash
from schedconf.spec.v0.block_allocator import Block, NaiveBlockAllocator, PrefixCachingBlockAllocator
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus

Allocator = NaiveBlockAllocator | PrefixCachingBlockAllocator


class AllocStatus(enum.Enum):
    """``AllocStatus``: OK now, LATER (fits the pool but not now), NEVER (never fits)."""

    OK = "OK"
    LATER = "LATER"
    NEVER = "NEVER"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockTable:
    """The blocks of one sequence and how many token slots they fill (``BlockTable``)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: list[Block] = []
        self.num_full_slots = 0

    @property
    def physical_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]  # type: ignore[misc]

    def allocate(self, token_ids: list[int], allocator: Allocator) -> None:
        """Blocks for every token: full chunks through the cache, then the partial tail."""
        assert not self.blocks and token_ids
        bs = self.block_size
        prev: Block | None = None
        num_full = len(token_ids) // bs
        if isinstance(allocator, NaiveBlockAllocator):
            # Naive allocates every full block's id first, then builds them (same order).
            ids = [allocator.allocate_block_id() for _ in range(num_full)]
            for i, block_id in enumerate(ids):
                prev = Block(prev, bs, list(token_ids[i * bs : (i + 1) * bs]), block_id)
                self.blocks.append(prev)
        else:
            for i in range(num_full):
                prev = allocator.allocate_immutable_block(prev, list(token_ids[i * bs : (i + 1) * bs]), bs)
                self.blocks.append(prev)
        tail = token_ids[num_full * bs :]
        if tail:
            block = allocator.allocate_mutable_block(prev, bs)
            allocator.append_token_ids(block, list(tail))
            self.blocks.append(block)
        self.num_full_slots = len(token_ids)

    def get_unseen_token_ids(self, sequence_token_ids: list[int]) -> list[int]:
        """The tokens of the sequence not yet in the table."""
        return sequence_token_ids[self.num_full_slots :]

    def get_num_blocks_touched_by_append_slots(self, num_token_ids: int) -> int:
        """``1 + ceil((k - first_chunk) / block_size)``: 1 for any decode, 0 or 1 for none."""
        first_chunk_size = self.block_size - (self.num_full_slots % self.block_size)
        return 1 + cdiv(num_token_ids - first_chunk_size, self.block_size)

    def append_token_ids(self, token_ids: list[int], allocator: Allocator) -> None:
        """Grow the table for ``token_ids`` (new blocks at the end), then write them."""
        assert self.blocks
        empty = len(self.blocks) * self.block_size - self.num_full_slots
        if empty < len(token_ids):
            for _ in range(cdiv(len(token_ids) - empty, self.block_size)):
                self.blocks.append(allocator.allocate_mutable_block(self.blocks[-1], self.block_size))
        index = self.num_full_slots // self.block_size
        first_chunk_size = self.block_size - (self.num_full_slots % self.block_size)
        chunks = [token_ids[:first_chunk_size]] if token_ids else []
        rest = token_ids[first_chunk_size:]
        chunks += [rest[i : i + self.block_size] for i in range(0, len(rest), self.block_size)]
        for i, chunk in enumerate(chunks):
            allocator.append_token_ids(self.blocks[index + i], list(chunk))
        self.num_full_slots += len(token_ids)

    def free(self, allocator_of: Callable[[int], Any]) -> None:
        """Free every block, first to last."""
        for block in self.blocks:
            assert block.block_id is not None, "a block in a table has an id"
            allocator_of(block.block_id).free(block)
        self.blocks = []


class ComputedBlocksTracker:
    """Per sequence: the hashes of its full blocks and its cached-token count.

    The count is computed from the allocator's cache the first time it is
    asked and then frozen while the sequence is in prefill (vLLM's hack for
    chunked prefill); while decoding it is recomputed at every call.
    """

    def __init__(self, block_size: int, enable_caching: bool) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.seq_id_to_blocks_hashes: dict[int, list[bytes]] = {}
        self.seq_id_to_num_tokens_computed: dict[int, int] = {}

    def _update_seq_hashes(self, seq: SequenceGroup) -> None:
        hashes = self.seq_id_to_blocks_hashes.get(seq.seq_id, [])
        token_ids = seq.get_token_ids()
        parent = hashes[-1] if hashes else NONE_HASH
        bs = self.block_size
        for i in range(len(hashes), len(token_ids) // bs):
            parent = compute_block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
        self.seq_id_to_blocks_hashes[seq.seq_id] = hashes

    def get_num_cached_tokens(self, seq: SequenceGroup, gpu_allocator: Allocator) -> int:
        if not self.enable_caching:
            return 0
        self._update_seq_hashes(seq)
        previous = self.seq_id_to_num_tokens_computed.get(seq.seq_id)
        if previous is not None and seq.is_prefill():
            return previous
        hashes = self.seq_id_to_blocks_hashes[seq.seq_id]
        num_cached_tokens = len(gpu_allocator.find_cached_blocks_prefix(hashes)) * self.block_size
        self.seq_id_to_num_tokens_computed[seq.seq_id] = num_cached_tokens
        return num_cached_tokens

    def remove_seq(self, seq_id: int) -> None:
        if not self.enable_caching:
            return
        if seq_id not in self.seq_id_to_blocks_hashes or seq_id not in self.seq_id_to_num_tokens_computed:
            # vLLM asserts the sequence is tracked.
            raise EngineCrash(
                "engine_computed_blocks_tracker_assertion",
                "vLLM's ComputedBlocksTracker.remove_seq asserts on a sequence it no longer tracks "
                "(a swapped decode dropped from the tracker twice, or freed after being dropped)",
                seq_id=seq_id,
            )
        del self.seq_id_to_blocks_hashes[seq_id]
        del self.seq_id_to_num_tokens_computed[seq_id]


class SelfAttnBlockSpaceManager:
    """Allocation, appends, swaps and prefix-cache bookkeeping for every sequence."""

    def __init__(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark_blocks: int, enable_caching: bool
    ) -> None:
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark_blocks = watermark_blocks
        self.enable_caching = enable_caching
        kind = PrefixCachingBlockAllocator if enable_caching else NaiveBlockAllocator
        self.gpu_allocator: Allocator = kind(list(range(num_gpu_blocks)))
        self.cpu_allocator: Allocator = kind(list(range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)))
        self.block_tables: dict[int, BlockTable] = {}
        self.computed_blocks_tracker = ComputedBlocksTracker(block_size, enable_caching)
        self.seq_last_access: dict[int, int | float | None] = {}

    # -- helpers
    def get_allocator(self, block_id: int) -> Allocator:
        """The allocator owning an absolute block id."""
        return self.gpu_allocator if block_id < self.num_total_gpu_blocks else self.cpu_allocator

    def _decide(self, total: int, free: int, required: int, watermark: int, never_if_below: bool) -> AllocStatus:
        """Shared AllocStatus rule; ``never_if_below`` selects can_allocate's NEVER test."""
        if (total - required < watermark) if never_if_below else (total < required):
            return AllocStatus.NEVER
        if free - required >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    # -- allocation
    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Blocks for the whole (re-)prefill, worst case (prefix hits ignored), above the watermark."""
        seq = seq_group.get_seqs(SequenceStatus.WAITING)[0]
        required = cdiv(seq.get_len(), self.block_size)
        return self._decide(
            self.num_total_gpu_blocks,
            self.gpu_allocator.get_num_free_blocks(),
            required,
            self.watermark_blocks,
            never_if_below=True,
        )

    def allocate(self, seq_group: SequenceGroup) -> None:
        """A table for the waiting sequence's tokens (``allocate``)."""
        seq = seq_group.get_seqs(SequenceStatus.WAITING)[0]
        assert seq.seq_id not in self.block_tables
        table = BlockTable(self.block_size)
        table.allocate(seq.get_token_ids(), self.gpu_allocator)
        self.block_tables[seq.seq_id] = table
        assert seq.seq_id not in self.seq_last_access
        self.seq_last_access[seq.seq_id] = None

    def can_append_slots(self, seq_group: SequenceGroup) -> bool:
        """Blocks touched by appending the unseen tokens <= free GPU blocks (no watermark)."""
        touched = 0
        for seq in seq_group.get_seqs(SequenceStatus.RUNNING):
            table = self.block_tables[seq.seq_id]
            touched += table.get_num_blocks_touched_by_append_slots(
                len(table.get_unseen_token_ids(seq.get_token_ids()))
            )
        return touched <= self.gpu_allocator.get_num_free_blocks()

    def append_slots(self, seq: SequenceGroup) -> list[tuple[int, int]]:
        """Write the unseen tokens into the table; returns the (never any) copy-on-writes."""
        table = self.block_tables[seq.seq_id]
        table.append_token_ids(table.get_unseen_token_ids(seq.get_token_ids()), self.gpu_allocator)
        return []

    def free(self, seq: SequenceGroup) -> None:
        """Stamp the blocks with the sequence's last access, untrack it, free its table."""
        if seq.seq_id not in self.block_tables:
            return
        table = self.block_tables[seq.seq_id]
        ts = self.seq_last_access[seq.seq_id]
        if ts is not None:
            self.gpu_allocator.mark_blocks_as_accessed(table.physical_block_ids, ts)
        del self.seq_last_access[seq.seq_id]
        self.computed_blocks_tracker.remove_seq(seq.seq_id)
        table.free(self.get_allocator)
        del self.block_tables[seq.seq_id]

    def remove_seq_from_computed_blocks_tracker(self, seq: SequenceGroup) -> None:
        self.computed_blocks_tracker.remove_seq(seq.seq_id)

    def get_block_table(self, seq: SequenceGroup) -> list[int]:
        return self.block_tables[seq.seq_id].physical_block_ids

    def access_all_blocks_in_seq(self, seq: SequenceGroup, now: int | float) -> None:
        """Record that the sequence was scheduled at ``now`` (prefix caching only)."""
        if self.enable_caching:
            assert seq.seq_id in self.seq_last_access
            self.seq_last_access[seq.seq_id] = now

    def mark_blocks_as_computed(self) -> None:
        self.gpu_allocator.mark_blocks_as_computed()

    def get_num_cached_tokens(self, seq: SequenceGroup) -> int:
        return self.computed_blocks_tracker.get_num_cached_tokens(seq, self.gpu_allocator)

    def get_common_computed_block_ids(self, seq: SequenceGroup) -> list[int]:
        """The first ``cached_tokens // block_size`` blocks of the (single) sequence."""
        num_cached_tokens = self.get_num_cached_tokens(seq)
        assert num_cached_tokens % self.block_size == 0
        return self.block_tables[seq.seq_id].physical_block_ids[: num_cached_tokens // self.block_size]

    # -- swapping
    def _can_swap(
        self, seq_group: SequenceGroup, allocator: Allocator, total: int, status: SequenceStatus, watermark: int
    ) -> AllocStatus:
        touched = 0
        blocks: list[Block] = []
        for seq in seq_group.get_seqs(status):
            table = self.block_tables[seq.seq_id]
            touched += table.get_num_blocks_touched_by_append_slots(
                len(table.get_unseen_token_ids(seq.get_token_ids()))
            )
            blocks.extend(table.blocks)
        touched += allocator.get_num_full_blocks_touched(blocks)
        return self._decide(total, allocator.get_num_free_blocks(), touched, watermark, never_if_below=False)

    def can_swap_in(self, seq_group: SequenceGroup) -> AllocStatus:
        return self._can_swap(
            seq_group, self.gpu_allocator, self.num_total_gpu_blocks, SequenceStatus.SWAPPED, self.watermark_blocks
        )

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        status = self._can_swap(seq_group, self.cpu_allocator, self.num_total_cpu_blocks, SequenceStatus.RUNNING, 0)
        return status is AllocStatus.OK

    def _swap(
        self, seq_group: SequenceGroup, status: SequenceStatus, src: Allocator, dst: Allocator
    ) -> list[tuple[int, int]]:
        mapping: list[tuple[int, int]] = []
        offset = self.num_total_gpu_blocks
        for seq in seq_group.get_seqs(status):
            blocks = self.block_tables[seq.seq_id].blocks
            if not blocks:
                continue
            src_ids = [b.block_id for b in blocks]
            src.swap_out(blocks)
            dst.swap_in(blocks)
            pairs: dict[int, int] = {}
            for s, d in zip(src_ids, [b.block_id for b in blocks]):
                assert s is not None and d is not None, "a swapped block has an id on both devices"
                pairs[s] = d
            # Physical ids: GPU ids as they are, CPU ids relative to the CPU pool.
            mapping.extend(
                (s - offset if s >= offset else s, d - offset if d >= offset else d) for s, d in pairs.items()
            )
        return mapping

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the RUNNING sequence's blocks to the CPU; returns (gpu, cpu) pairs."""
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the SWAPPED sequence's blocks back to the GPU; returns (cpu, gpu) pairs."""
        return self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu_allocator.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.get_num_free_blocks()
