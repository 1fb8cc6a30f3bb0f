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
A call of an agent session (``x-session-id``) is checked against its session first
(``app.sessions.book``: 409 once the session is cancelled), and a whole-session cancel
ends it with status ``cancelled`` wherever it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.adapters.registry import AdapterRegistry, adapter_price
from app.api.body import parse_body
from app.api.errors import ApiError, model_not_found, session_cancelled, shutting_down
from app.api.errors import map_exception as _map
from app.api.flow import Call, Calls
from app.api.openai_format import DONE, ResponseHeader, Usage, sse
from app.api.prompt import prompt_ids
from app.api.protocol import ChatCompletionRequest, CompletionRequest
from app.api.request_id import client_request_id, incoming_request_id
from app.api.streaming import SettledStream
from app.config import RequestLimits
from app.disagg.stream import PdStream
from app.dispatch.fallback import dispatch
from app.dispatch.pools import Pools, PoolStream
from app.engine.protocol import GenerationDelta
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest, Outcome, Prompt, TraceContext
from app.routing.classes import BATCH_TIERS, CLASS_HEADER
from app.routing.live import LiveLatency
from app.routing.snapshot import RouteSnapshot
from app.routing.table import RouteDecision
from app.serving.llm_server import output_limit
from app.sessions.book import SessionBook, SessionCancelled
from app.state.protocol import Price
from app.state.records import LedgerStatus

log = logging.getLogger(__name__)

Kind = Literal["chat", "completion"]
BUDGET_STOP = "budget_exhausted"
SESSION_HEADER = "x-session-id"
SESSION_SLO_HEADER = "x-switchyard-session-slo-ms"
QUALITY_HEADER = "x-switchyard-quality-floor"
TRACE_HEADER = "traceparent"  # W3C trace context (app.observability.tracing)


