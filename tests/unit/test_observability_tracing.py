"""A request's span tree from its outcome (app.observability.tracing): the layers as
children of the root, the engine's times laid back from the last token, the caller's
trace continued, a derived replica span id, sampling, and nothing without an endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.engine.protocol import RequestTimes
from app.observability.tracing import Tracer, sampled, spans
from app.request import Caller, InferenceRequest, Outcome, Prompt, TraceContext

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def request(trace: TraceContext | None, session: str | None = "s-1") -> InferenceRequest:
    prompt = Prompt(messages=({"role": "user", "content": "hi"},))
    return InferenceRequest(id="rid1", endpoint="chat", model="m", prompt=prompt,
                            caller=Caller("acme"), session_id=session, trace=trace)  # fmt: skip


def outcome(handoff: bool = False) -> Outcome:
    o = Outcome("chat", status="ok", http_status=200, pool="main", attempts=1,
                prompt_tokens=12, completion_tokens=5, model_served="m")  # fmt: skip
    o.started = 100.0
    o.marks = {"identified": 100.01, "routed": 100.02, "admitted": 100.03, "ended": 101.0,
               "settled": 101.05}  # fmt: skip
    o.last_at = 100.9
    o.engine_times = RequestTimes(queued_s=0.05, prefill_s=0.2, decode_s=0.5)
    if handoff:
        o.handoff = (0.1, 0.05)
    return o


def test_the_tree_has_one_span_per_layer_in_order() -> None:
    tree = spans(request(TraceContext(TRACE, CALLER_SPAN)), outcome(), "POST /v1/chat/completions")
    shape = [(s.name, s.parent, round(s.start - 100, 3), round(s.end - 100, 3)) for s in tree]
    root = "POST /v1/chat/completions"
    assert shape == [
        (root, None, 0.0, 1.05),
        ("auth", root, 0.0, 0.01),
        ("route", root, 0.01, 0.02),
        ("admit", root, 0.02, 0.03),
        ("replica", root, 0.03, 0.9),
        ("queue", "replica", 0.15, 0.2),  # laid back from the last token
        ("prefill", "replica", 0.2, 0.4),
        ("decode", "replica", 0.4, 0.9),
        ("settle", root, 1.0, 1.05),
    ]
    assert tree[0].attributes["switchyard.session_id"] == "s-1"
    assert tree[4].span_id == TraceContext(TRACE).span_id("replica", "rid1")


def test_phases_never_reached_have_no_span() -> None:
    o = Outcome("chat", status="error", http_status=401)
    o.marks = {"ended": o.started + 0.001}
    tree = spans(request(TraceContext(TRACE)), o, "root")
    assert [s.name for s in tree] == ["root"]
    o.marks["identified"] = o.started
    assert [s.name for s in spans(request(TraceContext(TRACE)), o, "root")] == ["root", "auth"]


def export(trace: TraceContext, o: Outcome, ratio: float = 1.0) -> list[Any]:
    memory = InMemorySpanExporter()
    tracer = Tracer(None, sample_ratio=ratio, exporter=memory)
    tracer.export(request(trace), o, "POST /v1/chat/completions", replica="r-7")
    got = list(memory.get_finished_spans())
    tracer.shutdown()
    return got


def test_the_callers_trace_continues_with_the_root_under_its_span() -> None:
    got = export(TraceContext(TRACE, CALLER_SPAN), outcome(handoff=True))
    by_name = {s.name: s for s in got}
    assert {f"{s.context.trace_id:032x}" for s in got} == {TRACE}
    root = by_name["POST /v1/chat/completions"]
    assert f"{root.parent.span_id:016x}" == CALLER_SPAN
    replica = by_name["replica"]
    assert f"{replica.context.span_id:016x}" == TraceContext(TRACE).span_id("replica", "rid1")
    assert replica.attributes["switchyard.replica"] == "r-7"
    for child in ("queue", "prefill", "decode", "pd.prefill", "pd.handoff"):
        assert by_name[child].parent.span_id == replica.context.span_id, child
    for child in ("auth", "route", "admit", "replica", "settle"):
        assert by_name[child].parent.span_id == root.context.span_id, child
    assert root.end_time - root.start_time == pytest.approx(1.05e9, rel=1e-3)
    assert by_name["decode"].end_time <= root.end_time


def test_a_trace_started_here_has_a_root_without_parent() -> None:
    trace = TraceContext.new()
    got = export(trace, outcome())
    (root,) = [s for s in got if s.parent is None]
    assert f"{root.context.trace_id:032x}" == trace.trace_id
    assert root.attributes["gen_ai.usage.output_tokens"] == 5


@pytest.mark.parametrize(
    ("trace", "ratio", "exported"),
    [
        (TraceContext(TRACE, CALLER_SPAN, sampled=False), 1.0, False),  # the caller decides
        (TraceContext(TRACE, CALLER_SPAN, sampled=True), 0.0, True),
        (TraceContext("0" * 24 + "00000001"), 0.5, True),  # a trace started here: by its id
        (TraceContext("0" * 24 + "ffffffff"), 0.5, False),
        (TraceContext("0" * 24 + "ffffffff"), 1.0, True),
    ],
)
def test_sampling(trace: TraceContext, ratio: float, exported: bool) -> None:
    assert sampled(trace, ratio) is exported
    assert bool(export(trace, outcome(), ratio)) is exported


def test_without_an_endpoint_nothing_is_built() -> None:
    tracer = Tracer(None)
    assert not tracer.enabled
    tracer.export(request(TraceContext(TRACE)), outcome(), "root")  # a no-op
    tracer.shutdown()
