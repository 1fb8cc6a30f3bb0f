"""Chat and legacy completions through layer 1, one request at a time:

authenticate → parse → route → (count prompt tokens) → admit (rate limits, budget
reservation) → dispatch to the LLMServer replica → stream or collect → settle.

Every admitted request is settled exactly once — on completion, on an engine error
and when the client leaves — and the settlement writes its ledger record. When a
budget caps the completion, the engine gets the allowance as ``max_tokens`` so it
cannot overshoot, and the last choice says ``stop_reason: "budget_exhausted"``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from app.api.errors import (
    ApiError,
    body_too_large,
    from_validation_error,
    invalid_json,
    model_not_found,
)
from app.api.errors import map_exception as _map
from app.api.metrics import GatewayMetrics
from app.api.middleware import BodyTooLarge, incoming_request_id, read_body
from app.api.openai_format import DONE, ResponseHeader, Usage, sse
from app.api.protocol import ChatCompletionRequest, CompletionRequest
from app.engine.protocol import GenerationDelta
from app.gateway.admission import Admission, Outcome, Refused
from app.gateway.auth import AuthError
from app.gateway.layer import Layer1
from app.routing.snapshot import RouteSnapshot
from app.routing.table import RouteDecision
from app.serving.llm_server import GeneratePayload, output_limit
from app.state.protocol import StoreUnavailable
from app.state.records import LedgerStatus

Kind = Literal["chat", "completion"]
BUDGET_STOP = "budget_exhausted"
SESSION_HEADER = "x-session-id"


async def parse_body(request: Request, schema: type[BaseModel], max_bytes: int) -> Any:
    try:
        raw = await read_body(request, max_bytes)
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


def rejection_reason(exc: BaseException) -> str | None:
    """The ``switchyard_rejections`` reason for a layer-1 refusal, else None."""
    if isinstance(exc, AuthError):
        return "auth" if exc.status == 401 else "forbidden"
    if isinstance(exc, Refused):
        return {"requests": "rate", "tokens": "rate"}.get(exc.reason, exc.reason)
    if isinstance(exc, StoreUnavailable):
        return "store"
    return None


@dataclass
class Tally:
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


@dataclass
class _Call:
    """One request's state while it streams."""

    kind: Kind
    label: str
    tally: Tally
    admission: Admission | None = None
    decision: RouteDecision | None = None
    stream: Any = None


