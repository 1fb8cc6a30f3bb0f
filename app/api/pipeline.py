"""The ingress as one pipeline, declared once (``Pipeline.run``):

authenticate → parse → route → admit → dispatch → respond

(``app.api.stages``: one module each). An endpoint (``app.api.endpoints``) is a slice
naming its parse, measure, dispatch and respond; everything else is the same for
chat, completions and embeddings. Each stage's end is marked on the request's
``Outcome`` (``identified``, ``parsed``, ``routed``, ``admitted``, ``answered``,
``ended``): the per-stage histogram ``switchyard_stage_seconds`` and the trace's spans
are derived from those marks.

How a request ends: every admitted request is ended exactly once (``Calls.end``: the
metrics, the live latency, the ledger record) — on completion, on an error (the one
error mapper, ``app.api.errors``; ``rejected_by_engine`` once a pool was tried), when
the client leaves (499: Ray Serve cancels the handler; the running attempt is cancelled
where it runs), when its session is cancelled (``cancelled``; 409) and when the replica
stops (503 ``shutting_down`` after the grace). A session's cancel or the replica's stop
reaches a request still in dispatch by cancelling its handler's task, and one with an
answer by cancelling the answer's stream. Every decision is logged as one JSON line
(``Calls.explain``) and every response carries ``x-switchyard-route``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from app.adapters.registry import AdapterRegistry
from app.api.endpoints import Endpoint
from app.api.flow import Call, Calls, ended_by
from app.api.request_id import incoming_request_id
from app.api.stages.admit import admit, check_session
from app.api.stages.authenticate import authenticate
from app.api.stages.parse import ParseSettings
from app.api.stages.route import route
from app.config import RequestLimits
from app.dispatch.pools import Pools
from app.fairness.pools import FairQueues
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.request import Outcome
from app.routing.snapshot import RouteSnapshot
from app.sessions.book import SessionBook


@dataclass
class Pipeline:
    """What the stages use, built once per ingress replica (``app.api.ingress``)."""

    routes: RouteSnapshot
    pools: Pools
    gatekeeper: Gatekeeper
    metrics: GatewayMetrics
    parse: ParseSettings
    calls: Calls
    sessions: SessionBook | None = None
    adapters: AdapterRegistry | None = None
    loop: asyncio.AbstractEventLoop | None = None  # the loop requests run on
    fair: FairQueues | None = None  # the saturated pools' turns (app.fairness.queue)

    @property
    def limits(self) -> RequestLimits:
        return self.parse.limits

    # ---- shutdown (of every request in flight on this replica) -------------------------

    @property
    def draining(self) -> bool:
        return self.calls.draining

    @property
    def in_flight(self) -> int:
        return self.calls.in_flight

    def begin_shutdown(self, grace_s: float) -> None:
        self.calls.begin_shutdown(grace_s)

    async def shutdown(self, grace_s: float) -> None:
        await self.calls.shutdown(grace_s)

    # ---- one request ------------------------------------------------------------------

    async def run(self, http: Request, endpoint: Endpoint[Any]) -> Response:
        self.loop = asyncio.get_running_loop()
        calls = self.calls
        call = Call(incoming_request_id(http.scope), self.metrics.model_label(None),
                    Outcome(endpoint.name), task=asyncio.current_task(),
                    dialect=endpoint.dialect)  # fmt: skip
        mark = call.outcome.mark
        try:
            who = await authenticate(call, http.headers, self.gatekeeper, calls.draining)
            mark("identified")
            request, body = await endpoint.parse(http, call.rid, who, self.parse)
            call.request = request
            mark("parsed")
            adapters = self.adapters if endpoint.adapters else None
            routed = await route(request, self.routes, adapters, calls.live.p95_ms,
                                 acceptance=calls.acceptance,
                                 local_only=endpoint.local_only)  # fmt: skip
            call.request, call.decision = routed.request, routed.decision
            call.label = self.metrics.model_label(routed.decision.model)
            mark("routed")
            request = call.request = await admit(call, routed, who, endpoint.measure,
                                                 self.gatekeeper, self.limits, calls,
                                                 self.sessions, self.fair)  # fmt: skip
            mark("admitted")
            answer = await endpoint.dispatch(call, routed, request, self.pools, self.metrics)
            check_session(call, self.sessions)
            call.answered = True
            mark("answered")
            response = await endpoint.respond(call, body, routed, request, answer, calls)
        except asyncio.CancelledError as exc:
            if (call.cancelled or call.shutdown) and not call.ended:
                # our own cancel of the dispatch (Call.stop): the request ends here
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                return calls.fail(call, exc, ended_by(call, exc, endpoint.error_param))
            if call.stream is not None:  # the client left: stop the engine's work
                call.stream.cancel()
            calls.end(call, "client_closed", 499)
            calls.explain(call)
            raise
        except BaseException as exc:
            err = ended_by(call, exc, endpoint.error_param)
            if call.ended:  # ended already (the shutdown's cut): answer, count nothing twice
                return err.response(call.dialect)
            return calls.fail(call, exc, err)
        calls.explain(call)
        return response
