"""Model selection, step one: a public model id maps to the pool that serves it.

A ``RouteTable`` is an immutable, versioned snapshot. The router deployment owns the
current table; gateways keep a copy and decide locally, so the decision costs no
network hop on the request path (see docs/architecture.md). Later issues add aliases,
canaries, tenant overrides and policies to the same table.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouteDecision:
    model: str
    pool: str
    step: str = "default"


@dataclass(frozen=True)
class ModelRoute:
    model: str
    pool: str
    task: str
    max_model_len: int


@dataclass(frozen=True)
class RouteTable:
    version: int
    routes: dict[str, ModelRoute] = field(default_factory=dict)
    default_model: str | None = None

    def decide(self, model: str) -> RouteDecision | None:
        """The route for ``model``, or None when no pool serves it."""
        route = self.routes.get(model)
        if route is None:
            return None
        return RouteDecision(model=route.model, pool=route.pool)

    def models(self) -> list[ModelRoute]:
        return sorted(self.routes.values(), key=lambda r: r.model)
