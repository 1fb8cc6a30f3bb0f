# Approximate prefix index (per replica), the memory behind the prefix scorer.
#
# Rule: for each replica, an LRU set of the chained block hashes of the prompts this
# router sent there. Because a block hash names its whole prefix, a prompt's match on a
# replica is the number of LEADING block hashes present (stop at the first miss).
# ``insert`` and a match both refresh the touched blocks; beyond ``max_blocks`` per
# replica the least recently used block is dropped. A replica that leaves is forgotten.
# The index is what the router believes, not what the engine holds: the engine may have
# evicted a block earlier (its own LRU), which the approximate mode cannot see.
#
# Parameters: ``max_blocks`` (per replica).
"""Per-replica LRU sets of block hashes with leading-match lookup."""

from __future__ import annotations

from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        # replica -> {block hash: None}, oldest first (a dict keeps insertion order).
        self._blocks: dict[str, dict[bytes, None]] = {}

    def match(self, replica: str, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def insert(self, replica: str, hashes: Sequence[bytes]) -> None:
        blocks = self._blocks.setdefault(replica, {})
        for h in hashes:
            blocks.pop(h, None)
            blocks[h] = None
        over = len(blocks) - self.max_blocks
        if over > 0:
            for h in list(_first(blocks, over)):
                del blocks[h]

    def drop(self, replica: str) -> None:
        self._blocks.pop(replica, None)

    def size(self, replica: str | None = None) -> int:
        """Blocks tracked for ``replica``, or for all replicas."""
        if replica is not None:
            return len(self._blocks.get(replica, ()))
        return sum(len(b) for b in self._blocks.values())

    def replicas(self) -> list[str]:
        return list(self._blocks)


def _first(blocks: dict[bytes, None], n: int) -> list[bytes]:
    out: list[bytes] = []
    for h in blocks:
        if len(out) >= n:
            break
        out.append(h)
    return out
