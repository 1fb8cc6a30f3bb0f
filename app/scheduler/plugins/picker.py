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
    """Replica ids, best first."""
    return sorted(totals, key=lambda r: (-round(totals[r], 9), -tiebreak(key, r)))
