# Approximate prefix index (per replica), the memory behind the prefix scorer.
#
# Rule: for each replica, an LRU set of the chained block hashes of the prompts this
# router sent there, and for each block the replicas holding it. Because a block hash
# names its whole prefix, a prompt's match on a replica is the number of LEADING block
# hashes present. ``insert`` refreshes a prompt's blocks tail first, head last, so a
# chain's head is its most recent block and eviction (beyond ``max_blocks`` per replica,
# least recently used first) takes tails first: what a replica holds of a chain is a
# prefix of it, and ``match_all`` finds its length by bisection, only on the replicas
# that hold the prompt's first block. A replica that leaves is forgotten. The index is
# what the router believes, not what the engine holds: the engine may have evicted a
# block already (its own LRU), which the approximate mode cannot see; the precise mode
# (``app.scheduler.kv_events``) also inserts what the engine reports storing and
# ``remove``s what it reports evicting.
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
        self._total = 0  # blocks tracked over all replicas

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica is believed to hold."""
        return self.match_all(hashes, (replica,))[replica]

    def match_all(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """``match`` for every replica: only the replicas holding the first block are
        searched, each by bisection over the prompt's blocks (a replica's blocks of one
        chain are prefix-closed: ``insert`` refreshes a chain head last, so eviction
        takes tails first)."""
        matched = dict.fromkeys(replicas, 0)
        if not hashes:
            return matched
        for r in self._holders.get(hashes[0], ()):
            if r in matched:
                matched[r] = _leading(self._blocks[r], hashes)
        return matched

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        """Record (and refresh) a prompt's blocks, tail first and head last, so that the
        head is the most recently used and eviction takes tails first."""
        blocks = self._blocks.setdefault(replica, {})
        before = len(blocks)
        for h in reversed(hashes):
            if blocks.pop(h, 0) is not None:  # 0: it was not there (stored values are None)
                self._holders.setdefault(h, set()).add(replica)
            blocks[h] = None
        over = len(blocks) - self.max_blocks
        self._total += len(blocks) - before - max(0, over)
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

    def remove(self, replica: str, hashes: Iterable[int]) -> None:
        """The replica no longer holds these blocks (its engine said so)."""
        blocks = self._blocks.get(replica)
        if blocks is None:
            return
        for h in hashes:
            if blocks.pop(h, 0) is None:  # it was there
                self._release(h, replica)
                self._total -= 1

    def drop(self, replica: str) -> None:
        blocks = self._blocks.pop(replica, {})
        self._total -= len(blocks)
        for h in blocks:
            self._release(h, replica)

    def size(self, replica: str | None = None) -> int:
        """Blocks tracked for ``replica``, or for all replicas."""
        if replica is not None:
            return len(self._blocks.get(replica, ()))
        return self._total

    def replicas(self) -> list[str]:
        return list(self._blocks)


def _leading(blocks: dict[int, None], hashes: Sequence[int]) -> int:
    """The length of the longest prefix of ``hashes`` in ``blocks`` (bisection)."""
    lo, hi = 0, len(hashes)  # hashes[:lo] held; hashes[hi:] not known to be
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo
