"""OpenAiIngress: the gateway deployment (layer 1 of the design card).

Request path: parse and validate → decide the pool from the route snapshot (no hop)
→ stream from the LLMServer replica (the one hop tokens take) → OpenAI shapes out.
Later issues slot authentication, tenants, rate limits, budgets and the ledger in
before the dispatch step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.errors import (
    ApiError,
    body_too_large,
    from_validation_error,
    invalid_json,
    map_exception,
    model_not_found,
)
from app.api.metrics import GatewayMetrics
from app.api.middleware import BodyTooLarge, incoming_request_id, read_body
from app.api.openai_format import DONE, ResponseHeader, Usage, encode_embedding, sse
from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.engine.protocol import GenerationDelta
from app.routing.snapshot import RouteSnapshot
from app.routing.table import RouteDecision, RouteTable
from app.serving.llm_server import GeneratePayload

log = logging.getLogger(__name__)

fastapi_app = FastAPI(title="Switchyard", docs_url=None, redoc_url=None, openapi_url=None)


def _rid(request: Request) -> str:
    return incoming_request_id(request.scope)


@fastapi_app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"No route for {request.url.path}.", 405: "Method not allowed."}.get(
        exc.status_code, str(exc.detail)
    )
    headers = dict(exc.headers or {})
    return ApiError(exc.status_code, message, code=code, headers=headers).response()


@fastapi_app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return ApiError(400, str(exc.errors()[0].get("msg", "invalid request"))).response()


@dataclass(frozen=True)
class IngressOptions:
    max_body_bytes: int = 8 * 1024 * 1024
    default_model: str | None = None
    ready_timeout_s: float = 60.0
    route_refresh_s: float = 5.0


@dataclass
class _Tally:
    """What one generation produced, and when."""

    started: float
    first_at: float | None = None
    last_at: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    parts: list[str] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)

    def add(self, delta: GenerationDelta) -> None:
        now = time.perf_counter()
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_prompt_tokens)
        self.completion_tokens += delta.num_new_tokens
        if delta.text:
            if self.first_at is None:
                self.first_at = now
            elif self.last_at is not None:
                self.itls.append(now - self.last_at)
            self.last_at = now
            self.parts.append(delta.text)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


Kind = Literal["chat", "completion"]


@serve.ingress(fastapi_app)
class OpenAiIngress:
    """Deployment class; ``app.builders`` wraps it with ``serve.deployment``."""

    def __init__(
        self,
        router: Any,
        servers: dict[str, Any],
        table: RouteTable,
        options: IngressOptions,
    ) -> None:
        self._routes = RouteSnapshot(router, table, options.route_refresh_s)
        self._servers = servers
        self._options = options
        self._metrics = GatewayMetrics(r.model for r in table.models())
        self._ready = False

    # ---- helpers -------------------------------------------------------------------

    async def _parse(self, request: Request, schema: type[BaseModel]) -> Any:
        try:
            raw = await read_body(request, self._options.max_body_bytes)
        except BodyTooLarge as exc:
            raise body_too_large(exc.limit) from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise invalid_json(str(exc)) from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
        try:
            return schema.model_validate(data)
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    async def _decide(self, model: str) -> RouteDecision:
        decision = await self._routes.decide(model)
        if decision is None:
            raise model_not_found(model)
        return decision

    def _count(self, model: str, endpoint: str, status: int) -> None:
        self._metrics.requests.labels(model, endpoint, str(status)).inc()

    def _finish(self, model: str, endpoint: str, status: int, tally: _Tally) -> None:
        m = self._metrics
        self._count(model, endpoint, status)
        m.e2e.labels(model, endpoint).observe(time.perf_counter() - tally.started)
        if tally.first_at is not None:
            m.ttft.labels(model).observe(tally.first_at - tally.started)
        for gap in tally.itls:
            m.itl.labels(model).observe(gap)
        m.prompt_tokens.labels(model).inc(tally.prompt_tokens)
        m.completion_tokens.labels(model).inc(tally.completion_tokens)

    def _client_left(self, stream: Any, label: str, kind: str) -> None:
        """The client left before the first token: stop the engine's work."""
        if stream is not None:
            stream.cancel()
        self._metrics.aborts.labels(label).inc()
        self._count(label, kind, 499)

    # ---- generation ----------------------------------------------------------------

    @fastapi_app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    @fastapi_app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def _generate(self, request: Request, kind: Kind) -> Response:
        tally = _Tally(started=time.perf_counter())
        rid = _rid(request)
        label = self._metrics.model_label(None)
        prompt_param = "messages" if kind == "chat" else "prompt"
        stream: Any = None
        try:
            if kind == "chat":
                chat = await self._parse(request, ChatCompletionRequest)
                req: ChatCompletionRequest | CompletionRequest = chat
                prompt: dict[str, Any] = {
                    "messages": tuple({"role": m.role, "content": m.text()} for m in chat.messages)
                }
            else:
                req = comp = await self._parse(request, CompletionRequest)
                prompt = comp.prompt_fields()
            decision = await self._decide(req.model)
            label = self._metrics.model_label(decision.model)
            payload = GeneratePayload(
                request_id=f"{rid}-{uuid.uuid4().hex[:8]}",
                max_tokens=req.requested_max_tokens(),
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
                stop=req.stop_list(),
                ignore_eos=req.ignore_eos,
                **prompt,
            )
            stream = self._servers[decision.pool].options(stream=True).generate.remote(payload)
            first = await stream.__anext__()
        except asyncio.CancelledError:
            # Ray Serve cancels the handler when the client disconnects.
            self._client_left(stream, label, kind)
            raise
        except BaseException as exc:
            err = map_exception(exc, rid, prompt_param)
            self._count(label, kind, err.status)
            return err.response()

        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        header = ResponseHeader(kind, f"{prefix}-{rid}", int(time.time()), decision.model)
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            events = self._events(header, first, stream, tally, label, include_usage=usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return await self._collect(header, first, stream, tally, label)

    async def _deltas(self, first: GenerationDelta, stream: Any) -> AsyncIterator[GenerationDelta]:
        delta = first
        while True:
            yield delta
            if delta.finish_reason is not None:
                return
            delta = await stream.__anext__()

    async def _collect(
        self, header: ResponseHeader, first: GenerationDelta, stream: Any, tally: _Tally, label: str
    ) -> Response:
        status = 499
        try:
            async for delta in self._deltas(first, stream):
                tally.add(delta)
            status = 200
        except asyncio.CancelledError:
            stream.cancel()
            self._metrics.aborts.labels(label).inc()
            raise
        except Exception as exc:
            err = map_exception(exc, header.id)
            status = err.status
            return err.response()
        finally:
            self._finish(label, header.kind, status, tally)
        body = header.response("".join(tally.parts), tally.finish_reason or "stop", tally.usage())
        return JSONResponse(body)

    async def _events(
        self,
        header: ResponseHeader,
        first: GenerationDelta,
        stream: Any,
        tally: _Tally,
        label: str,
        *,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        status = 499
        try:
            if header.kind == "chat":
                yield sse(header.chunk("", role=True))
            async for delta in self._deltas(first, stream):
                tally.add(delta)
                if delta.text or delta.finish_reason is not None:
                    yield sse(header.chunk(delta.text or None, delta.finish_reason))
            if include_usage:
                yield sse(header.usage_chunk(tally.usage()))
            yield DONE
            status = 200
        except Exception as exc:
            err = map_exception(exc, header.id)
            status = err.status
            yield err.sse()
            yield DONE
        finally:
            if status == 499:  # the client went away: stop the engine's work
                stream.cancel()
                self._metrics.aborts.labels(label).inc()
            self._finish(label, header.kind, status, tally)

    # ---- embeddings ----------------------------------------------------------------

    @fastapi_app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        started = time.perf_counter()
        rid = _rid(request)
        label = self._metrics.model_label(None)
        try:
            req = await self._parse(request, EmbeddingRequest)
            decision = await self._decide(req.model)
            label = self._metrics.model_label(decision.model)
            vectors, tokens = await self._servers[decision.pool].embed.remote(req.inputs())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            err = map_exception(exc, rid, "input")
            self._count(label, "embeddings", err.status)
            return err.response()
        self._count(label, "embeddings", 200)
        self._metrics.e2e.labels(label, "embeddings").observe(time.perf_counter() - started)
        self._metrics.prompt_tokens.labels(label).inc(tokens)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode_embedding(v, req.encoding_format),
            }
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse(
            {"object": "list", "data": data, "model": decision.model, "usage": usage}
        )

    # ---- discovery and operations --------------------------------------------------

    @fastapi_app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        data = [
            {
                "id": r.model,
                "object": "model",
                "created": 0,
                "owned_by": "switchyard",
                "max_model_len": r.max_model_len,
                "task": r.task,
            }
            for r in self._routes.table.models()
        ]
        return {"object": "list", "data": data}

    @fastapi_app.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @fastapi_app.get("/ready")
    async def ready(self) -> Response:
        model = self._options.default_model
        if not self._ready and model is not None:
            try:
                await asyncio.wait_for(self._probe(model), self._options.ready_timeout_s)
                self._ready = True
            except Exception as exc:
                log.info("readiness probe failed: %r", exc)
                err = ApiError(
                    503,
                    "The default model has not answered yet.",
                    type="server_error",
                    code="not_ready",
                    headers={"Retry-After": "5"},
                )
                return err.response()
        return JSONResponse({"status": "ready", "model": model})

    async def _probe(self, model: str) -> None:
        decision = await self._decide(model)
        payload = GeneratePayload(
            request_id=f"ready-{uuid.uuid4().hex}",
            prompt_text="Hello",
            max_tokens=1,
            temperature=0.0,
        )
        stream = self._servers[decision.pool].options(stream=True).generate.remote(payload)
        async for _ in stream:
            pass

    @fastapi_app.get("/metrics")
    async def metrics(self) -> Response:
        return Response(self._metrics.render(), media_type=self._metrics.content_type)
