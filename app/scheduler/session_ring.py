# Session affinity: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam).
#
# Rule: each replica has ``virtual_nodes`` points on a 64-bit ring (BLAKE2b of
# "<replica>#<i>"); a session key hashes to a point and belongs to the first replica
# clockwise whose load is at most ceil((1 + epsilon) * (total load + 1) / replicas)
# (counting the request being placed), else to the next distinct replica, and so on.
# When a replica joins or leaves only the keys on its arcs move (about 1/N of them),
# as long as no replica is over its bound.
#
# Parameters: ``virtual_nodes``, ``epsilon``.
"""The ring that keeps a session's calls on one replica, within a load bound."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping


def point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class SessionRing:
    def __init__(self, virtual_nodes: int = 100, epsilon: float = 0.25) -> None:
        self.virtual_nodes = virtual_nodes
        self.epsilon = epsilon
        self._members: tuple[str, ...] = ()
        self._member_set: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []

    def set_members(self, replicas: Iterable[str]) -> None:
        members = tuple(sorted(set(replicas)))
        if members == self._members:
            return
        ring = sorted((point(f"{r}#{i}"), r) for r in members for i in range(self.virtual_nodes))
        self._members = members
        self._member_set = frozenset(members)
        self._points = [p for p, _ in ring]
        self._owners = [r for _, r in ring]

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

    def owner(self, key: str, loads: Mapping[str, float]) -> str | None:
        """The replica of ``key`` among the candidates (``loads``: candidate -> its load;
        only members of the ring count), the load bound applied; None when no candidate
        is on the ring."""
        members = self._member_set
        if len(loads) == len(members) and members.issuperset(loads):
            allowed = loads  # the usual case: every member is a candidate
        else:
            allowed = {r: x for r, x in loads.items() if r in members}
        if not allowed or not self._points:
            return None
        total = sum(allowed.values())
        bound = math.ceil((1 + self.epsilon) * (total + 1) / len(allowed))
        start = bisect.bisect(self._points, point(key)) % len(self._points)
        seen: list[str] = []
        for i in range(len(self._points)):
            r = self._owners[(start + i) % len(self._points)]
            if r not in allowed or r in seen:
                continue
            if allowed[r] + 1 <= bound:
                return r
            seen.append(r)
            if len(seen) == len(allowed):
                break
        return seen[0]  # every candidate is at its bound: the first on the ring
