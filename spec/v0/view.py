"""The state view the v0 invariants read (``spec/v0/invariants.py``), over a live v0 scheduler.

Same idea as ``spec/v1/view.py``: scalars, domains to quantify over, and lookups,
so that an invariant is one statement over ``ops`` (concrete here; a symbolic
backend can offer the same names). Status codes are vLLM's integers.
"""

from __future__ import annotations

from schedconf.spec.v0.block_allocator import PrefixCachingBlockAllocator, get_content_hash
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus

WAITING, RUNNING, SWAPPED = int(SequenceStatus.WAITING), int(SequenceStatus.RUNNING), int(SequenceStatus.SWAPPED)
QUEUE_WAITING, QUEUE_RUNNING, QUEUE_SWAPPED = 0, 1, 2


class ConcreteV0View:
    """Read-only snapshot of a v0 scheduler for the invariants."""

    def __init__(self, scheduler) -> None:  # noqa: ANN001 - avoid an import cycle
        cfg = scheduler.config
        bm = scheduler.block_manager
        self.step = scheduler.current_step
        self.block_size = cfg.block_size
        self.num_gpu_blocks = cfg.num_gpu_blocks
        self.num_cpu_blocks = cfg.num_cpu_blocks
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.enable_caching = cfg.enable_prefix_caching
        self.gpu_blocks = list(range(cfg.num_gpu_blocks))
        self.cpu_blocks = list(range(cfg.num_gpu_blocks, cfg.num_gpu_blocks + cfg.num_cpu_blocks))

        self._refcount: dict[int, int] = {}
        self._in_free_list: dict[int, int] = {}
        self._in_evictor: dict[int, bool] = {}
        self._cached_ok: dict[int, bool] = {}
        for allocator in (bm.gpu_allocator, bm.cpu_allocator):
            naive = allocator.hashless_allocator if isinstance(allocator, PrefixCachingBlockAllocator) else allocator
            free = list(naive.free_block_ids)
            for b in allocator.all_block_ids:
                self._refcount[b] = allocator.refcounts[b]
                self._in_free_list[b] = free.count(b)
                self._in_evictor[b] = isinstance(allocator, PrefixCachingBlockAllocator) and b in allocator.evictor
                self._cached_ok[b] = True
            if isinstance(allocator, PrefixCachingBlockAllocator):
                for h, b in allocator.cached_blocks.items():
                    # A cached id is held, or free in the evictor under the same hash.
                    in_evictor_ok = b in allocator.evictor and allocator.evictor.free_table[b].content_hash == h
                    if not (allocator.refcounts[b] > 0 or in_evictor_ok):
                        self._cached_ok[b] = False
                for b in allocator.evictor.free_table:
                    if allocator.cached_blocks.get(allocator.evictor.free_table[b].content_hash) != b:
                        self._cached_ok[b] = False

        groups: dict[str, SequenceGroup] = {}
        self._queue_count: dict[str, list[int]] = {}
        for q_index, queue in (
            (QUEUE_WAITING, scheduler.waiting),
            (QUEUE_RUNNING, scheduler.running),
            (QUEUE_SWAPPED, scheduler.swapped),
        ):
            for sg in queue:
                groups.setdefault(sg.request_id, sg)
                self._queue_count.setdefault(sg.request_id, [0, 0, 0])[q_index] += 1
        self.groups = sorted(groups)
        self._status = {rid: int(sg.status) for rid, sg in groups.items()}
        self._len = {rid: sg.get_len() for rid, sg in groups.items()}
        self._computed = {rid: sg.num_computed_tokens for rid, sg in groups.items()}
        self._table: dict[str, list[int]] = {}
        self._full_slots: dict[str, int] = {}
        self._hash_ok: dict[str, bool] = {}
        for rid, sg in groups.items():
            table = bm.block_tables.get(sg.seq_id)
            self._table[rid] = table.physical_block_ids if table is not None else []
            self._full_slots[rid] = table.num_full_slots if table is not None else 0
            ok = True
            if table is not None and self.enable_caching:
                for block in table.blocks:
                    if block.is_full:
                        allocator = bm.get_allocator(block.block_id)
                        content = get_content_hash(block)
                        ok = (
                            ok
                            and content is not None
                            and isinstance(allocator, PrefixCachingBlockAllocator)
                            and allocator.cached_blocks.get(content) == block.block_id
                        )
            self._hash_ok[rid] = ok
        self._holders = {b: 0 for b in self._refcount}
        for table in self._table.values():
            for b in table:
                self._holders[b] += 1
        # vLLM's leak: swapped groups ignored by can_swap_in NEVER keep their tables.
        leaked = [sg for sg in scheduler.leaked_seq_groups if sg.seq_id in bm.block_tables]
        for sg in leaked:
            for b in bm.block_tables[sg.seq_id].physical_block_ids:
                self._holders[b] += 1
        owners = {sg.seq_id for sg in groups.values()} | {sg.seq_id for sg in leaked}
        self.orphan_tables = len([seq_id for seq_id in bm.block_tables if seq_id not in owners])

        record = scheduler.pending
        self.has_pending = record is not None
        self.preemptions = list(record.preemptions) if record is not None else []
        if record is not None:
            out = record.output
            self.num_scheduled_groups = len(out.scheduled_seq_groups)
            self.sum_chunks = sum(g.token_chunk_size for g in out.scheduled_seq_groups)
            self.num_batched_tokens = out.num_batched_tokens
            self.num_uncached_tokens = record.num_uncached_tokens
            self.num_curr_seqs = record.num_curr_seqs
            self.swap_in_and_out = bool(out.blocks_to_swap_in) and bool(out.blocks_to_swap_out)
        else:
            self.num_scheduled_groups = self.sum_chunks = self.num_batched_tokens = 0
            self.num_uncached_tokens = self.num_curr_seqs = 0
            self.swap_in_and_out = False

    # blocks
    def refcount(self, b: int) -> int:
        return self._refcount[b]

    def num_in_free_list(self, b: int) -> int:
        return self._in_free_list[b]

    def in_evictor(self, b: int) -> bool:
        return self._in_evictor[b]

    def num_holders(self, b: int) -> int:
        return self._holders[b]

    def cache_entry_ok(self, b: int) -> bool:
        return self._cached_ok[b]

    # groups
    def status(self, r: str) -> int:
        return self._status[r]

    def queue_count(self, r: str, q: int) -> int:
        return self._queue_count[r][q]

    def num_tokens(self, r: str) -> int:
        return self._len[r]

    def num_computed_tokens(self, r: str) -> int:
        return self._computed[r]

    def num_blocks(self, r: str) -> int:
        return len(self._table[r])

    def num_full_slots(self, r: str) -> int:
        return self._full_slots[r]

    def num_gpu_blocks_held(self, r: str) -> int:
        return sum(1 for b in self._table[r] if b < self.num_gpu_blocks)

    def num_cpu_blocks_held(self, r: str) -> int:
        return sum(1 for b in self._table[r] if b >= self.num_gpu_blocks)

    def full_blocks_cached(self, r: str) -> bool:
        return self._hash_ok[r]
