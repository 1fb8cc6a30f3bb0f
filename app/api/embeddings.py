"""Embeddings: the ingress pipeline (``app.api.pipeline``) with the ``EMBEDDINGS``
slice (``app.api.endpoints``): the input count capped at parse, a local pool only,
the input tokens counted (capped; off the event loop when long) before admission, the
vectors in input order. One ``InferenceRequest`` (``Prompt.inputs``), one ``Outcome``;
the response carries ``x-switchyard-route`` and the decision is logged as for chat."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from app.api.endpoints import EMBEDDINGS
from app.api.flow import Calls
from app.api.pipeline import Pipeline
from app.api.stages.parse import ParseSettings
from app.config import RequestLimits
from app.dispatch.pools import Pools
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.routing.snapshot import RouteSnapshot
from app.sessions.book import SessionBook


class EmbeddingFlow(Pipeline):
    def __init__(
        self,
        routes: RouteSnapshot,
        pools: Pools,
        gatekeeper: Gatekeeper,
        metrics: GatewayMetrics,
        max_body_bytes: int,
        limits: RequestLimits,
        calls: Calls,
        sessions: SessionBook | None = None,
    ) -> None:
        settings = ParseSettings(max_body_bytes, limits, gatekeeper.config.args)
        super().__init__(routes, pools, gatekeeper, metrics, settings, calls, sessions)

    async def handle(self, request: Request) -> Response:
        return await self.run(request, EMBEDDINGS)
