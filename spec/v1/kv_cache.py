"""The KV cache manager: prefix-cache lookup, slot allocation, caching and freeing.

Models ``KVCacheManager`` with the unitary coordinator and the
``FullAttentionManager`` (``vllm/v1/core/kv_cache_manager.py``,
``single_type_kv_cache_manager.py``, 0.33.0), §9.4-9.6 of the notes, for one
full-attention group with ``hash_block_size == block_size``.

Blocks layout of one request (``allocate_slots``)::

    | computed | new hit | new tokens | lookahead |
               |<----- to be allocated -------->|
    |<-- cached (full blocks, capped at num_tokens) -->|
"""

from __future__ import annotations

from dataclasses import dataclass

from schedconf.spec.v1.block_pool import BlockPool, KVCacheBlock
from schedconf.spec.v1.config import cdiv
from schedconf.spec.v1.request import Request


@dataclass(frozen=True)
class Allocated:
    """``allocate_slots`` succeeded; ``new_blocks`` are the blocks it popped."""

    new_blocks: list[KVCacheBlock]


@dataclass(frozen=True)
class NoSpace:
    """``allocate_slots`` failed and changed nothing.

    ``gate`` is ``full_sequence`` when the admission gate refused (the whole
    current sequence does not fit) or ``slots`` when this step's slots do not.
    """

    gate: str
    num_blocks_needed: int
    num_free_blocks: int


AllocationResult = Allocated | NoSpace


@dataclass(frozen=True)
class PrefixHit:
    """The cached prefix of a request: whole blocks, never the last token."""

    blocks: list[KVCacheBlock]
    num_tokens: int


NO_HIT = PrefixHit(blocks=[], num_tokens=0)


class KVCacheManager:
    """Per-request block tables on top of one :class:`BlockPool`."""

    def __init__(self, pool: BlockPool, block_size: int, max_model_len: int, enable_caching: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        # request id -> its blocks, in token order (the block table)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request id -> how many leading blocks of its table are cached
        self.num_cached_block: dict[str, int] = {}

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Return the request's block table (empty if it holds none)."""
        return self.req_to_blocks.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> PrefixHit:
        """Find the longest cached prefix of ``request`` in whole blocks (§9.4).

        The hit is capped at ``num_tokens - 1`` tokens: the last token is always
        recomputed to get its logits, so a prompt whose length is a multiple of
        ``block_size`` and is fully cached recomputes a whole block. Lookups stop
        at the first miss (hashes are chained). No reference is taken here.
        """
        if not self.enable_caching:
            return NO_HIT
        max_cache_hit_length = request.num_tokens - 1
        blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[: max_cache_hit_length // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(blocks=blocks, num_tokens=len(blocks) * self.block_size)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, hit_blocks: list[KVCacheBlock]) -> int:
        """Blocks that must come out of the free queue to give ``num_tokens`` slots.

        A request already tracked (running) needs ``cdiv(num_tokens) - held``,
        floored at 0 (rejected drafts can leave it holding more). A request being
        admitted also needs its hit blocks that sit in the free queue
        (``ref_cnt == 0``): touching them takes them out of it.
        """
        num_required = cdiv(num_tokens, self.block_size)
        held = self.req_to_blocks.get(request_id)
        if held is not None:
            return max(num_required - len(held), 0)
        num_evictable = sum(1 for b in hit_blocks if b.ref_cnt == 0 and not b.is_null)
        return max(num_required - len(hit_blocks), 0) + num_evictable

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        hit: PrefixHit = NO_HIT,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
    ) -> AllocationResult:
        """Give ``request`` slots for ``num_new_tokens`` more tokens plus lookahead (§9.5).

        1. With ``full_sequence_must_fit`` (waiting requests, 0.25+), refuse
           unless the free blocks cover the whole current sequence
           (``min(num_tokens, max_model_len)`` tokens), hit blocks counted.
        2. Refuse unless the free blocks, less ``reserved_blocks``, cover this
           step's slots: ``min(computed + hit + new + lookahead, max_model_len)``
           tokens. (vLLM 0.33 reserves blocks for the prefills of requests
           loading KV asynchronously from a connector; the full-sequence gate
           of step 1 does not count them. Without connectors the scheduler
           passes 0.)
        3. Take references on the hit blocks, append them to the table, pop new
           blocks from the front of the free queue.
        4. Cache every block that is now full, counting tokens up to
           ``min(computed + hit + new, num_tokens)`` (drafts are never cached):
           blocks enter the prefix cache when scheduled, before the forward pass.

        A refusal changes nothing (the hit blocks were not touched).
        """
        assert num_new_tokens > 0 or hit.num_tokens > 0, "allocate_slots needs tokens"
        num_local_computed = request.num_computed_tokens + hit.num_tokens
        total_computed = min(num_local_computed, self.max_model_len)
        num_free = self.pool.get_num_free_blocks()

        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            needed = self.get_num_blocks_to_allocate(request.request_id, full_num_tokens, hit.blocks)
            if needed > num_free:
                return NoSpace(gate="full_sequence", num_blocks_needed=needed, num_free_blocks=num_free)

        num_tokens_need_slot = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        needed = self.get_num_blocks_to_allocate(request.request_id, num_tokens_need_slot, hit.blocks)
        if needed > num_free - reserved_blocks:
            return NoSpace(gate="slots", num_blocks_needed=needed, num_free_blocks=num_free)

        request_id = request.request_id
        table = self.req_to_blocks.get(request_id)
        if table is None:
            # First allocation of this request: adopt the hit blocks.
            self.pool.touch(hit.blocks)
            table = self.req_to_blocks[request_id] = list(hit.blocks)
            self.num_cached_block[request_id] = len(hit.blocks)
        else:
            assert not hit.blocks, f"request {request_id} already holds blocks and cannot adopt a hit"
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(table)
        new_blocks = self.pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        table.extend(new_blocks)

        self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return Allocated(new_blocks=new_blocks)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` tokens fill completely.

        Only full blocks whose hash is known are cached; blocks already cached
        are left alone.
        """
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens, len(request.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.pool.cache_full_blocks(self.req_to_blocks[request_id], request.block_hashes, num_cached, num_full)
        self.num_cached_block[request_id] = num_full

    def reset_prefix_cache(self) -> bool:
        """The pool's reset (``BlockPool.reset_prefix_cache``): False while blocks are in use."""
        return self.pool.reset_prefix_cache()

    def free(self, request: Request) -> None:
        """Return the request's blocks to the pool, tail block first (§9.6).

        Freeing tail first puts the end of a cached chain nearer the front of
        the free queue than its head, so a chain is evicted from its end.
        Freeing a request that holds nothing is a no-op.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))
