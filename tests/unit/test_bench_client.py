"""app.bench.client: SSE timing against servers with known delays, and the
classification of every way a request can fail. Timing assertions are lower bounds
(the delays the server is known to add) with generous upper bounds."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.bench.client import Client, raise_fd_limit, wait_ready
from app.bench.records import RequestRecord, RequestSpec
from app.bench.simserver import SimServerConfig, serve_in_background
from app.bench.virtual_time import VirtualTime
from app.engine.simulated import SimulationProfile

TTFT, ITL = 0.05, 0.02
KNOWN = SimServerConfig(
    profile=SimulationProfile(
        decode_base_s=ITL, decode_s_per_seq=0.0, prefill_s_per_token=0.0, prefill_base_s=TTFT - ITL
    )
)


def _chat(max_tokens: int = 10, model: str = "simulated-llm") -> RequestSpec:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return RequestSpec("chat", body, input_tokens=2, output_tokens=max_tokens)


async def _send(client: Client, spec: RequestSpec, ago: float = 0.0) -> RequestRecord:
    record = RequestRecord(0, spec.kind, spec.endpoint, intended=client.clock() - ago)
    return await client.send(spec, record)


async def _timed(spec: RequestSpec, ago: float = 0.0) -> RequestRecord:
    """One request against the simulated server with the engine and the client on one
    virtual clock (``app.bench.virtual_time``): every time is exact, none is a wall
    clock's."""
    vt = VirtualTime(settle=200)
    async with (
        serve_in_background(KNOWN, clock=vt, sleep=vt.sleep) as url,
        Client(url, clock=vt) as client,
    ):
        sent = asyncio.ensure_future(_send(client, spec, ago))
        while not sent.done():
            await vt.run(sent.done)
        return await sent


async def test_sse_timing_matches_the_known_server_delays() -> None:
    r = await _timed(_chat(10))
    assert r.ok and r.status == 200 and r.opened
    assert r.output_tokens == 10 and len(r.chunks) == 10 and r.prompt_tokens
    # Each chunk is its own event, timed from the send: chunk k at the end of the
    # engine's k-th decode step.
    assert r.ttft == pytest.approx(TTFT)
    assert r.chunks == pytest.approx([TTFT + k * ITL for k in range(10)])
    assert r.itls() == pytest.approx([ITL] * 9)
    assert r.tpot == pytest.approx(ITL)
    assert r.e2e == pytest.approx(TTFT + 9 * ITL)


async def test_latency_counts_from_the_intended_send_time() -> None:
    r = await _timed(_chat(2), ago=0.5)
    assert r.lag == pytest.approx(0.5)  # sent half a second after it was due
    assert r.ttft == pytest.approx(0.5 + TTFT)


async def test_completions_and_kept_text() -> None:
    spec = RequestSpec(
        "completions",
        {"model": "simulated-llm", "prompt": "one two", "max_tokens": 5, "ignore_eos": True},
        input_tokens=2,
        output_tokens=5,
    )
    async with serve_in_background(KNOWN) as url, Client(url, keep_text=True) as client:
        r = await _send(client, spec)
    assert r.ok and r.output_tokens == 5 and len(r.text.split()) == 5


async def test_embeddings_are_timed_to_the_full_body() -> None:
    spec = RequestSpec(
        "embeddings", {"model": "simulated-embed", "input": "a b c"}, 3, 0, kind="embed"
    )
    async with serve_in_background(KNOWN) as url, Client(url) as client:
        r = await _send(client, spec)
    assert r.ok and r.chunks == [] and r.e2e is not None and r.prompt_tokens == 3


async def test_4xx_and_429_are_classified_with_their_status() -> None:
    busy = SimServerConfig(profile=SimulationProfile(max_batch_size=1, max_waiting=1))
    async with serve_in_background(busy) as url, Client(url) as client:
        missing = await _send(client, _chat(model="nope"))
        crowd = await asyncio.gather(*(_send(client, _chat(200)) for _ in range(4)))
    assert (missing.error_kind, missing.status, missing.opened) == ("http_4xx", 404, True)
    assert "nope" in (missing.error or "")
    kinds = sorted(str(r.error_kind) for r in crowd)
    assert kinds.count("http_429") >= 1 and kinds.count("None") >= 1


async def test_connection_refused_is_a_connect_error_that_never_opened() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}") as client:
        r = await _send(client, _chat())
    assert (r.error_kind, r.opened, r.status) == ("connect", False, None)


