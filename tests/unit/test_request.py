"""``app.request``: the one request (routing view, engine ids, the allowance) and the
one outcome (tokens, text and timing from the deltas)."""

from __future__ import annotations

import dataclasses

import pytest

from app.engine.protocol import GenerationDelta, RequestTimes, SamplingOptions
from app.request import Caller, InferenceRequest, Outcome, Prompt, TraceContext
from app.state.records import Priority
from tests.request_helpers import inference


def request(**kw: object) -> InferenceRequest:
    args: dict[str, object] = {
        "id": "rid1",
        "endpoint": "chat",
        "model": "m",
        "prompt": Prompt(messages=({"role": "user", "content": "hello there"},)),
        "max_tokens": 50,
        "caller": Caller(tenant="acme"),
        **kw,
    }
    return InferenceRequest(**args)  # type: ignore[arg-type]


def test_the_router_reads_the_request_itself() -> None:
    r = request(quality_floor=0.5)
    assert (r.model, r.tenant, r.max_tokens, r.quality_floor) == ("m", "acme", 50, 0.5)
    assert r.prompt_text == "hello there"
    assert r.prompt_tokens == r.prompt.estimate_tokens() == 11 // 3 + 4
    assert request(caller=None).tenant is None


def test_engine_ids_derive_from_the_gateway_id_per_attempt() -> None:
    r = request()
    assert [r.engine_id(n) for n in (1, 2)] == ["rid1-1", "rid1-2"]


def test_the_allowance_and_the_counted_prompt_change_only_their_field() -> None:
    r = request(sampling=SamplingOptions(temperature=0.2, stop=("x",)))
    assert r.with_allowance(50) is r
    capped = r.with_allowance(7)
    assert capped.max_tokens == 7
    assert dataclasses.replace(capped, max_tokens=50) == r
    counted = r.with_prompt(r.prompt.counted("m", (1, 2, 3)))
    assert counted.prompt.ids_for("m") == (1, 2, 3) and counted.sampling is r.sampling


def test_outcome_counts_text_and_timing_from_content_deltas_only() -> None:
    o = Outcome("chat")
    o.add(GenerationDelta("", 0, prompt_tokens=10))  # no content: no TTFT yet
    assert o.ttft_s is None
    o.add(GenerationDelta("a", 1))
    o.add(GenerationDelta("b", 2))
    o.add(GenerationDelta("", 1, finish_reason="stop"))
    assert o.text == "ab"
    assert o.completion_tokens == 4 and len(o.itls) == 1
    assert o.finish_reason == "stop" and o.prompt_tokens == 10
    assert o.ttft_s is not None and o.ttft_s >= 0.0


def test_the_latest_prompt_count_replaces_an_estimate() -> None:
    """An upstream's first delta carries our estimate; its usage chunk the exact count,
    which may be lower."""
    o = Outcome("completion")
    o.add(GenerationDelta("x", 1, prompt_tokens=120))
    o.add(GenerationDelta("", 0, finish_reason="length", prompt_tokens=37, cached_prompt_tokens=5))
    assert (o.prompt_tokens, o.cached_tokens) == (37, 5)
    o.add(GenerationDelta("", 0))  # a delta without counts keeps them
    assert (o.prompt_tokens, o.cached_tokens) == (37, 5)


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-{SPAN}-01", TraceContext(TRACE, SPAN, True)),
        (f"00-{TRACE}-{SPAN}-00", TraceContext(TRACE, SPAN, False)),
        (f" 00-{TRACE}-{SPAN}-03 ", TraceContext(TRACE, SPAN, True)),  # other flags kept out
        (f"01-{TRACE}-{SPAN}-01-future", TraceContext(TRACE, SPAN, True)),  # a later version
        (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has exactly four fields
        (f"ff-{TRACE}-{SPAN}-01", None),  # the forbidden version
        (f"00-{TRACE.upper()}-{SPAN}-01", None),  # lowercase hex only
        (f"00-{'0' * 32}-{SPAN}-01", None),  # all-zero ids are invalid
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE[:-1]}-{SPAN}-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_traceparent_is_read_as_w3c_says(header: str | None, expected: TraceContext | None) -> None:
    assert TraceContext.parse(header) == expected


def test_a_new_trace_and_the_header_a_callee_gets() -> None:
    t = TraceContext.new()
    assert len(t.trace_id) == 32 and t.parent_id is None and t.sampled
    assert TraceContext.new().trace_id != t.trace_id
    child = t.span_id("replica", "rid1")
    assert child == t.span_id("replica", "rid1") != t.span_id("settle", "rid1")
    assert TraceContext.parse(t.traceparent(child)) == TraceContext(t.trace_id, child, True)
    assert TraceContext(TRACE, SPAN, False).traceparent(SPAN).endswith("-00")


def test_the_outcome_keeps_each_phase_once_and_the_engine_times() -> None:
    o = Outcome("chat")
    o.mark("admitted")
    first = o.marks["admitted"]
    o.mark("admitted")
    assert o.marks["admitted"] == first  # the first time it passed
    times = RequestTimes(0.1, 0.2, 0.3)
    o.add(GenerationDelta("a", 1))
    o.add(GenerationDelta("b", 1, finish_reason="stop", times=times))
    assert o.engine_times == times


def test_the_outcome_sums_engine_time_over_deltas_choices_and_legs() -> None:
    o = Outcome("chat")
    o.add(GenerationDelta("a", 1))  # an engine that keeps no GPU time
    assert (o.gpu_seconds, o.gpu_cost_usd) == (None, None)
    o.add(GenerationDelta("b", 1, gpu_seconds=0.5, gpu_cost_usd=0.005))
    o.add(GenerationDelta("c", 1, index=1, gpu_seconds=0.25, gpu_cost_usd=0.0025))
    o.add(GenerationDelta("", 0, finish_reason="stop", gpu_seconds=0.125))  # unpriced
    assert (o.gpu_seconds, o.gpu_cost_usd) == pytest.approx((0.875, 0.0075))


@pytest.mark.parametrize(
    ("asked", "granted", "priority", "engine"),
    [
        (None, "batch", "batch", 2),
        ("interactive", "standard", "standard", 1),  # asked higher, granted its level's
        ("batch", None, "batch", 2),  # no band granted (embeddings): as asked
        (None, None, None, 1),  # neither: standard
        (None, "interactive", "interactive", 0),
    ],
)
def test_admission_grants_a_band_and_the_engine_reads_it_as_its_priority(
    asked: Priority | None, granted: Priority | None, priority: Priority | None, engine: int
) -> None:
    request = dataclasses.replace(inference("r"), priority=asked)
    admitted = request.admitted(None, None, None, granted)
    assert admitted.priority == priority and admitted.engine_priority() == engine
