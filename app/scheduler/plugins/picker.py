# Picker.
#
# Rule: the candidate with the highest weighted total; totals within ``TIE`` (1e-9) of
# the highest are tied, and ties are broken by a hash (CRC-32, deterministic across
# processes and cheap) of (request id, replica id) — rendezvous hashing — so equal
# replicas share new work evenly and never by their order in a list (the collapse onto
# the first replica reported for vllm-router and SGLang's router). The others are not
# ranked: Ray receives them as one fallback group (used when the winner is at its
# ``max_ongoing_requests``) and chooses among them by queue length itself; only the
# runner-up is found, for the decision's record of what decided.
#
# Parameters: none.
"""Max-score picker with a rendezvous-hash tie-break."""

from __future__ import annotations

import zlib
from collections.abc import Sequence


def tiebreak(key: str, replica: str) -> int:
    return zlib.crc32(f"{key}|{replica}".encode())


TIE = 1e-9


def pick(key: str, ids: Sequence[str], totals: Sequence[float]) -> list[int]:
    """Candidate positions: the winner, the runner-up (the best of the rest, ties by the
    same hash), then the others in the order offered (Ray takes them as one group)."""
    top = max(totals)
    tied = [i for i, t in enumerate(totals) if t >= top - TIE]
    if len(tied) > 1:
        tied.sort(key=lambda i: tiebreak(key, ids[i]), reverse=True)
        first = tied[:2]
    else:
        rest = [t if i != tied[0] else -1.0 for i, t in enumerate(totals)]
        first = [tied[0], rest.index(max(rest))] if len(rest) > 1 else tied
    return first + [i for i in range(len(ids)) if i not in first]
