# Approximate prefix index (per replica), the memory behind the prefix scorer.
#
# Rule: for each replica, an LRU set of the chained block hashes of the prompts this
# router sent there, and for each block the replicas holding it. Because a block hash
# names its whole prefix, a prompt's match on a replica is the number of LEADING block
# hashes present (stop at the first miss); ``match_all`` walks the prompt's blocks once
# for every candidate together, dropping replicas as they miss. ``insert`` refreshes the
# touched blocks; beyond ``max_blocks`` per replica its least recently used block is
# dropped. A replica that leaves is forgotten. The index is what the router believes,
# not what the engine holds: the engine may have evicted a block already (its own LRU),
# which the approximate mode cannot see.
#
# Parameters: ``max_blocks`` (per replica).
"""Per-replica LRU sets of block hashes with a leading-match lookup."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class PrefixIndex:
    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        # replica -> {block hash: None}, oldest first (a dict keeps insertion order).
        self._blocks: dict[str, dict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}  # block hash -> replicas holding it

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        return self.match_all(hashes, (replica,))[replica]

    def match_all(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """``match`` for every replica, in one walk over the prompt's blocks."""
        matched = dict.fromkeys(replicas, 0)
        alive = set(matched)
        for i, h in enumerate(hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            still = alive & holders
            for r in alive - still:
                matched[r] = i
            alive = still
            if not alive:
                break
        else:
            for r in alive:
                matched[r] = len(hashes)
            return matched
        for r in alive:  # stopped at a block nobody holds
            matched[r] = i
        return matched

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        blocks = self._blocks.setdefault(replica, {})
        for h in hashes:
            if blocks.pop(h, 0) is not None:  # new here
                self._holders.setdefault(h, set()).add(replica)
            blocks[h] = None
        over = len(blocks) - self.max_blocks
        while over > 0:
            oldest = next(iter(blocks))
            del blocks[oldest]
            self._release(oldest, replica)
            over -= 1

    def _release(self, h: int, replica: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(replica)
            if not holders:
                del self._holders[h]

    def drop(self, replica: str) -> None:
        for h in self._blocks.pop(replica, {}):
            self._release(h, replica)

    def size(self, replica: str | None = None) -> int:
        """Blocks tracked for ``replica``, or for all replicas."""
        if replica is not None:
            return len(self._blocks.get(replica, ()))
        return sum(len(b) for b in self._blocks.values())

    def replicas(self) -> list[str]:
        return list(self._blocks)