async def test_a_stalled_server_past_the_timeout_is_a_timeout() -> None:
    async with serve_in_background(KNOWN) as url, Client(url, timeout_s=0.3) as client:
        stall = await client._session.post(url + "/sim/stall", json={"seconds": 1.0})  # type: ignore[union-attr]
        stall.release()
        r = await _send(client, _chat())
    assert r.error_kind == "timeout" and not r.ok


async def _cut(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        await asyncio.sleep(0.01)
        raise RuntimeError("server dies mid-stream")

    return StreamingResponse(body(), media_type="text/event-stream")


async def _error_event(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        yield b'data: {"error":{"message":"engine failed","type":"server_error"}}\n\n'
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _no_content(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _odd_sse(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b": keep-alive comment\n\n"
        yield b"event: message\n"
        yield b'data:{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        await asyncio.sleep(0.05)
        yield b'data:{"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        yield b'data: {"choices":[{"index":0,"delta":{"content":" b"}}]}\n\n'
        yield b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _fail_once(request: Request) -> Response:
    calls = request.app.state.calls = getattr(request.app.state, "calls", 0) + 1
    if calls == 1:
        return Response('{"error":{"message":"engine down"}}', status_code=503)
    return await _odd_sse(request)


@contextlib.asynccontextmanager
async def _serve(app: Starlette) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.mark.parametrize(
    ("handler", "kind"),
    [(_cut, "disconnect"), (_error_event, "stream_error"), (_no_content, "stream_error")],
)
async def test_broken_streams_are_classified(handler: object, kind: str) -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", handler, methods=["POST"])])  # type: ignore[arg-type]
    async with _serve(app) as url, Client(url) as client:
        r = await _send(client, _chat())
    assert r.error_kind == kind and r.opened and r.status == 200 and not r.ok
    assert r.e2e is None and r.ttft is None


async def test_comments_event_lines_and_empty_content_are_not_tokens() -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", _odd_sse, methods=["POST"])])
    async with _serve(app) as url, Client(url, keep_text=True) as client:
        r = await _send(client, _chat())
    assert r.ok and len(r.chunks) == 2 and r.text == "a b"
    assert r.ttft is not None and r.ttft >= 0.05  # the role chunk with "" is not the first token
    assert (r.prompt_tokens, r.output_tokens) == (3, 2)


async def test_a_5xx_is_classified_and_the_client_keeps_working() -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", _fail_once, methods=["POST"])])
    async with _serve(app) as url, Client(url) as client:
        first = await _send(client, _chat())
        second = await _send(client, _chat())
    assert (first.error_kind, first.status) == ("http_5xx", 503) and "engine down" in (
        first.error or ""
    )
    assert second.ok


async def test_wait_ready_raises_an_http_error_at_once() -> None:
    async def models(request: Request) -> Response:
        return Response('{"error":{"message":"no key"}}', status_code=401)

    app = Starlette(routes=[Route("/v1/models", models)])
    async with _serve(app) as url, Client(url) as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(aiohttp.ClientResponseError) as info:
            await wait_ready(client, timeout_s=30.0)
    assert info.value.status == 401
    assert asyncio.get_running_loop().time() - started < 10  # not retried until the deadline


async def test_wait_ready_waits_for_a_ready_probe_that_says_503() -> None:
    answers = iter([503, 503, 200])

    async def models(request: Request) -> Response:
        return Response('{"object":"list","data":[{"id":"m"}]}', media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(status_code=next(answers))

    app = Starlette(routes=[Route("/v1/models", models), Route("/ready", ready)])
    async with _serve(app) as url, Client(url) as client:
        listing = await wait_ready(client, timeout_s=30.0)
        with pytest.raises(StopIteration):
            next(answers)  # all three answers were consumed: it waited for the 200
    assert listing["data"][0]["id"] == "m"


async def test_wait_ready_gives_up_on_a_server_never_ready() -> None:
    async def models(request: Request) -> Response:
        return Response('{"object":"list","data":[]}', media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(status_code=503)

    app = Starlette(routes=[Route("/v1/models", models), Route("/ready", ready)])
    async with _serve(app) as url, Client(url) as client:
        with pytest.raises(TimeoutError, match="still 503"):
            await wait_ready(client, timeout_s=0.3)


def test_raise_fd_limit_reaches_the_hard_limit() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_fd_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
