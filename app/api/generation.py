"""Chat and legacy completions through layers 1 and 3, one request at a time:

authenticate → parse → route (model, pool, fallbacks) → count prompt tokens (when a
budget or token bucket needs them) → admit → dispatch with bounded fallbacks → stream
or collect → settle.

Every admitted request is settled exactly once — on completion, on an engine error
and when the client leaves — and the settlement writes its ledger record with the
pool that answered and the attempts made. When a budget caps the completion, the
engine gets the allowance as ``max_tokens`` so it cannot overshoot, and the last choice
says ``stop_reason: "budget_exhausted"``. Every response carries ``x-switchyard-route``
and every decision is logged as one JSON line, so it can be reproduced from the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.api.body import parse_body
from app.api.errors import ApiError, model_not_found, rejection_reason, shutting_down
from app.api.errors import map_exception as _map
from app.api.openai_format import DONE, ResponseHeader, sse
from app.api.prompt import estimate_tokens, prompt_ids, prompt_text, upper_bound_tokens
from app.api.protocol import ChatCompletionRequest, CompletionRequest
from app.api.request_id import client_request_id, incoming_request_id
from app.api.streaming import SettledStream
from app.api.tally import Tally
from app.config import RequestLimits
from app.dispatch.fallback import Dispatched, dispatch
from app.dispatch.pools import Pools
from app.engine.protocol import GenerationDelta
from app.gateway.admission import Admission, Outcome
from app.gateway.layer import Layer1
from app.observability.metrics import GatewayMetrics
from app.routing.live import LiveLatency
from app.routing.snapshot import RouteSnapshot
from app.routing.table import NoRouteFits, RouteDecision, RouteRequest
from app.serving.llm_server import GeneratePayload, output_limit
from app.state.protocol import Price
from app.state.records import LedgerStatus

log = logging.getLogger("switchyard.route")

Kind = Literal["chat", "completion"]
BUDGET_STOP = "budget_exhausted"
SESSION_HEADER = "x-session-id"
QUALITY_HEADER = "x-switchyard-quality-floor"


@dataclass(eq=False)
class _Call:
    """One request's state while it streams."""

    kind: Kind
    label: str
    tally: Tally
    admission: Admission | None = None
    decision: RouteDecision | None = None
    sent: Dispatched = field(default_factory=Dispatched)
    ended: bool = False  # metrics and settlement happened
    streaming: bool = False  # the response generator started
    shutdown: bool = False  # ended by the replica's shutdown

    @property
    def stream(self) -> Any:
        return self.sent.stream

    def route_header(self) -> dict[str, str]:
        d = self.decision
        if d is None:
            return {}
        parts = [f"model={d.model}", f"pool={self.sent.pool or d.pool}", f"step={d.step}"]
        if self.sent.failures:
            parts[2] = "step=fallback"
            parts.append(f"first={d.step}")
        if d.via:
            parts.append(f"via={d.via}")
        if d.request_class:
            parts.append(f"class={d.request_class}")
        parts.append(f"attempts={max(1, self.sent.attempts)}")
        return {"x-switchyard-route": "; ".join(parts)}


