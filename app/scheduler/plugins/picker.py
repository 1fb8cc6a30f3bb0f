# Picker.
#
# Rule: the replica with the highest weighted total (totals compared rounded to 1e-9);
# ties are broken by a hash (CRC-32, deterministic across processes and cheap) of
# (request id, replica id) — rendezvous hashing — so equal
# replicas share new work evenly and never by their order in a list (the collapse onto
# the first replica reported for vllm-router and SGLang's router). The ranking that
# follows the winner (for Ray to fall back on when the winner is full) uses the same
# order.
#
# Parameters: none.
"""Max-score picker with a rendezvous-hash tie-break."""

from __future__ import annotations

import zlib


def tiebreak(key: str, replica: str) -> int:
    return zlib.crc32(f"{key}|{replica}".encode())


def rank(key: str, totals: dict[str, float]) -> list[str]:
    """Replica ids, best first (the tie-break hash is computed only within ties)."""
    level = {r: round(t, 9) for r, t in totals.items()}
    by_total = sorted(level, key=level.__getitem__, reverse=True)  # stable: ties grouped
    out: list[str] = []
    i = 0
    while i < len(by_total):
        j = i + 1
        top = level[by_total[i]]
        while j < len(by_total) and level[by_total[j]] == top:
            j += 1
        group = by_total[i:j]
        out.extend(group if len(group) == 1 else sorted(group, key=lambda r: -tiebreak(key, r)))
        i = j
    return out
