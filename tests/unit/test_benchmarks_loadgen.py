"""benchmarks.loadgen: metric arithmetic, Poisson schedule, SSE parsing against a tiny
in-process server. No wall-clock performance assertions."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from benchmarks.loadgen import (
    RequestRecord,
    Workload,
    aggregate,
    make_prompts,
    parse_sse_line,
    percentile,
    poisson_schedule,
    run_closed_loop,
    run_open_loop,
)


# ----------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 99, 3.97),  # 1 + 3 * 0.99 = 2.97 -> 3 + 0.97
        ([10.0, 20.0, 30.0, 40.0, 50.0], 25, 20.0),
        ([7.0], 99, 7.0),
    ],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def _record(index: int, chunks: list[float], e2e: float, tokens: int | None) -> RequestRecord:
    return RequestRecord(
        index=index,
        intended_start=0.0,
        actual_start=0.0,
        ttft=chunks[0],
        e2e=e2e,
        chunk_times=chunks,
        output_tokens=tokens,
    )


def test_tpot_and_itl_of_one_request() -> None:
    r = _record(0, [0.10, 0.15, 0.25], e2e=0.30, tokens=3)
    assert r.itls() == pytest.approx([0.05, 0.10])
    assert r.tpot() == pytest.approx((0.30 - 0.10) / 2)
    assert r.n_chunks == 3


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # Two chunks carrying 5 tokens (a batching server): TPOT divides by 5 - 1.
    r = _record(0, [0.2, 0.6], e2e=0.6, tokens=5)
    assert r.tpot() == pytest.approx(0.4 / 4)
    assert r.itls() == pytest.approx([0.4])


def test_tpot_undefined_for_single_token_or_error() -> None:
    assert _record(0, [0.1], e2e=0.1, tokens=1).tpot() is None
    failed = _record(0, [0.1, 0.2], e2e=0.2, tokens=2)
    failed.error = "HTTP 503"
    assert failed.tpot() is None


def test_aggregate_hand_computed() -> None:
    a = _record(0, [0.1, 0.2, 0.3], e2e=0.3, tokens=3)  # ITL 0.1, 0.1; TPOT 0.1
    b = _record(1, [0.2, 0.5], e2e=0.5, tokens=4)  # ITL 0.3; TPOT 0.1; 2 chunks/4 tokens
    b.intended_start = 1.0
    bad = RequestRecord(index=2, intended_start=2.0, actual_start=2.0, error="HTTP 500")
    agg = aggregate([a, b, bad])
    assert (agg["requests"], agg["ok"], agg["errors"]) == (3, 2, 1)
    assert agg["ttft_p50"] == pytest.approx(0.15)
    assert agg["itl_p50"] == pytest.approx(0.1)
    assert agg["itl_p99"] == pytest.approx(0.1 + 0.2 * 0.98)
    assert agg["itl_bunched_frac"] == 0.0
    assert agg["tpot_p50"] == pytest.approx(0.1)
    assert agg["e2e_p50"] == pytest.approx(0.4)
    assert agg["chunks_per_token"] == pytest.approx(5 / 7)
    assert agg["output_tokens"] == 7
    # Span from the first intended start (0.0) to the last end (1.0 + 0.5).
    assert agg["output_tok_per_s"] == pytest.approx(7 / 1.5)


def test_bunched_fraction_counts_sub_millisecond_gaps() -> None:
    # Gaps 0.0005 (arrived together), 0.05, 0.0002: 2 of 3 bunched.
    r = _record(0, [0.1, 0.1005, 0.1505, 0.1507], e2e=0.16, tokens=4)
    assert aggregate([r])["itl_bunched_frac"] == pytest.approx(2 / 3)
    assert aggregate([_record(0, [0.1], e2e=0.1, tokens=1)])["itl_bunched_frac"] is None


# ----------------------------------------------------------------- schedule, prompts
def test_poisson_schedule_is_deterministic_and_increasing() -> None:
    one = poisson_schedule(4.0, 50, seed=3)
    assert one == poisson_schedule(4.0, 50, seed=3)
    assert one != poisson_schedule(4.0, 50, seed=4)
    assert all(b > a for a, b in itertools.pairwise(one))
    assert one[0] > 0


def test_poisson_schedule_mean_rate() -> None:
    offsets = poisson_schedule(4.0, 20000, seed=11)
    assert len(offsets) / offsets[-1] == pytest.approx(4.0, rel=0.03)


def test_make_prompts_exact_length_distinct_deterministic() -> None:
    def count(text: str) -> int:
        return len(text.split()) + 3  # a pretend template of 3 tokens

    prompts = make_prompts(count, 5, 20, seed=1)
    assert all(count(p) == 20 for p in prompts)
    assert len(set(prompts)) == 5
    assert prompts == make_prompts(count, 5, 20, seed=1)


def test_parse_sse_line() -> None:
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line('data:{"a": 1}') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == "done"
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("") is None
    assert parse_sse_line("event: message") is None


def test_workload_body() -> None:
    body = Workload(max_tokens=32).body("m", "hi")
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    completions = Workload(endpoint="completions")
    assert completions.body("m", "hi")["prompt"] == "hi"
    assert completions.path == "/v1/completions"


# ----------------------------------------------------------------- SSE against a server
DELAY_S = 0.02


def _chunk(content: str | None, usage: dict[str, int] | None = None) -> str:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    event = {"object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        event["usage"] = usage
    return f"data: {json.dumps(event)}\n\n"


async def chat(request: Request) -> Response:
    body = await request.json()
    if body["messages"][0]["content"] == "fail":
        return JSONResponse({"error": {"message": "busy"}}, status_code=503)

    async def events() -> AsyncIterator[str]:
        yield 'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
        yield ": comment line\n\n"
        for word in ("one", " two", " three"):
            await asyncio.sleep(DELAY_S)
            yield _chunk(word)
        yield _chunk("")  # empty content: not a content chunk
        yield _chunk(None, {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


async def test_closed_loop_parses_stream(server_url: str) -> None:
    records = await run_closed_loop(server_url, "m", ["a", "b", "c"], Workload(), concurrency=2)
    assert [r.index for r in records] == [0, 1, 2]
    for r in records:
        assert r.error is None and r.ok
        assert r.n_chunks == 3
        assert (r.output_tokens, r.prompt_tokens) == (3, 7)
        assert r.chunk_times == sorted(r.chunk_times)
        assert r.ttft == r.chunk_times[0]
        assert r.e2e is not None and r.e2e >= r.chunk_times[-1]
        assert r.actual_start == r.intended_start
        # Chunks are at least the server's sleep apart (a lower bound, not a timing test).
        assert all(gap >= DELAY_S * 0.5 for gap in r.itls())
    agg = aggregate(records)
    assert agg["chunks_per_token"] == pytest.approx(1.0)


async def test_open_loop_uses_intended_start(server_url: str) -> None:
    done: list[RequestRecord] = []
    records = await run_open_loop(
        server_url, "m", ["a", "b", "c", "d"], Workload(), rate=50.0, seed=5, on_done=done.append
    )
    assert len(records) == len(done) == 4
    starts = [r.intended_start for r in records]
    offsets = poisson_schedule(50.0, 4, seed=5)
    assert [s - starts[0] for s in starts] == pytest.approx([o - offsets[0] for o in offsets])
    for r in records:
        assert r.ok
        assert not math.isnan(r.actual_start) and r.actual_start >= r.intended_start - 1e-3


async def test_http_error_is_recorded(server_url: str) -> None:
    records = await run_closed_loop(server_url, "m", ["fail", "a"], Workload(), concurrency=1)
    assert records[0].error is not None and records[0].error.startswith("HTTP 503")
    assert not records[0].ok and records[1].ok
    assert aggregate(records)["errors"] == 1
