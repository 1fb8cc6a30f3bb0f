"""The requests in flight on one ingress replica, and how each one ends.

Rule: every request is one ``Call`` — its ``InferenceRequest``, its ``Outcome`` so far
and its live stream. ``Calls.end`` closes the outcome once (later calls change
nothing) and derives everything from it: the metrics, the pool's live latency and the
settlement (the ledger record); ``Calls.fail`` does that for a request that failed
before its answer and shapes the error. ``Calls.explain`` writes the decision log line, also
from the outcome. ``Calls.cancel_session`` ends a session's calls (a whole-session cancel):
their streams are cancelled (the engine frees their slots) and the handlers end them
with status ``cancelled``, billing what they produced. ``begin_shutdown``/``shutdown``
drain what is in flight: new requests get 503 ``shutting_down``; after the grace the
rest are ended with an error, billing what they produced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from app.api.errors import (
    ApiError,
    Dialect,
    map_exception,
    rejection_reason,
    session_cancelled,
    shutting_down,
)
from app.disagg.outcome import PdOutcome
from app.dispatch.fallback import Answer
from app.dispatch.pools import PoolStream
from app.fairness.queue import Ticket
from app.gateway.admission import Admission
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.observability.tracing import Tracer
from app.request import InferenceRequest, Outcome, ReplicaChoice
from app.routing.acceptance import DraftAcceptance
from app.routing.live import LiveLatency
from app.routing.table import RouteDecision
from app.sessions.book import SessionCancelled
from app.state.protocol import SessionKey
from app.state.records import LedgerStatus

log = logging.getLogger("switchyard.route")
ENDPOINT_SPANS = {"chat": "POST /v1/chat/completions", "completion": "POST /v1/completions",
                  "messages": "POST /v1/messages"}  # fmt: skip


@dataclass(eq=False)
class Call:
    """One request in flight: the request, its outcome so far, and the live handles."""

    rid: str
    label: str
    outcome: Outcome
    request: InferenceRequest | None = None
    admission: Admission | None = None
    decision: RouteDecision | None = None
    answer: Answer | None = None  # dispatch's: the stream, first delta and provenance
    task: asyncio.Task[Any] | None = None  # the handler's, until the answer is in
    answered: bool = False  # a pool produced the first delta (or the whole answer)
    ended: bool = False  # metrics and settlement happened
    streaming: bool = False  # the response generator started
    shutdown: bool = False  # ended by the replica's shutdown
    cancelled: bool = False  # ended by a whole-session cancel
    tenant: str | None = field(default=None)
    ticket: Ticket | None = None  # its place at a saturated pool (app.fairness.queue)
    dialect: Dialect = "openai"  # the error shape of the API called (app.api.errors)

    @property
    def stream(self) -> PoolStream | None:
        """The answer's stream (None before the first delta)."""
        return self.answer.stream if self.answer is not None else None

    @property
    def replica(self) -> ReplicaChoice | None:
        """The replica router's choice (``app.request.ReplicaNote``), from the answer."""
        return self.answer.replica if self.answer is not None else None

    @property
    def pd(self) -> PdOutcome | None:
        """How a disaggregated pool served it (``app.disagg``), from the answer."""
        return self.answer.pd if self.answer is not None else None

    @property
    def adapter_cold(self) -> bool | None:
        """The replica loaded the request's adapter first."""
        return None if self.answer is None else self.answer.first.adapter_load_s is not None

    def answered_by(self, answer: Answer) -> None:
        self.answer = answer
        self.task = None  # from here on a cancel stops the stream
        if self.cancelled or self.shutdown:  # meanwhile: stop the engine's work
            answer.stream.cancel()

    def stop(self) -> None:
        """Stop the engine's work: the stream once there is one, else the handler's
        dispatch (its attempt is cancelled where it runs, ``app.dispatch.fallback``)."""
        if self.stream is not None:
            self.stream.cancel()
        elif self.task is not None and not self.ended:
            self.task.cancel()

    def cancel(self) -> None:
        """Its session was cancelled: stop the engine's work (the handler ends it)."""
        self.cancelled = True
        self.stop()

    @property
    def session(self) -> SessionKey | None:
        r = self.request
        if r is None or r.session_id is None or r.tenant is None:
            return None
        return SessionKey(r.tenant, r.session_id)

    def route_header(self) -> dict[str, str]:
        d, o = self.decision, self.outcome
        if d is None:
            return {}
        parts = [f"model={d.model}", f"pool={o.pool or d.pool}", f"step={d.step}"]
        if o.failures:
            parts[2] = "step=fallback"
            parts.append(f"first={d.step}")
        if d.via:
            parts.append(f"via={d.via}")
        if d.profile:
            parts.append(f"profile={d.profile}")
        if d.request_class:
            parts.append(f"class={d.request_class}")
        if d.quality:
            parts.append(f"quality={d.quality}")
        if d.speculative:
            parts.append(f"speculative={d.speculative}")
        if o.queue is not None:
            parts.append(o.queue.header())
        parts.append(f"attempts={max(1, o.attempts)}")
        if self.request is not None and self.request.adapter is not None:
            parts.append(f"adapter={self.request.adapter.id}")
            if self.adapter_cold is not None:
                parts.append(f"cold={'true' if self.adapter_cold else 'false'}")
        if self.pd is not None:
            parts.append(self.pd.header())
        if self.replica is not None:
            parts.append(self.replica.header())
        return {"x-switchyard-route": "; ".join(parts)}


