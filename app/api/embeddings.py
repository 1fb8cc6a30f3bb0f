"""Embeddings through the same flow as generation:

authenticate → parse (input count capped) → route (model, pool, fallbacks) → count the
input tokens when the model's tokenizer is local (capped; off the event loop when
long) → admit → dispatch with bounded fallbacks → settle. One ``InferenceRequest``
(``Prompt.inputs``), one ``Outcome``; the response carries ``x-switchyard-route`` and
the decision is logged as for chat, and the replica's shutdown drains it like a stream.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.api.body import parse_body
from app.api.errors import ApiError, map_exception, model_not_found, shutting_down
from app.api.flow import Call, Calls
from app.api.generation import SESSION_HEADER
from app.api.openai_format import embedding_list
from app.api.prompt import OFF_LOOP_CHARS
from app.api.protocol import EmbeddingRequest
from app.api.request_id import client_request_id, incoming_request_id
from app.config import RequestLimits
from app.dispatch.fallback import dispatch_embed
from app.dispatch.pools import Pools
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest, Outcome, Prompt
from app.routing.snapshot import RouteSnapshot
from app.sessions.book import SessionBook
from app.state.protocol import Price


class EmbeddingFlow:
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
        self._routes = routes
        self._pools = pools
        self._gatekeeper = gatekeeper
        self._metrics = metrics
        self._max_body = max_body_bytes
        self._limits = limits
        self.calls = calls
        self._sessions = sessions

    async def handle(self, request: Request) -> Response:
        rid = incoming_request_id(request.scope)
        call = Call(rid, self._metrics.model_label(None), Outcome("embeddings"))
        limits, gatekeeper = self._limits, self._gatekeeper
        try:
            if self.calls.draining:
                raise shutting_down()
            caller, principal = await gatekeeper.identify(request.headers)
            call.tenant = caller.tenant
            body = await parse_body(request, EmbeddingRequest, self._max_body)
            inputs = body.inputs()
            if len(inputs) > limits.max_embedding_inputs:
                raise ApiError(
                    400,
                    f"At most {limits.max_embedding_inputs} inputs per request.",
                    param="input",
                    code="too_many_inputs",
                )
            req = call.request = InferenceRequest(
                id=rid,
                endpoint="embeddings",
                model=body.model,
                prompt=Prompt(inputs=tuple(inputs)),
                max_tokens=0,
                caller=caller,
                session_id=request.headers.get(SESSION_HEADER),
                client_request_id=client_request_id(request.scope),
            )
            if req.session_id is not None and self._sessions is not None:
                await self._sessions.admit(caller.tenant, req.session_id)
            # A model of another task (WrongEndpoint) is a 400 here, before any
            # tokenizing or admission (app.routing.table).
            decision = await self._routes.decide(req, live=self.calls.live.p95_ms)
            if decision is None:
                raise model_not_found(req.model)
            table = self._routes.table
            if table.deployment(decision.pool) is None:
                raise ApiError(400, f"`{req.model}` is not served by a local pool.", param="model")
            call.decision = decision
            call.label = self._metrics.model_label(decision.model)
            plan = gatekeeper.plan(caller, principal)
            counted = await self._count(table.pool_model(decision.pool), inputs)
            profile = table.profile(decision.model)
            call.admission = await gatekeeper.gate.admit(
                req,
                plan,
                prompt_tokens=(counted or 0) if plan.needs_prompt_tokens else 0,
                context_left=0,
                price=profile.price() if profile is not None else Price(),
                counted_prompt_tokens=counted,
            )
            self.calls.add(call)
            vectors, tokens = await dispatch_embed(
                self._pools, table, decision, req, call.outcome, self._metrics
            )
            call.answered = True
            call.outcome.prompt_tokens = tokens
            # Rendered inside the mapped block: a body JSON cannot carry (a NaN in a
            # vector) is this request's logged 500, not a bare one from the framework.
            response = JSONResponse(
                embedding_list(vectors, decision.model, tokens, body.encoding_format),
                headers={**call.admission.headers(), **call.route_header()},
            )
        except asyncio.CancelledError:
            self.calls.end(call, "client_closed", 499)
            self.calls.explain(call)
            raise
        except BaseException as exc:
            err = shutting_down() if call.shutdown else map_exception(exc, rid, "input")
            return self.calls.fail(call, exc, err)
        self.calls.end(call, "ok", 200)
        self.calls.explain(call)
        return response

    async def _count(self, model: str | None, inputs: list[str]) -> int | None:
        """The input tokens when ``model``'s tokenizer is local (capped), else None."""
        tokenizer = self._gatekeeper.tokenizer(model) if model else None
        if tokenizer is None:
            return None

        def count() -> int:
            return sum(len(tokenizer.embedding_input(t)) for t in inputs)

        long = sum(len(t) for t in inputs) >= OFF_LOOP_CHARS
        counted = await asyncio.to_thread(count) if long else count()
        if counted > self._limits.max_embedding_tokens:
            raise ApiError(
                400,
                f"The inputs have {counted} tokens; at most "
                f"{self._limits.max_embedding_tokens} per request.",
                param="input",
                code="too_many_tokens",
            )
        return counted
