# Traces: one span tree per request, built once from its outcome after it is settled,
# never on the hot path.
#
# Rule. The ingress reads the caller's W3C ``traceparent`` (``TraceContext.parse``; a
# malformed one is ignored) or starts a trace, and the request carries it: to the
# LLMServer replica inside the request, to an OpenAI upstream as ``traceparent`` whose
# parent is the request's ``replica`` span (its id is derived from the trace and the
# request, so it is known before the span is exported). When ``tracing.otlp_endpoint``
# is set, the ingress exports over OTLP/HTTP, once the request is settled:
#
#   <endpoint> (root, SERVER)      arrival → settled; parent: the caller's span
#     auth                         arrival → caller identified
#     route                        → route decided (body parsed, model and pool chosen)
#     admit                        → admitted (limits, budget reservation)
#     replica                      → last token (or the end); the pool and replica
#       pd.prefill, pd.handoff     a disaggregated request's remote legs
#       queue, prefill, decode     the engine's own times, from its last delta, laid
#                                  back from the last token
#     settle                       end → ledger record written
#
# Phases a request never reached have no span. The root carries the request id, model,
# status, token counts and the session id (an attribute, never a metric label). A
# trace the caller marked not sampled is not exported; a trace started here is exported
# with probability ``sample_ratio`` (decided by its id, so every replica agrees).
#
# Parameters: otlp_endpoint, service_name, sample_ratio, export_delay_ms.
"""``Tracer``: a request's span tree from its ``Outcome``, exported over OTLP."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from app.request import InferenceRequest, Outcome, TraceContext


@dataclass(frozen=True)
class Span:
    """One span of a request's tree, before export: times are ``perf_counter`` seconds."""

    name: str
    start: float
    end: float
    parent: str | None  # the parent span's name; None: the root
    attributes: Mapping[str, Any]
    span_id: str | None = None  # a derived id (``TraceContext.span_id``); None: random


def spans(
    request: InferenceRequest | None,
    outcome: Outcome,
    endpoint: str,
    replica: str | None = None,
) -> list[Span]:
    """The span tree of one ended request (module comment), root first."""
    m = outcome.marks
    start = outcome.started
    end = m.get("settled", m.get("ended", time.perf_counter()))
    root_attrs: dict[str, Any] = {
        "switchyard.request_id": request.id if request is not None else "",
        "switchyard.status": outcome.status,
        "http.response.status_code": outcome.http_status,
        "gen_ai.usage.input_tokens": outcome.prompt_tokens,
        "gen_ai.usage.output_tokens": outcome.completion_tokens,
        "switchyard.cached_tokens": outcome.cached_tokens,
    }
    if request is not None:
        root_attrs["gen_ai.request.model"] = request.model
        if request.session_id is not None:
            root_attrs["switchyard.session_id"] = request.session_id
        if request.tenant is not None:
            root_attrs["switchyard.tenant"] = request.tenant
    if outcome.model_served is not None:
        root_attrs["gen_ai.response.model"] = outcome.model_served
    out = [Span(endpoint, start, end, None, root_attrs)]
    previous = start
    for name, mark in (("auth", "identified"), ("route", "routed"), ("admit", "admitted")):
        if mark not in m:
            break
        out.append(Span(name, previous, m[mark], endpoint, {}))
        previous = m[mark]
    admitted = m.get("admitted")
    if admitted is not None and outcome.attempts:
        last = outcome.last_at or m.get("ended", end)
        attrs: dict[str, Any] = {"switchyard.pool": outcome.pool or "",
                                 "switchyard.attempts": outcome.attempts}  # fmt: skip
        if replica is not None:
            attrs["switchyard.replica"] = replica
        rid = request.id if request is not None else ""
        derived = request.trace.span_id("replica", rid) if request and request.trace else None
        out.append(Span("replica", admitted, last, endpoint, attrs, derived))
        if outcome.handoff is not None:
            prefill_s, handoff_s = outcome.handoff
            out.append(Span("pd.prefill", admitted, admitted + prefill_s, "replica", {}))
            if handoff_s is not None:
                at = admitted + prefill_s
                out.append(Span("pd.handoff", at, at + handoff_s, "replica", {}))
        t = outcome.engine_times
        if t is not None:
            decode_at = last - t.decode_s
            prefill_at = decode_at - t.prefill_s
            out += [
                Span("queue", prefill_at - t.queued_s, prefill_at, "replica", {}),
                Span("prefill", prefill_at, decode_at, "replica", {}),
                Span("decode", decode_at, last, "replica", {}),
            ]
    if "ended" in m and "settled" in m:
        out.append(Span("settle", m["ended"], m["settled"], endpoint, {}))
    return out