class Calls:
    """The book of one replica's requests in flight (module docstring)."""

    def __init__(
        self, gatekeeper: Gatekeeper, metrics: GatewayMetrics, tracer: Tracer | None = None
    ) -> None:
        self._gatekeeper = gatekeeper
        self._metrics = metrics
        self._tracer = tracer or Tracer(None)
        self.live = LiveLatency()
        self.acceptance = DraftAcceptance()  # speculative pools' health (app.routing.table)
        self._calls: set[Call] = set()  # admitted and not ended (for the shutdown drain)
        self._draining = False
        self._cut: asyncio.Task[None] | None = None  # ends what runs past the grace

    def add(self, call: Call) -> None:
        self._calls.add(call)

    def has_session_calls(self) -> bool:
        """Some live call belongs to a session (its cancel feed is worth reading)."""
        return any(c.session is not None for c in self._calls)

    def cancel_session(self, key: SessionKey) -> int:
        """Cancel this replica's calls of a session; returns how many."""
        hit = [c for c in self._calls if not c.cancelled and c.session == key]
        for call in hit:
            call.cancel()
        return len(hit)

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
        await self._gatekeeper.gate.drain()

    async def _cut_after(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for call in list(self._calls):
            call.shutdown = True
            call.stop()
        deadline = time.monotonic() + 5.0
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for call in list(self._calls):  # never picked up again: settle as they stand
            self.end(call, "error", 503)

    # ---- the outcome ------------------------------------------------------------------

    def end(self, call: Call, status: LedgerStatus, http_status: int) -> None:
        """Close the outcome and derive from it, once per request (later calls change
        nothing): the metrics, the live latency of the pool, the settlement."""
        if call.ended:
            return
        call.ended = True
        self._calls.discard(call)
        o, d = call.outcome, call.decision
        o.status, o.http_status = status, http_status
        if d is not None:
            o.model_served = d.model
            o.pool = o.pool or d.pool
            o.route_step = "fallback" if o.failures else d.step
        o.mark("ended")
        if call.ticket is not None:  # its slot goes to the next waiter
            call.ticket.leave(o.completion_tokens)
            if o.queue is not None and o.queue.shed is None:
                o.queue = call.ticket.note()  # with the output's service
        self._metrics.observe(call.label, o, call.tenant)
        if d is not None and call.answered and o.pool is not None:
            self.live.observe(o.pool, o.ttft_s, o.itls)
            a = call.answer
            if a is not None and a.first.spec is not None:
                self.acceptance.observe(a.pool, a.first.spec)
        settling = None
        if call.admission is not None:
            settling = self._gatekeeper.gate.settle(call.admission, o)
        if self._tracer.enabled:
            if settling is None:
                self._trace(call)
            else:
                settling.add_done_callback(lambda _: self._trace(call, settled=True))

    def _trace(self, call: Call, settled: bool = False) -> None:
        """Export the request's span tree (``app.observability.tracing``)."""
        if settled:
            call.outcome.mark("settled")
        replica = call.replica.replica if call.replica is not None else None
        endpoint = ENDPOINT_SPANS.get(call.outcome.endpoint, call.outcome.endpoint)
        try:
            self._tracer.export(call.request, call.outcome, endpoint, replica)
        except Exception:  # a trace is never worth a request
            log.exception("could not export the trace of %s", call.rid)

    def fail(self, call: Call, exc: BaseException, err: ApiError) -> Response:
        """End a request that failed before its answer started with ``err`` (the mapped
        ``exc``, or ``shutting_down``): count the rejection, end the outcome
        (``rejected_by_engine`` once a pool was tried), log the decision, and answer
        with the admission's and the route's headers."""
        reason = rejection_reason(exc)
        if reason is not None:
            self._metrics.rejections.labels(reason).inc()
        o = call.outcome
        status: LedgerStatus = "rejected_by_engine" if o.attempts > 0 else "error"
        if o.queue is not None and o.queue.shed is not None:
            status = "shed"
        self.end(call, "cancelled" if call.cancelled else status, err.status)
        self.explain(call)
        if call.admission is not None:
            err.headers.update(call.admission.headers())
        err.headers.update(call.route_header())
        return err.response(call.dialect)

    def explain(self, call: Call) -> None:
        """Count the decision and log it as one JSON line (reproducible routing)."""
        d, o = call.decision, call.outcome
        if d is None:
            return
        pool = o.pool or d.pool
        step = "fallback" if o.failures else d.step
        self._metrics.decisions.labels(call.label, pool, step).inc()
        trace = call.request.trace if call.request is not None else None
        line: dict[str, object] = {
            "request_id": call.rid,
            "trace_id": trace.trace_id if trace is not None else None,
            "tenant": call.tenant,
            "requested": d.requested,
            "model": d.model,
            "pool": pool,
            "step": d.step,
            "via": d.via,
            "class": d.request_class,
            "fallbacks": list(d.fallbacks),
            "attempts": o.attempts,
            "failures": o.failures,
        }
        if o.queue is not None:
            q = o.queue
            line["queue"] = {"band": q.band, "waited_ms": round(q.waited_s * 1000, 1),
                             "vtc": round(q.counter, 1), "shed": q.shed}  # fmt: skip
        if d.policy is not None:
            line["policy"] = {"scores": d.policy.scores, "dropped": d.policy.dropped}
        if d.speculative is not None:
            line["speculative"] = d.speculative
        r = call.replica
        if r is not None:
            line["replica"] = {
                "replica": r.replica, "scorer": r.scorer, "prefix_blocks": r.matched_blocks,
                "prompt_blocks": r.prompt_blocks, "load": round(r.load, 3),
                "totals": {k: round(v, 6) for k, v in r.totals.items()},
                "plugin_ns": r.timings_ns,
            }  # fmt: skip
        log.info("route %s", json.dumps(line, separators=(",", ":")))


def ended_by(call: Call, exc: BaseException, param: str = "messages") -> ApiError:
    """The error a request that failed ends with: the replica's shutdown, its
    session's cancel, or the mapped ``exc``."""
    if call.shutdown:
        return shutting_down()
    key = call.session
    if call.cancelled and key is not None:
        return session_cancelled(SessionCancelled(key.session_id))
    return map_exception(exc, call.rid, param)
