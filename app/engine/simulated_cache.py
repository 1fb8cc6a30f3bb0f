# Prefix cache of the SIMULATED engine (no weights, no KV tensors: only block hashes).
#
# Rule (vLLM's automatic prefix caching, reduced to bookkeeping):
#   * A prompt is cut into FULL blocks of ``block_size`` tokens; a trailing partial
#     block is never cached.
#   * Block i's hash is H(hash of block i-1, token ids of block i), with H = BLAKE2b.
#     A block hash therefore names the whole prefix up to the end of that block, so
#     two prompts share a cached block only if they share every token before it.
#   * A prompt's hit is the longest run of LEADING blocks whose hashes are all cached.
#     The simulated engine only looks at blocks that end before the prompt's last
#     token (vLLM always recomputes at least one prompt token to produce logits).
#   * The cache is an LRU set of at most ``capacity_blocks`` hashes. A lookup hit and
#     an insert both make the touched blocks most recently used. A chain is touched
#     from its LAST block to its first, so the first block is the most recent one and
#     eviction takes a chain's tail before its head (as vLLM frees blocks in reverse
#     order): a partly evicted chain still hits on its surviving prefix.
#
# Parameters: ``block_size`` (tokens per block, for ``block_hashes``) and
# ``capacity_blocks`` (LRU capacity in blocks; 0 disables caching).
"""LRU prefix cache of block-hash chains used by ``SimulatedEngine``."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence

_DIGEST_SIZE = 16


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[bytes]:
    """Chained hashes of every full ``block_size`` block of ``token_ids``; a ``salt``
    (vLLM's ``cache_salt``) enters the first block's hash, so prompts with different
    salts share no block.

    Public so that routers can predict which engine holds a prompt's prefix.
    """
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    hashes: list[bytes] = []
    parent = b"" if salt is None else b"salt:" + salt.encode() + b"\0"
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        payload = parent + struct.pack(f"<{block_size}q", *block)
        parent = hashlib.blake2b(payload, digest_size=_DIGEST_SIZE).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """An LRU set of block hashes with chained-prefix lookup (simulation only)."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self.evictions = 0
        # Oldest first; values unused.
        self._entries: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._entries

    def lru_order(self) -> list[bytes]:
        """Cached hashes, least recently used first (the next eviction first)."""
        return list(self._entries)

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """Number of leading blocks of ``hashes`` that are cached; touches them."""
        hit = 0
        for block_hash in hashes:
            if block_hash not in self._entries:
                break
            hit += 1
        self._touch(hashes[:hit])
        return hit

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Add (or refresh) a chain of block hashes, evicting LRU blocks if full."""
        if self.capacity_blocks == 0:
            return
        self._touch(hashes)
        while len(self._entries) > self.capacity_blocks:
            self._entries.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()

    def _touch(self, hashes: Iterable[bytes]) -> None:
        for block_hash in reversed(list(hashes)):
            self._entries[block_hash] = None
            self._entries.move_to_end(block_hash)
