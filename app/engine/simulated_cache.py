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
#     order): a partly evicted chain still hits on its surviving prefix. A block is
#     therefore always more recent than every cached block that continues it, and the
#     LRU block is a chain's tail.
#   * With a ``policy`` (simulated_eviction.py; vLLM has none: its eviction is fixed
#     LRU) the policy picks which chain's tail block goes, one block per eviction,
#     among the chain tails (blocks no cached block continues); every block remembers
#     its chain length, last touch (``clock``) and owner (the salt of the tenant that
#     stored it). Without one (the default) eviction is the LRU rule above.
#
#   * Like vLLM with ``kv_events_config``, the cache can report what it stores and
#     evicts (``on_events``): one BlockStored per insert for its new blocks (their
#     hashes, the parent's, their token ids, the salt in the root's extra keys) and one
#     BlockRemoved per eviction run — the wire format of ``app.engine.kv_events``.
#
# Parameters: ``block_size`` (tokens per block, for ``block_hashes``),
# ``capacity_blocks`` (capacity in blocks; 0 disables caching), ``policy`` (None: LRU)
# and ``clock`` (time of a touch, for policies; default: a count of touches).
"""LRU prefix cache of block-hash chains used by ``SimulatedEngine``."""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.engine.kv_events import BlockRemoved, BlockStored, EngineHash, KvEvent
from app.engine.simulated_eviction import Candidate, EvictionPolicy

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


@dataclass(slots=True)
class _Block:
    parent: bytes | None
    depth: int  # blocks of its chain, root to this one
    owner: str | None
    children: int = 0  # cached blocks that continue it
    last_used: float = 0.0


class PrefixCache:
    """A set of block hashes with chained-prefix lookup, LRU or ``policy`` eviction
    (simulation only)."""

    def __init__(
        self,
        capacity_blocks: int,
        on_events: Callable[[list[KvEvent]], None] | None = None,
        policy: EvictionPolicy | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self.on_events = on_events
        self.policy = policy
        ticks = itertools.count()
        self._clock: Callable[[], float] = clock or (lambda: float(next(ticks)))
        self.evictions = 0
        # Oldest first; values unused.
        self._entries: OrderedDict[bytes, None] = OrderedDict()
        self._blocks: dict[bytes, _Block] = {}

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

    def insert(
        self,
        hashes: Sequence[bytes],
        token_ids: Sequence[int] = (),
        block_size: int = 0,
        salt: str | None = None,
        owner: str | None = None,
    ) -> None:
        """Add (or refresh) a chain of block hashes owned by ``owner`` (a tenant's cache
        salt), evicting if full; with ``on_events``, report the new blocks (``token_ids``
        of the prompt they cut, ``block_size``, the ``salt``) and the evicted ones."""
        if self.capacity_blocks == 0:
            return
        first_new = next((i for i, h in enumerate(hashes) if h not in self._entries), None)
        self._touch(hashes, owner)
        evicted: list[bytes] = []
        while len(self._entries) > self.capacity_blocks:
            evicted.append(self._evict_one())
            self.evictions += 1
        if self.on_events is None:
            return
        events: list[KvEvent] = []
        if first_new is not None:
            new = hashes[first_new:]  # stored, then any evicted at once removed
            events.append(
                BlockStored(
                    block_hashes=list[EngineHash](new),
                    parent_block_hash=hashes[first_new - 1] if first_new else None,
                    token_ids=list(
                        token_ids[first_new * block_size : (first_new + len(new)) * block_size]
                    ),
                    block_size=block_size,
                    extra_keys=[(salt,) if salt is not None and first_new == 0 else None]
                    + [None] * (len(new) - 1),
                )
            )
        if evicted:
            events.append(BlockRemoved(block_hashes=list[EngineHash](evicted)))
        if events:
            self.on_events(events)

    def clear(self) -> None:
        self._entries.clear()
        self._blocks.clear()

    def candidates(self) -> list[Candidate]:
        """Every chain tail (a block no cached block continues), least recently used
        first: what a policy chooses from."""
        out = []
        for rank, block_hash in enumerate(self._entries):
            b = self._blocks[block_hash]
            if b.children == 0:
                out.append(Candidate(block_hash, b.depth, b.last_used, b.owner, rank))
        return out

    def _evict_one(self) -> bytes:
        if self.policy is None:
            victim = next(iter(self._entries))
        else:
            victim = self.policy.victim(self.candidates(), self._clock())
        del self._entries[victim]
        parent = self._blocks.pop(victim).parent
        if parent is not None and parent in self._blocks:
            self._blocks[parent].children -= 1
        return victim

    def _touch(self, hashes: Sequence[bytes], owner: str | None = None) -> None:
        now = self._clock()
        for i, block_hash in enumerate(hashes):
            if block_hash not in self._blocks:
                parent = hashes[i - 1] if i else None
                self._blocks[block_hash] = _Block(parent, i + 1, owner)
                if parent is not None:
                    self._blocks[parent].children += 1
        for block_hash in reversed(hashes):
            self._entries[block_hash] = None
            self._entries.move_to_end(block_hash)
            self._blocks[block_hash].last_used = now