class GenerationFlow:
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
    ) -> None:
        self._routes = routes
        self._adapters = adapters
        self._pools = pools
        self._gatekeeper = gatekeeper
        self._metrics = metrics
        self._max_body = max_body_bytes
        self._limits = limits or RequestLimits()
        self.calls = calls or Calls(gatekeeper, metrics)
        self._sessions = sessions
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop requests run on

    # ---- shutdown (of every request in flight on this replica) -------------------------

    @property
    def draining(self) -> bool:
        return self.calls.draining

    @property
    def in_flight(self) -> int:
        return self.calls.in_flight

    @property
    def live(self) -> LiveLatency:
        return self.calls.live

    def begin_shutdown(self, grace_s: float) -> None:
        self.calls.begin_shutdown(grace_s)

    async def shutdown(self, grace_s: float) -> None:
        await self.calls.shutdown(grace_s)

    def _stop_reason(self, call: Call, finish_reason: str | None) -> str | None:
        a = call.admission
        if a is not None and a.capped and finish_reason == "length":
            return BUDGET_STOP
        return None

    # ---- the request -----------------------------------------------------------------

    async def handle(self, request: Request, kind: Kind) -> Response:
        self.loop = asyncio.get_running_loop()
        rid = incoming_request_id(request.scope)
        call = Call(rid, self._metrics.model_label(None), Outcome(kind))
        prompt_param = "messages" if kind == "chat" else "prompt"
        try:
            if self.calls.draining:
                raise shutting_down()
            caller, principal = await self._gatekeeper.identify(request.headers)
            call.outcome.mark("identified")
            call.tenant = caller.tenant
            schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
            body = await parse_body(request, schema, self._max_body)
            prompt = body.prompt() if isinstance(body, ChatCompletionRequest) else body.prompt_of()
            self._check_limits(prompt, prompt_param)
            req = InferenceRequest(
                id=rid,
                endpoint=kind,
                model=body.model,
                prompt=prompt,
                max_tokens=body.requested_max_tokens(),
                n=body.n,
                sampling=body.sampling(),
                stream=body.stream,
                batch=_batch(body.service_tier, request.headers.get(CLASS_HEADER)),
                include_usage=body.include_usage,
                caller=caller,
                session_id=request.headers.get(SESSION_HEADER),
                session_slo_ms=_session_slo(request.headers.get(SESSION_SLO_HEADER)),
                client_request_id=client_request_id(request.scope),
                quality_floor=_quality_floor(request.headers.get(QUALITY_HEADER)),
                tool_choice=body.tool_mode() if isinstance(body, ChatCompletionRequest) else None,
                user=body.user,
                cache_salt=self._gatekeeper.config.args.kv_cache.salt(caller.tenant),
                trace=TraceContext.parse(request.headers.get(TRACE_HEADER)) or TraceContext.new(),
            )
            call.request = req
            if req.session_id is not None and self._sessions is not None:
                await self._sessions.admit(caller.tenant, req.session_id)
            # The route decision refuses a model of another task (WrongEndpoint) and a
            # policy alias with nothing that fits (NoRouteFits): 400s, before any
            # tokenizing or admission (app.routing.table).
            decision = await self._routes.decide(req, live=self.calls.live.p95_ms)
            if decision is None and self._adapters is not None:
                # not a model or alias: a LoRA adapter (base:adapter) the caller may use?
                adapter = await self._adapters.resolve(req.model, caller.tenant)
                if adapter is not None:
                    req = call.request = replace(req, adapter=adapter)
                    base = replace(req, model=adapter.base)
                    decision = await self._routes.decide(base, live=self.calls.live.p95_ms)
            elif decision is not None and decision.adapter is not None:
                req, decision = await self._routed_adapter(req, decision, caller.tenant)
                call.request = req
            if decision is None:
                raise model_not_found(req.model)
            call.outcome.mark("routed")
            table = self._routes.table  # after decide: it may have refreshed the snapshot
            call.decision = decision
            call.label = self._metrics.model_label(decision.model)
            plan = self._gatekeeper.plan(caller, principal)
            counted = table.pool_model(decision.pool)
            window = table.window(decision)  # the chosen pool's (a class pool's own)
            # One rule for the context window: whenever the prompt can be counted here
            # (a local tokenizer), it is checked before admission, budgets or not.
            tokenizer = self._gatekeeper.tokenizer(counted) if counted else None
            ids: tuple[int, ...] | None = None
            prompt_tokens = 0
            if tokenizer is not None and counted is not None:
                ids = await prompt_ids(tokenizer, req.prompt)
                req = req.with_prompt(req.prompt.counted(counted, ids))
                prompt_tokens = len(ids)
                output_limit(prompt_tokens, req.max_tokens, window, req.sampling.min_tokens)
            elif plan.needs_prompt_tokens:  # an upstream without a local tokenizer
                prompt_tokens = req.prompt.upper_bound_tokens()
                output_limit(prompt_tokens, req.max_tokens, window, req.sampling.min_tokens)
            if not plan.needs_prompt_tokens:
                prompt_tokens = 0  # nothing to reserve: the engine reports the real count
            profile = table.profile(decision.model)
            call.admission = await self._gatekeeper.gate.admit(
                req,
                plan,
                prompt_tokens=prompt_tokens,
                context_left=max(0, window - (len(ids) if ids is not None else prompt_tokens)),
                price=adapter_price(req.adapter, profile.price() if profile else Price()),
                counted_prompt_tokens=len(ids) if ids is not None else None,
            )
            call.outcome.mark("admitted")
            self.calls.add(call)
            self._check_session(call)
            # The budget's allowance is the request's max_tokens from here on.
            req = call.request = req.with_allowance(call.admission.max_tokens)
            stream, first = await dispatch(
                self._pools, table, decision, req, call.outcome, self._metrics, call.hold,
                prompt_tokens,
            )  # fmt: skip
            if req.adapter is not None:
                call.adapter_cold = first.adapter_load_s is not None
                self._metrics.adapter_request(call.label, first.adapter_load_s)
            if isinstance(stream, PdStream):
                call.pd = stream.outcome
                o = stream.outcome
                if o.served == "remote" and o.prefill_s is not None:
                    call.outcome.handoff = (o.prefill_s, o.handoff_s)
                self._metrics.pd_request(
                    call.label,
                    o.served,
                    o.reason,
                    o.prefill_s if o.fallback is None else None,
                    o.handoff_s,
                )
            call.replica = req.replica_note.read()
            if call.replica is not None:
                r = call.replica
                seconds = sum(r.timings_ns.values()) / 1e9
                self._metrics.replica_decision(
                    call.label, r.scorer, seconds, r.index_blocks, r.matched_blocks, r.prompt_blocks
                )
            self._check_session(call)
            call.answered = True
        except asyncio.CancelledError:
            # Ray Serve cancels the handler when the client disconnects.
            if call.stream is not None:
                call.stream.cancel()
            self.calls.end(call, "client_closed", 499)
            self.calls.explain(call)
            raise
        except BaseException as exc:
            return self.calls.fail(call, exc, self._ended_by(call, exc, rid, prompt_param))

        self.calls.explain(call)
        assert call.admission is not None
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        answered_by = req.adapter.id if req.adapter is not None else decision.model
        header = ResponseHeader(kind, f"{prefix}-{rid}", int(time.time()), answered_by)
        headers = {**call.admission.headers(), **call.route_header()}
        if req.stream:
            events = self._events(header, first, stream, call, include_usage=req.include_usage)
            return SettledStream(
                events,
                on_close=lambda: self._never_streamed(call),
                media_type="text/event-stream",
                headers=headers,
            )
        return await self._collect(header, first, stream, call, headers)

    def _check_limits(self, prompt: Prompt, param: str) -> None:
        limits = self._limits
        text = prompt.view
        messages = prompt.messages
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

    def _never_streamed(self, call: Call) -> None:
        """The client left after admission, before the response generator ran."""
        if call.stream is not None:
            call.stream.cancel()
        self.calls.end(call, "client_closed", 499)

    async def _deltas(
        self, first: GenerationDelta, stream: PoolStream, n: int
    ) -> AsyncIterator[GenerationDelta]:
        """The deltas until each of the ``n`` choices has its finish reason."""
        delta, finished = first, 0
        while True:
            yield delta
            finished += delta.finish_reason is not None
            if finished >= n:
                return
            delta = await stream.__anext__()

    def _check_session(self, call: Call) -> None:
        """A call whose session was cancelled while it was being admitted or dispatched
        ends here (``app.sessions.book``: a cancellation read just before the call
        registered)."""
        key = call.session
        if key is not None and self._sessions is not None and self._sessions.cancelled_here(key):
            call.cancel()
        if call.cancelled:
            raise SessionCancelled(key.session_id if key is not None else "")

    async def _routed_adapter(
        self, req: InferenceRequest, decision: RouteDecision, tenant: str | None
    ) -> tuple[InferenceRequest, RouteDecision]:
        """The adapter the routes chose (an alias to it, a canary or a tenant override).
        One the caller may not use, or that is not registered: 404 for an alias (it is
        what the caller asked for); for a canary or tenant override, the base answers."""
        assert decision.adapter is not None
        found = (
            await self._adapters.resolve(decision.adapter, tenant)
            if self._adapters is not None
            else None
        )
        if found is not None:
            return replace(req, adapter=found), decision
        if decision.adapter_required:
            raise model_not_found(req.model)
        log.warning(
            "route %s of %s names adapter %s, which is not registered or not visible to "
            "the caller: the base answers", decision.step, decision.model, decision.adapter,
        )  # fmt: skip
        return req, replace(decision, adapter=None)

    def _ended_by(
        self, call: Call, exc: BaseException, rid: str, param: str = "messages"
    ) -> ApiError:
        """The error a request that failed ends with: the replica's shutdown, its
        session's cancel, or the mapped ``exc``."""
        if call.shutdown:
            return shutting_down()
        key = call.session
        if call.cancelled and key is not None:
            return session_cancelled(SessionCancelled(key.session_id))
        return _map(exc, rid, param)

    @staticmethod
    def _status(call: Call) -> LedgerStatus:
        return "cancelled" if call.cancelled else "error"

    @staticmethod
    def _usage(o: Outcome) -> Usage:
        return Usage(o.prompt_tokens, o.completion_tokens, o.cached_tokens)

    async def _collect(
        self,
        header: ResponseHeader,
        first: GenerationDelta,
        stream: PoolStream,
        call: Call,
        headers: dict[str, str],
    ) -> Response:
        o = call.outcome
        n = call.request.n if call.request is not None else 1
        try:
            async for delta in self._deltas(first, stream, n):
                o.add(delta)
        except asyncio.CancelledError:
            stream.cancel()
            self.calls.end(call, "client_closed", 499)
            raise
        except Exception as exc:
            err = self._ended_by(call, exc, call.rid)
            self.calls.end(call, self._status(call), err.status)
            return err.response()
        self.calls.end(call, "ok", 200)
        asked = _asked_logprobs(call)
        choices = [
            header.choice(
                c.text,
                c.finish_reason or "stop",
                index=i,
                stop_reason=self._stop_reason(call, c.finish_reason),
                logprobs=c.logprobs if asked else None,
                tool_calls=c.tool_calls,
            )
            for i, c in ((i, o.choice(i)) for i in range(n))
        ]
        body = header.response_of(choices, self._usage(o))
        return JSONResponse(body, headers=headers)

    async def _events(
        self,
        header: ResponseHeader,
        first: GenerationDelta,
        stream: PoolStream,
        call: Call,
        *,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        call.streaming = True
        o = call.outcome
        n = call.request.n if call.request is not None else 1
        status: tuple[LedgerStatus, int] = ("client_closed", 499)
        try:
            if header.kind == "chat":
                for i in range(n):
                    yield sse(header.chunk("", role=True, index=i))
            asked = _asked_logprobs(call)
            offsets = [0] * n  # characters streamed so far per choice (text_offset)
            async for delta in self._deltas(first, stream, n):
                o.add(delta)
                if (
                    delta.text
                    and delta.finish_reason is None
                    and not delta.index
                    and not delta.tool_calls
                    and not asked
                ):  # the common token: its event from the response's template
                    offsets[0] += len(delta.text)
                    yield header.text_event(delta.text)
                elif delta.text or delta.tool_calls or delta.finish_reason is not None:
                    finish = delta.finish_reason
                    chunk = header.chunk(
                        delta.text or None,
                        finish,
                        stop_reason=self._stop_reason(call, finish) if finish else None,
                        logprobs=delta.logprobs if asked else None,
                        offset=offsets[delta.index],
                        tool_calls=delta.tool_calls,
                        index=delta.index,
                    )
                    offsets[delta.index] += len(delta.text)
                    yield sse(chunk)
            if include_usage:
                yield sse(header.usage_chunk(self._usage(o)))
            yield DONE
            status = ("ok", 200)
        except Exception as exc:
            err = self._ended_by(call, exc, call.rid)
            status = (self._status(call), err.status)
            yield err.sse()
            yield DONE
        finally:
            if status[1] == 499:  # the client went away: stop the engine's work
                stream.cancel()
            self.calls.end(call, *status)


def _asked_logprobs(call: Call) -> bool:
    return call.request is not None and call.request.sampling.logprobs is not None


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


def _session_slo(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        slo = float(value)
    except ValueError:
        slo = -1.0
    if not 0.0 < slo < float("inf"):
        raise ApiError(
            400,
            f"`{SESSION_SLO_HEADER}` must be a positive number of milliseconds.",
            param=SESSION_SLO_HEADER,
        )
    return slo


def _batch(service_tier: str | None, class_header: str | None) -> bool:
    """Whether the client marked the request as batch work (``app.routing.classes``)."""
    if class_header is not None and class_header != "throughput":
        raise ApiError(
            400,
            f"`{CLASS_HEADER}` accepts 'throughput' (batch work); the other classes follow "
            "from the request itself.",
            param=CLASS_HEADER,
        )
    return class_header == "throughput" or service_tier in BATCH_TIERS
