"""The replica scheduler's plugins: filters (drop replicas), scorers (0–1 per replica)
and the picker. Each module states its rule and parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.scheduler.config import ReplicaRouting
from app.scheduler.prefix_index import PrefixIndex
from app.scheduler.session_ring import SessionRing
from app.scheduler.state import LoadBook, ReplicaView, RoutedRequest


@dataclass
class PoolContext:
    """What plugins read: the pool's config, its prefix index, session ring and load."""

    config: ReplicaRouting
    index: PrefixIndex
    ring: SessionRing
    book: LoadBook


class Filter(Protocol):
    name: str

    def filter(
        self, request: RoutedRequest, replicas: Sequence[ReplicaView], ctx: PoolContext
    ) -> list[ReplicaView]: ...


class Scorer(Protocol):
    name: str

    def score(
        self, request: RoutedRequest, replicas: Sequence[ReplicaView], ctx: PoolContext
    ) -> dict[str, float]: ...