class GenerationFlow:
    def __init__(
        self,
        routes: RouteSnapshot,
        servers: dict[str, Any],
        layer1: Layer1,
        metrics: GatewayMetrics,
        max_body_bytes: int,
    ) -> None:
        self._routes = routes
        self._servers = servers
        self._layer1 = layer1
        self._metrics = metrics
        self._max_body = max_body_bytes

    # ---- accounting ------------------------------------------------------------------

    def _count(self, label: str, endpoint: str, status: int) -> None:
        self._metrics.requests.labels(label, endpoint, str(status)).inc()

    def _end(self, call: _Call, status: LedgerStatus, http_status: int) -> None:
        """Metrics and settlement, once per request."""
        m, t = self._metrics, call.tally
        self._count(call.label, call.kind, http_status)
        m.e2e.labels(call.label, call.kind).observe(time.perf_counter() - t.started)
        if t.first_at is not None:
            m.ttft.labels(call.label).observe(t.first_at - t.started)
        for gap in t.itls:
            m.itl.labels(call.label).observe(gap)
        m.prompt_tokens.labels(call.label).inc(t.prompt_tokens)
        m.completion_tokens.labels(call.label).inc(t.completion_tokens)
        if http_status == 499:
            m.aborts.labels(call.label).inc()
        if call.admission is not None:
            d = call.decision
            outcome = Outcome(
                endpoint=call.kind,
                status=status,
                http_status=http_status,
                model_served=d.model if d else None,
                pool=d.pool if d else None,
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
                cached_tokens=t.cached_tokens,
                ttft_s=None if t.first_at is None else t.first_at - t.started,
            )
            self._layer1.gate.settle(call.admission, outcome)

    def _stop_reason(self, call: _Call) -> str | None:
        a = call.admission
        if a is not None and a.capped and call.tally.finish_reason == "length":
            return BUDGET_STOP
        return None

    # ---- the request -----------------------------------------------------------------

    async def handle(self, request: Request, kind: Kind) -> Response:
        call = _Call(kind, self._metrics.model_label(None), Tally(time.perf_counter()))
        rid = incoming_request_id(request.scope)
        prompt_param = "messages" if kind == "chat" else "prompt"
        try:
            caller, principal = await self._layer1.identify(request.headers)
            schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
            req = await parse_body(request, schema, self._max_body)
            decision = await self._routes.decide(req.model)
            if decision is None:
                raise model_not_found(req.model)
            call.decision = decision
            call.label = self._metrics.model_label(decision.model)
            if kind == "chat":
                prompt: dict[str, Any] = {
                    "messages": tuple({"role": m.role, "content": m.text()} for m in req.messages)
                }
            else:
                prompt = req.prompt_fields()
            plan = self._layer1.plan(caller, principal)
            route = self._routes.table.routes.get(decision.model)
            window = route.max_model_len if route is not None else 0
            prompt_tokens = 0
            tokenizer = self._layer1.tokenizer(decision.model)
            if plan.needs_prompt_tokens and tokenizer is not None:
                ids = self._prompt_ids(tokenizer, prompt)
                prompt_tokens = len(ids)
                output_limit(prompt_tokens, req.requested_max_tokens(), window)
                prompt = {"prompt_token_ids": tuple(ids)}
            call.admission = await self._layer1.gate.admit(
                caller,
                plan,
                model=req.model,
                prompt_tokens=prompt_tokens,
                requested_max_tokens=req.requested_max_tokens(),
                context_left=max(0, window - prompt_tokens),
                price=self._layer1.price(decision.model),
                session_id=request.headers.get(SESSION_HEADER),
            )
            payload = GeneratePayload(
                request_id=f"{rid}-{uuid.uuid4().hex[:8]}",
                max_tokens=call.admission.max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
                stop=req.stop_list(),
                ignore_eos=req.ignore_eos,
                **prompt,
            )
            handle = self._servers[decision.pool].options(stream=True)
            call.stream = handle.generate.remote(payload)
            first = await call.stream.__anext__()
        except asyncio.CancelledError:
            # Ray Serve cancels the handler when the client disconnects.
            if call.stream is not None:
                call.stream.cancel()
            self._end(call, "client_closed", 499)
            raise
        except BaseException as exc:
            err = _map(exc, rid, prompt_param)
            reason = rejection_reason(exc)
            if reason is not None:
                self._metrics.rejections.labels(reason).inc()
            self._end(call, "rejected_by_engine" if call.stream else "error", err.status)
            if call.admission is not None:
                err.headers.update(call.admission.headers())
            return err.response()

        assert call.admission is not None
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        header = ResponseHeader(kind, f"{prefix}-{rid}", int(time.time()), decision.model)
        headers = call.admission.headers()
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            events = self._events(header, first, call, include_usage=usage)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return await self._collect(header, first, call, headers)

    @staticmethod
    def _prompt_ids(tokenizer: Any, prompt: dict[str, Any]) -> list[int]:
        if "messages" in prompt:
            return list(tokenizer.apply_chat_template(prompt["messages"]))
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        return list(tokenizer.tokenize(prompt["prompt_text"]))

    async def _deltas(self, first: GenerationDelta, stream: Any) -> AsyncIterator[GenerationDelta]:
        delta = first
        while True:
            yield delta
            if delta.finish_reason is not None:
                return
            delta = await stream.__anext__()

    async def _collect(
        self, header: ResponseHeader, first: GenerationDelta, call: _Call, headers: dict[str, str]
    ) -> Response:
        try:
            async for delta in self._deltas(first, call.stream):
                call.tally.add(delta)
        except asyncio.CancelledError:
            call.stream.cancel()
            self._end(call, "client_closed", 499)
            raise
        except Exception as exc:
            err = _map(exc, header.id)
            self._end(call, "error", err.status)
            return err.response()
        self._end(call, "ok", 200)
        t = call.tally
        body = header.response(
            "".join(t.parts),
            t.finish_reason or "stop",
            t.usage(),
            stop_reason=self._stop_reason(call),
        )
        return JSONResponse(body, headers=headers)

    async def _events(
        self, header: ResponseHeader, first: GenerationDelta, call: _Call, *, include_usage: bool
    ) -> AsyncIterator[str]:
        status: tuple[LedgerStatus, int] = ("client_closed", 499)
        try:
            if header.kind == "chat":
                yield sse(header.chunk("", role=True))
            async for delta in self._deltas(first, call.stream):
                call.tally.add(delta)
                if delta.text or delta.finish_reason is not None:
                    stop = self._stop_reason(call) if delta.finish_reason else None
                    yield sse(
                        header.chunk(delta.text or None, delta.finish_reason, stop_reason=stop)
                    )
            if include_usage:
                yield sse(header.usage_chunk(call.tally.usage()))
            yield DONE
            status = ("ok", 200)
        except Exception as exc:
            err = _map(exc, header.id)
            status = ("error", err.status)
            yield err.sse()
            yield DONE
        finally:
            if status[1] == 499:  # the client went away: stop the engine's work
                call.stream.cancel()
            self._end(call, *status)
