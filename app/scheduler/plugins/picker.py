# Picker.
#
# Rule: the replica with the highest weighted total (totals compared rounded to 1e-9);
# ties are broken by a hash of (request id, replica id) — rendezvous hashing — so equal
# replicas share new work evenly and never by their order in a list (the collapse onto
# the first replica reported for vllm-router and SGLang's router). The ranking that
# follows the winner (for Ray to fall back on when the winner is full) uses the same
# order.
#
# Parameters: none.
"""Max-score picker with a rendezvous-hash tie-break."""

from __future__ import annotations

import hashlib


def tiebreak(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(key: str, totals: dict[str, float]) -> list[str]:
    """Replica ids, best first (the tie-break hash is computed only within ties)."""
    by_total = sorted(totals, key=lambda r: -round(totals[r], 9))
    out: list[str] = []
    i = 0
    while i < len(by_total):
        j = i + 1
        level = round(totals[by_total[i]], 9)
        while j < len(by_total) and round(totals[by_total[j]], 9) == level:
            j += 1
        group = by_total[i:j]
        out.extend(group if len(group) == 1 else sorted(group, key=lambda r: -tiebreak(key, r)))
        i = j
    return out
