"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): the GPU evictor can hand back a stale content hash, and which one it hands back depends on the process.

Rule: evicting a free block returns the content hash the block holds now,
    and the same inputs are scheduled the same way in every process
What vLLM 0.10.2 does (the two assertions this file fails with):
    1. LRUEvictor.evict() returns a block's old content hash from a stale heap
       entry when that entry ties with the live one on (last_accessed,
       num_hashed_tokens) and its hash sorts first; the allocator then fails
       its own sanity check (PrefixCachingBlockAllocator
       ._maybe_allocate_evicted_block_id, core/block/prefix_caching_block.py:336,
       ``assert content_hash_to_evict in self._cached_blocks``) and the engine
       dies.
    2. Whether the stale hash sorts first changes from process to process:
       PrefixCachingBlock.hash_block_tokens hashes a tuple that ends with
       ``extra_hash=None`` (prefix_caching_block.py:952), and on Python 3.11
       ``hash(None)`` is the object's address, which address-space
       randomisation moves at every start; PYTHONHASHSEED does not fix it
       (Python 3.12 made ``hash(None)`` a constant).

Story: V5 of schedconf's reports/findings.md. The evictor keeps a heap of
    (last_accessed, -num_hashed_tokens, block_id, content_hash) and leaves an
    entry in it when the block leaves the free table
    (core/evictor.py: remove() pops the free table only; evict() skips an
    entry whose block is gone or whose time is older). A block freed, hit by a
    prefix (removed from the evictor), freed again and evicted leaves one
    stale copy of its first entry behind. Refilled with other tokens and freed
    at the same time and depth (blocks swapped out enter the GPU evictor with
    time -1), the block has two entries that differ only in the hash: the
    heap pops the smaller. In the engine that happened at random: in 2 of 4
    fresh processes the same input raised, in the other 2 it scheduled on.
    The first test below picks the two blocks' tokens so that the stale hash
    is the smaller in this process (it always can), so it fails every time;
    the second shows that the order is the process's.

Run it where vllm==0.10.2 and pytest are installed, on Python 3.11 (no GPU
needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It imports only vLLM and the standard library, and drives vLLM's own
LRUEvictor and PrefixCachingBlock.
"""

import os
import subprocess
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from vllm.core.block.prefix_caching_block import PrefixCachingBlock  # noqa: E402
from vllm.core.evictor import LRUEvictor  # noqa: E402

BLOCK = 7  # one physical block id, reused
DEPTH = 4  # num_hashed_tokens of a first block of 4 tokens
SWAPPED_OUT = -1  # the last_accessed time of a block swapped out (the tie)
PROCESSES = 4


def first_block_hash(tokens):
    return PrefixCachingBlock.hash_block_tokens(True, None, tokens)


def test_evict_returns_the_content_the_block_holds_now():
    a, b = first_block_hash([1, 2, 3, 4]), first_block_hash([5, 6, 7, 8])
    old, new = min(a, b), max(a, b)  # the stale entry's hash sorts first, as in the runs that crashed
    evictor = LRUEvictor()
    evictor.add(BLOCK, old, DEPTH, SWAPPED_OUT)  # freed
    evictor.remove(BLOCK)  # a prefix hit takes it back: its heap entry stays
    evictor.add(BLOCK, old, DEPTH, SWAPPED_OUT)  # freed again: a second entry, identical
    assert evictor.evict() == (BLOCK, old)  # evicted for new tokens: one of the two identical entries goes
    evictor.add(BLOCK, new, DEPTH, SWAPPED_OUT)  # refilled with the new tokens, freed at the same time and depth
    block_id, content_hash = evictor.evict()
    assert (block_id, content_hash) == (BLOCK, new), (
        f"LRUEvictor.evict() returned block {block_id} with the content hash it held before ({content_hash}), "
        f"not the one it holds now ({new}): a stale heap entry tied with the live one on (last_accessed "
        f"{SWAPPED_OUT}, num_hashed_tokens {DEPTH}) and its hash sorted first. "
        "PrefixCachingBlockAllocator._maybe_allocate_evicted_block_id then asserts "
        "`content_hash_to_evict in self._cached_blocks` (core/block/prefix_caching_block.py:336) and the engine dies"
    )


def test_a_block_hash_is_the_same_in_every_process():
    code = (
        "from vllm.core.block.prefix_caching_block import PrefixCachingBlock as B; "
        "print(B.hash_block_tokens(True, None, [1, 2, 3, 4]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "0", "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1"}
    hashes = set()
    for _ in range(PROCESSES):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True
        )
        hashes.add(int(proc.stdout.strip().splitlines()[-1]))
    assert len(hashes) == 1, (
        f"the same 4 tokens got {len(hashes)} different block hashes in {PROCESSES} processes with "
        f"PYTHONHASHSEED=0 (Python {sys.version.split()[0]}): PrefixCachingBlock.hash_block_tokens hashes a tuple "
        "ending in extra_hash=None (core/block/prefix_caching_block.py:952) and hash(None) is the object's address, "
        "so the evictor's tie-break between two entries of one block differs from process to process"
    )


def main():
    failed = 0
    for name, test in list(globals().items()):
        if name.startswith("test_") and callable(test):
            try:
                test()
            except AssertionError as exc:
                failed += 1
                print(f"FAIL {name}: {exc}")
            else:
                print(f"PASS {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