class GenerationFlow:
    def __init__(
        self,
        routes: RouteSnapshot,
        pools: Pools,
        layer1: Layer1,
        metrics: GatewayMetrics,
        max_body_bytes: int,
        limits: RequestLimits | None = None,
    ) -> None:
        self._routes = routes
        self._pools = pools
        self._layer1 = layer1
        self._metrics = metrics
        self._max_body = max_body_bytes
        self._limits = limits or RequestLimits()
        self.live = LiveLatency()
        self._calls: set[_Call] = set()  # admitted and not ended (for the shutdown drain)
        self._draining = False
        self._cut: asyncio.Task[None] | None = None  # ends what runs past the grace
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop requests run on

    # ---- shutdown --------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def begin_shutdown(self, grace_s: float) -> None:
        """Refuse new requests (503) from now on, and end the requests still in flight
        ``grace_s`` from now with an error (billing what they produced). Only the first
        call counts: Ray's drain signal calls it first, ``shutdown`` (``__del__``) again."""
        if self._cut is None:
            self._draining = True
            self._cut = asyncio.get_running_loop().create_task(self._cut_after(grace_s))

    async def shutdown(self, grace_s: float) -> None:
        """``begin_shutdown``, then wait until every request is ended and every
        settlement is written."""
        self.begin_shutdown(grace_s)
        assert self._cut is not None
        await asyncio.shield(self._cut)
        await self._layer1.gate.drain()

    async def _cut_after(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for call in list(self._calls):
            call.shutdown = True
            if call.stream is not None:
                call.stream.cancel()
        deadline = time.monotonic() + 5.0
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for call in list(self._calls):  # never picked up again: settle as they stand
            self._end(call, "error", 503)

    # ---- accounting ------------------------------------------------------------------

    def _count(self, label: str, endpoint: str, status: int) -> None:
        self._metrics.requests.labels(label, endpoint, str(status)).inc()

    def _end(self, call: _Call, status: LedgerStatus, http_status: int) -> None:
        """Metrics and settlement, once per request (later calls change nothing)."""
        if call.ended:
            return
        call.ended = True
        self._calls.discard(call)
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
        d = call.decision
        ttft = None if t.first_at is None else t.first_at - t.started
        if d is not None and call.sent.first is not None and call.sent.pool is not None:
            self.live.observe(call.sent.pool, ttft, t.itls)
        if call.admission is not None:
            outcome = Outcome(
                endpoint=call.kind,
                status=status,
                http_status=http_status,
                model_served=d.model if d else None,
                pool=call.sent.pool or (d.pool if d else None),
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
                cached_tokens=t.cached_tokens,
                ttft_s=ttft,
                route_step=self._step(call),
                attempts=call.sent.attempts,
            )
            self._layer1.gate.settle(call.admission, outcome)

    @staticmethod
    def _step(call: _Call) -> str | None:
        if call.decision is None:
            return None
        return "fallback" if call.sent.failures else call.decision.step

    def _explain(self, rid: str, call: _Call, tenant: str | None) -> None:
        """Count the decision and log it as one JSON line (reproducible routing)."""
        d = call.decision
        if d is None:
            return
        pool = call.sent.pool or d.pool
        self._metrics.decisions.labels(call.label, pool, self._step(call) or "none").inc()
        line: dict[str, Any] = {
            "request_id": rid,
            "tenant": tenant,
            "requested": d.requested,
            "model": d.model,
            "pool": pool,
            "step": d.step,
            "via": d.via,
            "class": d.request_class,
            "fallbacks": list(d.fallbacks),
            "attempts": call.sent.attempts,
            "failures": call.sent.failures,
        }
        if d.policy is not None:
            line["policy"] = {"scores": d.policy.scores, "dropped": d.policy.dropped}
        log.info("route %s", json.dumps(line, separators=(",", ":")))

    def _stop_reason(self, call: _Call) -> str | None:
        a = call.admission
        if a is not None and a.capped and call.tally.finish_reason == "length":
            return BUDGET_STOP
        return None

    # ---- the request -----------------------------------------------------------------

    async def handle(self, request: Request, kind: Kind) -> Response:
        self.loop = asyncio.get_running_loop()
        call = _Call(kind, self._metrics.model_label(None), Tally(time.perf_counter()))
        rid = incoming_request_id(request.scope)
        prompt_param = "messages" if kind == "chat" else "prompt"
        tenant = None
        try:
            if self._draining:
                raise shutting_down()
            caller, principal = await self._layer1.identify(request.headers)
            tenant = caller.tenant
            schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
            req = await parse_body(request, schema, self._max_body)
            if kind == "chat":
                prompt: dict[str, Any] = {
                    "messages": tuple({"role": m.role, "content": m.text()} for m in req.messages)
                }
            else:
                prompt = req.prompt_fields()
            text = prompt_text(prompt)
            self._check_limits(prompt, text, prompt_param)
            route_request = RouteRequest(
                model=req.model,
                tenant=caller.tenant,
                max_tokens=req.requested_max_tokens(),
                prompt_tokens=estimate_tokens(prompt, text),
                prompt_text=text,
                quality_floor=_quality_floor(request.headers.get(QUALITY_HEADER)),
            )
            try:
                decision = await self._routes.decide(route_request, live=self.live.p95_ms)
            except NoRouteFits as exc:
                raise ApiError(400, str(exc), param="model", code="no_route_fits") from None
            if decision is None:
                raise model_not_found(req.model)
            table = self._routes.table  # after decide: it may have refreshed the snapshot
            call.decision = decision
            call.label = self._metrics.model_label(decision.model)
            plan = self._layer1.plan(caller, principal)
            counted = table.pool_model(decision.pool)
            window = table.max_model_len(decision.model)
            # One rule for the context window: whenever the prompt can be counted here
            # (a local tokenizer), it is checked before admission, budgets or not.
            tokenizer = self._layer1.tokenizer(counted) if counted else None
            ids: tuple[int, ...] | None = None
            prompt_tokens = 0
            if tokenizer is not None:
                ids = await prompt_ids(tokenizer, prompt)
                prompt_tokens = len(ids)
                output_limit(prompt_tokens, req.requested_max_tokens(), window)
            elif plan.needs_prompt_tokens:  # an upstream without a local tokenizer
                prompt_tokens = upper_bound_tokens(prompt, text)
                output_limit(prompt_tokens, req.requested_max_tokens(), window)
            if not plan.needs_prompt_tokens:
                prompt_tokens = 0  # nothing to reserve: the engine reports the real count
            profile = table.profile(decision.model)
            price = profile.price() if profile is not None else Price()
            call.admission = await self._layer1.gate.admit(
                caller,
                plan,
                model=req.model,
                prompt_tokens=prompt_tokens,
                requested_max_tokens=req.requested_max_tokens(),
                context_left=max(0, window - (len(ids) if ids is not None else prompt_tokens)),
                price=price,
                session_id=request.headers.get(SESSION_HEADER),
                request_id=rid,
                client_request_id=client_request_id(request.scope),
                endpoint=kind,
                counted_prompt_tokens=len(ids) if ids is not None else None,
            )
            self._calls.add(call)
            base = GeneratePayload(
                request_id=rid,
                max_tokens=call.admission.max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
                stop=req.stop_list(),
                ignore_eos=req.ignore_eos,
                **prompt,
            )

            def payload_for(pool: str) -> GeneratePayload:
                # The engine's request id: the gateway id and the attempt number.
                attempt = replace(base, request_id=f"{rid}-{call.sent.attempts}")
                if ids is not None and table.deployment(pool) and table.pool_model(pool) == counted:
                    return replace(attempt, messages=None, prompt_text=None, prompt_token_ids=ids)
                return attempt

            await dispatch(
                self._pools, table, decision, payload_for, prompt_tokens, self._metrics, call.sent
            )
            first = call.sent.first
            assert first is not None
        except asyncio.CancelledError:
            # Ray Serve cancels the handler when the client disconnects.
            if call.stream is not None:
                call.stream.cancel()
            self._end(call, "client_closed", 499)
            self._explain(rid, call, tenant)
            raise
        except BaseException as exc:
            err = shutting_down() if call.shutdown else _map(exc, rid, prompt_param)
            reason = rejection_reason(exc)
            if reason is not None:
                self._metrics.rejections.labels(reason).inc()
            self._end(call, "rejected_by_engine" if call.sent.attempts else "error", err.status)
            self._explain(rid, call, tenant)
            if call.admission is not None:
                err.headers.update(call.admission.headers())
            err.headers.update(call.route_header())
            return err.response()

        self._explain(rid, call, tenant)
        assert call.admission is not None
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        header = ResponseHeader(kind, f"{prefix}-{rid}", int(time.time()), decision.model)
        headers = {**call.admission.headers(), **call.route_header()}
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            events = self._events(header, first, call, include_usage=usage)
            return SettledStream(
                events,
                on_close=lambda: self._never_streamed(call),
                media_type="text/event-stream",
                headers=headers,
            )
        return await self._collect(header, first, call, headers)

    def _check_limits(self, prompt: dict[str, Any], text: str, param: str) -> None:
        limits = self._limits
        messages = prompt.get("messages")
        if messages is not None and len(messages) > limits.max_messages:
            raise ApiError(
                400,
                f"At most {limits.max_messages} messages per request.",
                param="messages",
                code="too_many_messages",
            )
        if len(text) > limits.max_prompt_bytes or len(text.encode()) > limits.max_prompt_bytes:
            raise ApiError(
                400,
                f"The prompt exceeds {limits.max_prompt_bytes} bytes.",
                param=param,
                code="prompt_too_large",
            )

    def _never_streamed(self, call: _Call) -> None:
        """The client left after admission, before the response generator ran."""
        if call.stream is not None:
            call.stream.cancel()
        self._end(call, "client_closed", 499)

    async def _deltas(self, first: GenerationDelta, stream: Any) -> AsyncIterator[GenerationDelta]:
        delta = first
        while True:
            yield delta
            if delta.finish_reason is not None:
                return
            delta = await stream.__anext__()

    def _ended_by(self, call: _Call, exc: BaseException, rid: str) -> ApiError:
        return shutting_down() if call.shutdown else _map(exc, rid)

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
            err = self._ended_by(call, exc, header.id)
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
        call.streaming = True
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
            err = self._ended_by(call, exc, header.id)
            status = ("error", err.status)
            yield err.sse()
            yield DONE
        finally:
            if status[1] == 499:  # the client went away: stop the engine's work
                call.stream.cancel()
            self._end(call, *status)


def _quality_floor(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        floor = float(value)
    except ValueError:
        floor = -1.0
    if not 0.0 <= floor <= 1.0:
        raise ApiError(
            400, f"`{QUALITY_HEADER}` must be a number from 0 to 1.", param=QUALITY_HEADER
        )
    return floor
