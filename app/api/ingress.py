"""OpenAiIngress: the gateway deployment (layer 1 of the design card).

Request path: the pipeline of stages (``app.api.pipeline``): authenticate → parse →
route (model and pool from the route snapshot, no hop) → admit (rate limits and budget
reservation, ``app.gateway``) → dispatch (to the LLMServer replica: the one hop tokens
take) → respond (OpenAI shapes out; the request ends once: metrics, the ledger record).
The endpoints are slices of it (``app.api.endpoints``: chat and completions through
``app.api.generation``, embeddings through ``app.api.embeddings``); the operator API is
in ``app.api.admin_routes``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import logs
from app.adapters.registry import AdapterBase, AdapterRegistry, S3Defaults
from app.admin.service import AdminService
from app.api.admin_routes import AdminAccess
from app.api.admin_routes import router as admin_router
from app.api.count_tokens import count_tokens
from app.api.drain_signal import on_drain
from app.api.embeddings import EmbeddingFlow
from app.api.errors import (
    ApiError,
    Dialect,
    LastResort,
    http_error,
    map_exception,
    model_not_found,
    rejection_reason,
    shutting_down,
)
from app.api.flow import Calls
from app.api.generation import GenerationFlow
from app.api.metrics import (
    BoardClient,
    MetricsAccess,
    metrics_response,
    node_engine_families,
)
from app.api.openapi import openapi_document
from app.api.request_id import incoming_request_id
from app.api.responses_routes import ResponseRoutes
from app.api.sessions import SessionRoutes
from app.api.single_node import check_in_ray
from app.config import FairnessArgs, RequestLimits
from app.dispatch.disagg import DisaggregatedPool
from app.dispatch.pools import Pools
from app.fairness.pools import FairQueues
from app.fairness.queue import PoolQueue, QueueSettings
from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
from app.loopback import bind_replica_grpc_to_loopback
from app.observability.metrics import GatewayMetrics
from app.observability.tracing import Tracer
from app.request import BANDS
from app.responses.book import ResponseBook
from app.routing.snapshot import RouteSnapshot
from app.routing.table import RouteDecision, RouteRequest, RouteTable
from app.sessions.book import SessionBook
from app.state.protocol import Price

log = logging.getLogger(__name__)

READY_CALL_TIMEOUT_S = 5.0  # one /ready answers within this, whatever the replica does

ANTHROPIC_PATHS = ("/v1/messages",)  # their errors in Anthropic's shape
fastapi_app = FastAPI(title="Switchyard", docs_url=None, redoc_url=None, openapi_url=None)
# Whatever escapes a handler: one logged, OpenAI-shaped 500 (app.api.errors).
fastapi_app.add_middleware(LastResort)


def _dialect(request: Request) -> Dialect:
    """Anthropic's error shape on its paths, whatever route prefix serves the app (the
    path includes the prefix, ``root_path``)."""
    path = request.url.path.removeprefix(request.scope.get("root_path", "") or "")
    return "anthropic" if path.startswith(ANTHROPIC_PATHS) else "openai"


@fastapi_app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    path = request.url.path
    return http_error(exc, path).response(_dialect(request))


@fastapi_app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    err = map_exception(exc, incoming_request_id(request.scope))
    return err.response(_dialect(request))


@dataclass(frozen=True)
class IngressOptions:
    max_body_bytes: int = 8 * 1024 * 1024
    ready_timeout_s: float = 60.0
    route_refresh_s: float = 5.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    graceful_shutdown_timeout_s: float = 30.0
    log_level: str = "INFO"
    # Served models adapters may extend (``app.adapters.registry``).
    adapter_bases: dict[str, AdapterBase] = field(default_factory=dict)
    adapter_s3: S3Defaults = field(default_factory=S3Defaults)
    # Decode deployments that hand long prefills to a prefill deployment (app.disagg).
    disaggregated: dict[str, DisaggregatedPool] = field(default_factory=dict)
    # Ingress replicas of the application: with more than one, /metrics merges theirs
    # through the metrics board (app.observability.board); with one, it needs none.
    ingress_replicas: int = 1


fastapi_app.include_router(admin_router)


def _price(table: RouteTable, model: str) -> Price:
    profile = table.profile(model)
    return profile.price() if profile is not None else Price()


def fair_queues(
    args: FairnessArgs, ingress_replicas: int, metrics: GatewayMetrics
) -> FairQueues | None:
    """The saturated models' turns on this replica (each queue's depth a gauge), or
    None where fairness is off."""
    if not args.enabled:
        return None

    def watch(pool: str, queue: PoolQueue) -> None:
        for band in BANDS:
            metrics.watch_queue(pool, band, functools.partial(queue.waiting, band))
        queue.engines.on_count = metrics.watch_engine_caps(pool)
        metrics.watch_slots(pool, queue.slots())

    settings = QueueSettings(**args.model_dump(exclude={"enabled"}))
    return FairQueues(settings, ingress_replicas, on_new=watch)


def _in_serve() -> bool:
    try:
        serve.get_replica_context()
    except Exception:  # outside Ray Serve (tools, tests)
        return False
    return True


def _app_name() -> str:
    return str(serve.get_replica_context().app_name)


def _replica_id() -> str:
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside Ray Serve (tools, tests)
        return f"local-{uuid.uuid4().hex[:8]}"


@serve.ingress(fastapi_app)
class OpenAiIngress:
    """Deployment class; ``app.builders`` wraps it with ``serve.deployment``."""

    async def __init__(  # type: ignore[misc]
        self,
        router: Any,
        servers: dict[str, Any],
        table: RouteTable,
        options: IngressOptions,
        gateway: GatewayConfig,
    ) -> None:
        """Ray Serve awaits this constructor: the first route snapshot comes from the
        router (which read the routes file on its node), not from the builder's
        ``table``, before the replica takes traffic."""
        bind_replica_grpc_to_loopback()
        logs.configure(options.log_level)
        if _in_serve():
            check_in_ray(gateway.state_url)  # SQLite on one node only
        self._routes = RouteSnapshot(router, table, options.route_refresh_s)
        await self._routes.refresh(strict=True)
        self._servers = servers
        self._options = options
        replica = _replica_id()
        self._metrics = GatewayMetrics(
            (r.model for r in self._routes.table.models()),
            tenants=gateway.args.metrics_tenants,
            replica=replica,
            enabled=gateway.args.metrics_enabled,
        )
        several = options.ingress_replicas > 1 and _in_serve()
        self._board = BoardClient(_app_name(), self._metrics) if several else None
        self._metrics_engines = gateway.args.metrics_include_engines and _in_serve()
        self._metrics_access = MetricsAccess(gateway.args.public_metrics, gateway.admin_token)
        self._gatekeeper = Gatekeeper(gateway, self._metrics, replica=replica)
        self._pools = Pools(
            servers, count_tokens=self._counter, disaggregated=options.disaggregated
        )
        t = gateway.args.tracing
        self._tracer = Tracer(t.otlp_endpoint, t.service_name, t.sample_ratio, t.export_delay_ms)
        calls = Calls(self._gatekeeper, self._metrics, self._tracer)
        self._sessions = SessionBook(
            self._gatekeeper.store,
            gateway.args.sessions,
            self._metrics,
            cancel_calls=calls.cancel_session,
            has_session_calls=calls.has_session_calls,
            store_timeout_s=gateway.args.store_timeout_s,
            fail_open=gateway.args.on_store_failure == "fail_open",
        )
        self._session_routes = SessionRoutes(self._gatekeeper, self._sessions, self._metrics)
        book = ResponseBook(self._gatekeeper.store, gateway.args.responses,
                            gateway.args.store_timeout_s)  # fmt: skip
        self._response_routes = ResponseRoutes(self._gatekeeper, book, self._metrics)
        self._adapters = AdapterRegistry(
            self._gatekeeper.store, options.adapter_bases, s3=options.adapter_s3
        )
        self._generation = GenerationFlow(
            self._routes,
            self._pools,
            self._gatekeeper,
            self._metrics,
            options.max_body_bytes,
            options.limits,
            calls,
            self._sessions,
            self._adapters,
            fair_queues(gateway.args.fairness, options.ingress_replicas, self._metrics),
            book,
        )
        self._embeddings = EmbeddingFlow(
            self._routes,
            self._pools,
            self._gatekeeper,
            self._metrics,
            options.max_body_bytes,
            options.limits,
            calls,
            self._sessions,
        )
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None:
            self._sessions.start()
            if self._board is not None:
                self._board.start()
        if not on_drain(self._drain_started):
            log.warning("Ray's stop signal is not observable: long streams may be cut at kill")
        configured = gateway.admin_token is not None
        self.admin_access = AdminAccess(
            AdminService(self._gatekeeper.store, sessions=self._sessions, adapters=self._adapters)
            if configured
            else None,
            gateway.admin_token,
        )

    # ---- helpers -------------------------------------------------------------------

    def _counter(self, model: str | None) -> Callable[[str], int] | None:
        """Token counting for an upstream pool that borrows a local model's tokenizer."""
        tokenizer = self._gatekeeper.tokenizer(model) if model else None
        return None if tokenizer is None else (lambda text: len(tokenizer.tokenize(text)))

    async def _decide(self, model: str) -> tuple[RouteDecision, str]:
        """Decision and LLMServer deployment for endpoints served only by local pools."""
        decision = await self._routes.decide(RouteRequest(model=model))
        if decision is None:
            raise model_not_found(model)
        deployment = self._routes.table.deployment(decision.pool)
        if deployment is None:
            raise ApiError(400, f"`{model}` is not served by a local pool.", param="model")
        return decision, deployment

    def _count(self, model: str, endpoint: str, status: int) -> None:
        self._metrics.requests.labels(model, endpoint, str(status)).inc()

    # ---- generation ----------------------------------------------------------------

    @fastapi_app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._generation.handle(request, "chat")

    @fastapi_app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._generation.handle(request, "completion")

    # ---- OpenAI Responses ----------------------------------------------------------

    @fastapi_app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        return await self._generation.handle(request, "responses")

    @fastapi_app.get("/v1/responses/{response_id}")
    async def response(self, response_id: str, request: Request) -> Response:
        return await self._response_routes.show(request, response_id)

    @fastapi_app.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(self, response_id: str, request: Request) -> Response:
        return await self._response_routes.input_items(request, response_id)

    @fastapi_app.delete("/v1/responses/{response_id}")
    async def delete_response(self, response_id: str, request: Request) -> Response:
        return await self._response_routes.delete(request, response_id)

    # ---- Anthropic Messages --------------------------------------------------------

    @fastapi_app.post("/v1/messages")
    async def messages(self, request: Request) -> Response:
        return await self._generation.handle(request, "messages")

    @fastapi_app.post("/v1/messages/count_tokens")
    async def count_tokens(self, request: Request) -> Response:
        return await count_tokens(
            request, self._gatekeeper, self._routes, self._options.max_body_bytes
        )

    # ---- embeddings ----------------------------------------------------------------

    @fastapi_app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        return await self._embeddings.handle(request)

    # ---- agent sessions ------------------------------------------------------------

    @fastapi_app.get("/v1/sessions/{session_id}")
    async def session(self, session_id: str, request: Request) -> Response:
        return await self._session_routes.show(request, session_id)

    @fastapi_app.post("/v1/sessions/{session_id}/cancel")
    async def cancel_session(self, session_id: str, request: Request) -> Response:
        return await self._session_routes.cancel(request, session_id)

    # ---- discovery and operations --------------------------------------------------

    @fastapi_app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        try:
            caller, _ = await self._gatekeeper.identify(request.headers)
            adapters = await self._adapters.visible(caller.tenant)
        except Exception as exc:
            reason = rejection_reason(exc)
            if reason is not None:
                self._metrics.rejections.labels(reason).inc()
            return map_exception(exc, incoming_request_id(request.scope)).response()
        data: list[dict[str, object]] = [
            {
                "id": r.model,
                "object": "model",
                "created": 0,
                "owned_by": "switchyard",
                "max_model_len": r.max_model_len,
                "task": r.task,
                **({"profile": {"name": r.profile, "slo": dict(r.slo)}} if r.profile else {}),
            }
            for r in self._routes.table.models()
        ]
        data += [
            {"id": a.id, "object": "model", "created": int(a.created_at),
             "owned_by": a.tenant or "switchyard", "parent": a.base}
            for a in adapters
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    @fastapi_app.get("/openapi.json")
    async def openapi(self) -> Response:
        """The API as served (request and response schemas, errors included)."""
        return JSONResponse(openapi_document())

    @fastapi_app.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @fastapi_app.get("/ready")
    async def ready(self) -> Response:
        """200 while the default model's deployment has a live, warm replica (asked on
        every call, so readiness follows replica deaths and restarts), else 503."""
        model = self._routes.table.default_model()
        if self._generation.draining:
            return shutting_down().response()
        if model is not None:
            try:
                _, deployment = await self._decide(model)
                timeout = min(self._options.ready_timeout_s, READY_CALL_TIMEOUT_S)
                await asyncio.wait_for(self._servers[deployment].ready.remote(), timeout)
            except Exception as exc:
                log.info("not ready: %r", exc)
                err = ApiError(
                    503,
                    "The default model has no live replica yet.",
                    type="server_error",
                    code="not_ready",
                    headers={"Retry-After": "5"},
                )
                return err.response()
        return JSONResponse({"status": "ready", "model": model})

    # ---- shutdown ------------------------------------------------------------------

    def _drain_started(self) -> None:
        """Ray began stopping this replica (``app.api.drain_signal``; maybe another
        thread): the grace period starts now, on the loop the requests run on."""
        loop = self._generation.loop or self._loop
        if loop is None or loop.is_closed():  # never served: __del__ has nothing to cut
            return
        grace = self._options.graceful_shutdown_timeout_s
        in_flight = self._generation.in_flight
        log.info("stop signal: %d requests in flight, %.0f s grace", in_flight, grace)
        loop.call_soon_threadsafe(self._generation.begin_shutdown, grace)

    async def __del__(self) -> None:
        """Ray Serve awaits this when the replica stops (rolling update, downscale,
        ``serve shutdown``): drain, settle everything, close pools and the store."""
        generation = getattr(self, "_generation", None)
        if generation is None:  # the constructor did not finish
            return
        grace = self._options.graceful_shutdown_timeout_s
        log.info("shutting down: %d requests in flight, %.0f s grace", generation.in_flight, grace)
        await generation.shutdown(grace)
        await self._sessions.stop()
        await self._pools.aclose()
        await self._gatekeeper.close()
        if self._board is not None:
            self._board.stop()
        self._tracer.shutdown()  # sends the spans still batched
        log.info("shut down: every admitted request is settled")

    @fastapi_app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        others = await self._board.others() if self._board is not None else []
        engines = await node_engine_families() if self._metrics_engines else b""
        return metrics_response(
            self._metrics, self._metrics_access, request.headers, others, engines
        )
