"""Chat, legacy completions, OpenAI Responses and Anthropic Messages: the ingress
pipeline (``app.api.pipeline``) with their endpoint slices (``app.api.endpoints``:
``CHAT``, ``COMPLETION``, ``responses``, ``MESSAGES``)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response

from app.adapters.registry import AdapterRegistry
from app.api.endpoints import CHAT, COMPLETION, MESSAGES, Endpoint, responses
from app.api.flow import Calls
from app.api.pipeline import Pipeline
from app.api.stages.parse import ParseSettings
from app.config import RequestLimits
from app.dispatch.pools import Pools
from app.fairness.pools import FairQueues
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.responses.book import ResponseBook
from app.routing.snapshot import RouteSnapshot
from app.sessions.book import SessionBook

Kind = Literal["chat", "completion", "messages", "responses"]
SLICES: dict[Kind, Endpoint[Any]] = {"chat": CHAT, "completion": COMPLETION, "messages": MESSAGES}


class GenerationFlow(Pipeline):
    def __init__(
        self,
        routes: RouteSnapshot,
        pools: Pools,
        gatekeeper: Gatekeeper,
        metrics: GatewayMetrics,
        max_body_bytes: int,
        limits: RequestLimits | None = None,
        calls: Calls | None = None,
        sessions: SessionBook | None = None,
        adapters: AdapterRegistry | None = None,
        fair: FairQueues | None = None,
        book: ResponseBook | None = None,
    ) -> None:
        settings = ParseSettings(max_body_bytes, limits or RequestLimits(), gatekeeper.config.args)
        calls = calls or Calls(gatekeeper, metrics)
        super().__init__(routes, pools, gatekeeper, metrics, settings, calls, sessions, adapters)
        self.fair = fair
        self.slices: dict[Kind, Endpoint[Any]] = dict(SLICES)
        if book is not None:  # the Responses API stores its responses
            self.slices["responses"] = responses(book)

    async def handle(self, request: Request, kind: Kind) -> Response:
        return await self.run(request, self.slices[kind])