def sampled(trace: TraceContext, ratio: float) -> bool:
    """Export this trace? The caller's flag when it sent one, else ``ratio`` by trace id."""
    if trace.parent_id is not None:
        return trace.sampled
    return int(trace.trace_id[-8:], 16) < ratio * 0x1_0000_0000


class Tracer:
    """Exports span trees over OTLP/HTTP (module comment); without an endpoint it does
    nothing."""

    def __init__(
        self,
        otlp_endpoint: str | None,
        service_name: str = "switchyard",
        sample_ratio: float = 1.0,
        export_delay_ms: int = 1000,
        exporter: Any = None,
    ) -> None:
        """``exporter``: an OpenTelemetry ``SpanExporter`` to use instead of OTLP/HTTP
        (tests); with it, spans are exported as each tree ends."""
        self.enabled = otlp_endpoint is not None or exporter is not None
        self.sample_ratio = sample_ratio
        self._provider: Any = None
        if not self.enabled:
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self._ids = _Ids()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), id_generator=self._ids
        )
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor: Any = BatchSpanProcessor(
                OTLPSpanExporter(endpoint=otlp_endpoint, timeout=5),
                schedule_delay_millis=export_delay_ms,
            )
        else:
            processor = SimpleSpanProcessor(exporter)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("switchyard")

    def export(
        self,
        request: InferenceRequest | None,
        outcome: Outcome,
        endpoint: str,
        replica: str | None = None,
    ) -> None:
        trace = request.trace if request is not None else None
        if not self.enabled or trace is None or not sampled(trace, self.sample_ratio):
            return
        from opentelemetry import trace as otel

        tree = spans(request, outcome, endpoint, replica)
        wall_ns, perf = time.time_ns(), time.perf_counter()

        def ns(t: float) -> int:
            return wall_ns - int((perf - t) * 1e9)

        flags = otel.TraceFlags(otel.TraceFlags.SAMPLED)
        parent = otel.SpanContext(
            int(trace.trace_id, 16),
            int(trace.parent_id or "1", 16),
            is_remote=True,
            trace_flags=flags,
        )
        # The root's parent is the caller's span; a trace started here has none.
        base = otel.set_span_in_context(otel.NonRecordingSpan(parent))
        self._ids.trace_id = int(trace.trace_id, 16)
        contexts: dict[str, Any] = {}
        for s in tree:
            ctx = base if s.parent is None else contexts[s.parent]
            if s.parent is None and trace.parent_id is None:
                from opentelemetry.context import Context

                ctx = Context()  # a new trace: the root has no parent
            self._ids.span_id = int(s.span_id, 16) if s.span_id is not None else None
            kind = otel.SpanKind.SERVER if s.parent is None else otel.SpanKind.INTERNAL
            span = self._tracer.start_span(
                s.name, context=ctx, kind=kind, attributes=dict(s.attributes),
                start_time=ns(s.start),
            )  # fmt: skip
            if s.parent is None and outcome.http_status >= 500:
                span.set_status(otel.Status(otel.StatusCode.ERROR))
            contexts[s.name] = otel.set_span_in_context(span)
            span.end(end_time=ns(max(s.end, s.start)))
        self._ids.trace_id = None

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


class _Ids(IdGenerator):
    """Random ids, or the one the next span must have (a derived span id; the trace of
    a root without a parent). Used on one event loop, one tree at a time."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.span_id: int | None = None
        self.trace_id: int | None = None

    def generate_span_id(self) -> int:
        if self.span_id is not None:
            chosen, self.span_id = self.span_id, None
            return chosen
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.trace_id if self.trace_id is not None else self._random.generate_trace_id()
