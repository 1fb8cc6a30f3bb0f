"""The replica scheduler's plugins: filters (drop replicas), scorers (0–1 per replica)
and the picker. Each module states its rule and parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.scheduler.adapter_placement import AdapterPlacement
from app.scheduler.config import ReplicaRouting
from app.scheduler.prefix_index import PrefixIndex
from app.scheduler.session_ring import SessionRing
from app.scheduler.state import Candidates, LoadBook, PrefillBook, RoutedRequest


@dataclass
class PoolContext:
    """What plugins read: the pool's config, its prefix index, session ring, load and
    pending prefills."""

    config: ReplicaRouting
    index: PrefixIndex
    ring: SessionRing
    book: LoadBook
    adapters: AdapterPlacement
    prefill: PrefillBook = field(default_factory=PrefillBook)
    # The current decision's prefix matches (replica -> leading blocks held), computed
    # once by the loop for the request ``matches_for`` and read by every plugin.
    matches: dict[str, int] = field(default_factory=dict)
    matches_for: str | None = None

    def matched(self, request: RoutedRequest, replicas: Sequence[str]) -> dict[str, int]:
        if self.matches_for != request.key:
            self.matches = self.index.match_all(request.hashes, replicas)
            self.matches_for = request.key
        return self.matches


class Filter(Protocol):
    name: str

    def filter(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> Candidates:
        """The candidates that may take the request (none declared yet: Ray already
        leaves out replicas at ``max_ongoing_requests``)."""
        ...


class Scorer(Protocol):
    name: str

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        """One score in [0, 1] per candidate, in ``cands.ids`` order."""
        ...
