"""The router deployment: owner of the model-selection state.

It serves versioned ``RouteTable`` snapshots to the gateways, which decide locally.
Keeping the table in one deployment gives later issues a single place for hot
reload and shared state (live latency, canary weights) without putting a hop on
every request's path.
"""

from __future__ import annotations

from app.routing.table import RouteDecision, RouteTable


class ModelRouter:
    """Deployment class; ``app.builders`` wraps it with ``serve.deployment``."""

    def __init__(self, table: RouteTable) -> None:
        self._table = table

    def table(self, known_version: int = -1) -> RouteTable | None:
        """The current table, or None when the caller already has this version."""
        return None if known_version == self._table.version else self._table

    def route(self, model: str) -> RouteDecision | None:
        """One decision, for callers that do not keep a snapshot."""
        return self._table.decide(model)
