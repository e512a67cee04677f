"""Chained block hashes over full blocks (§9.1), with sha256 and never ``hash()``.

``hash(block_i) = sha256(DOMAIN || parent || tokens)`` where ``parent`` is the
previous block's 32-byte hash (``NONE_HASH`` for block 0) and ``tokens`` is the
block's token ids, each as a signed 8-byte little-endian integer. Chaining means
a miss at block *i* is a miss for every later block, so lookups stop at the
first miss.

DEVIATION(vllm 0.33.0): vLLM hashes a pickled/CBOR tuple ``(parent, tokens,
extra_keys)`` and derives ``NONE_HASH`` from a seed. The bytes differ, the
equality relation (same prefix <=> same hash) is the same, and no hash value
is observable in a scheduler output.
"""

from __future__ import annotations

import hashlib
import struct

DOMAIN = b"schedconf/block-hash/v1\x00"
NONE_HASH = hashlib.sha256(DOMAIN + b"none").digest()


def compute_block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """Return the hash of one full block given its parent's hash."""
    payload = struct.pack(f"<{len(tokens)}q", *tokens)
    return hashlib.sha256(DOMAIN + parent + payload).digest()


def extend_block_hashes(block_hashes: list[bytes], token_ids: list[int], block_size: int) -> None:
    """Append to ``block_hashes`` the hash of every full block not yet hashed."""
    start = len(block_hashes)
    parent = block_hashes[-1] if block_hashes else NONE_HASH
    for i in range(start, len(token_ids) // block_size):
        parent = compute_block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        block_hashes.append(parent)
