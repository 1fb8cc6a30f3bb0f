"""The proxy guard, driven as a raw ASGI middleware around a recording app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from app.api.proxy_guard import GuardOptions, ProxyGuard, middlewares

Headers = list[tuple[bytes, bytes]]


class Recorder:
    """The inner app: records the scope and body it saw, answers 200."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] | None = None
        self.body = b""
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        self.scope = scope
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def drive(
    headers: Headers,
    chunks: list[bytes] | None = None,
    *,
    options: GuardOptions | None = None,
    delay_s: float = 0.0,
    stall: bool = False,
) -> tuple[Recorder, int, dict[bytes, bytes], bytes]:
    app = Recorder()
    guard = ProxyGuard(app, options or GuardOptions())
    pending = list(chunks if chunks is not None else [b""])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not pending:
            await asyncio.sleep(3600 if stall else 0)
            return {"type": "http.disconnect"}
        if delay_s:
            await asyncio.sleep(delay_s)
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending) or stall}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    await guard(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return app, start["status"], dict(start.get("headers", [])), body


def header(app: Recorder, name: bytes) -> list[bytes]:
    assert app.scope is not None
    return [v for k, v in app.scope["headers"] if k == name]


async def test_every_request_gets_a_fresh_gateway_id() -> None:
    one, status, _, _ = await drive([])
    two, _, _, _ = await drive([])
    assert status == 200
    (a,), (b,) = header(one, b"x-request-id"), header(two, b"x-request-id")
    assert a != b and len(a) == 32 and int(a, 16) >= 0
    assert header(one, b"x-switchyard-proxy") == [b"1"]


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ([(b"x-request-id", b"client-42")], b"client-42"),
        ([(b"x-client-request-id", b"abc.DEF:1-2_3")], b"abc.DEF:1-2_3"),
        ([(b"x-request-id", b"a"), (b"x-client-request-id", b"b")], b"b"),
        ([(b"x-request-id", b"x" * 128)], b"x" * 128),
        ([(b"x-request-id", b"x" * 129)], None),
        ([(b"x-request-id", b"evil\r\nSet-Cookie: a=b")], None),
        ([(b"x-request-id", b"\xff\xfe")], None),
        ([(b"x-request-id", b"has space")], None),
        ([(b"x-request-id", b"")], None),
    ],
    ids=["request-id", "client-id", "client-wins", "128", "129", "crlf", "utf8", "space", "empty"],
)
async def test_client_request_ids(sent: Headers, kept: bytes | None) -> None:
    app, status, response, _ = await drive(sent)
    assert status == 200
    (rid,) = header(app, b"x-request-id")
    assert rid not in (v for _, v in sent)  # never the client's value
    assert header(app, b"x-client-request-id") == ([kept] if kept else [])
    assert response.get(b"x-client-request-id") == kept


@pytest.mark.parametrize(
    "name", [b"x-session-id", b"serve_multiplexed_model_id", b"serve-multiplexed-model-id"]
)
async def test_undecodable_ray_headers_are_400_naming_the_header(name: bytes) -> None:
    app, status, response, body = await drive([(name, b"\xc3\x28")])
    assert status == 400 and app.calls == 0
    error = json.loads(body)["error"]
    assert error["param"] == name.decode() and error["code"] == "invalid_header"
    assert len(response[b"x-request-id"]) == 32


async def test_overlong_session_id_is_400() -> None:
    app, status, _, body = await drive([(b"x-session-id", b"s" * 257)])
    assert status == 400 and app.calls == 0
    assert json.loads(body)["error"]["param"] == "x-session-id"


async def test_utf8_session_id_passes() -> None:
    app, status, _, _ = await drive([(b"x-session-id", "séance".encode())])
    assert status == 200 and header(app, b"x-session-id") == ["séance".encode()]


async def test_ray_internal_headers_and_the_mark_are_stripped() -> None:
    sent = [
        (b"x-request-timeout-seconds", b"0.001"),
        (b"x-request-disconnect-disabled", b"?1"),
        (b"x-switchyard-proxy", b"forged"),
        (b"authorization", b"Bearer k"),
    ]
    app, status, _, _ = await drive(sent)
    assert status == 200
    assert header(app, b"x-request-timeout-seconds") == []
    assert header(app, b"x-request-disconnect-disabled") == []
    assert header(app, b"x-switchyard-proxy") == [b"1"]
    assert header(app, b"authorization") == [b"Bearer k"]


async def test_the_body_reaches_the_app_whole() -> None:
    app, status, _, _ = await drive([], [b"ab", b"cd", b"ef"])
    assert status == 200 and app.body == b"abcdef"


@pytest.mark.parametrize(
    ("chunks", "status"),
    [
        ([b"x" * 1024], 200),
        ([b"x" * 1025], 413),
        ([b"x" * 600, b"x" * 600], 413),
        ([b"x" * 600, b"x" * 600, b"x" * 600], 413),
    ],
    ids=["at-limit", "over", "over-in-chunks", "drained"],
)
async def test_body_limit(chunks: list[bytes], status: int) -> None:
    options = GuardOptions(max_body_bytes=1024, drain_bytes=4096)
    app, got, response, body = await drive([], chunks, options=options)
    assert got == status
    if status == 413:
        assert app.calls == 0 and json.loads(body)["error"]["code"] == "request_too_large"
        assert response[b"connection"] == b"close"


async def test_oversized_body_is_read_to_the_end_before_the_413() -> None:
    """Clients that upload before they read (urllib) must find the 413, not a reset."""
    chunks = [b"x" * 600] * 5
    app = Recorder()
    guard = ProxyGuard(app, GuardOptions(max_body_bytes=1024, drain_bytes=1 << 20))
    pending = list(chunks)
    order: list[str] = []

    async def receive() -> dict[str, Any]:
        order.append("read")
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        order.append(message["type"])

    await guard({"type": "http", "headers": []}, receive, send)
    assert order[:5] == ["read"] * 5 and order[5] == "http.response.start"


async def test_drain_stops_at_its_bound() -> None:
    options = GuardOptions(max_body_bytes=1024, drain_bytes=2048)
    _, status, _, _ = await drive([], [b"x" * 1000] * 10, options=options)
    assert status == 413


async def test_slow_body_gets_408() -> None:
    options = GuardOptions(body_timeout_s=0.05)
    app, status, _, body = await drive([], [b"a"], options=options, stall=True)
    assert status == 408 and app.calls == 0
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def test_the_deadline_counts_the_whole_body_not_each_chunk() -> None:
    options = GuardOptions(body_timeout_s=0.1)
    chunks = [b"a"] * 10
    _, status, _, _ = await drive([], chunks, options=options, delay_s=0.03)
    assert status == 408


async def test_client_gone_before_its_body_ends_reaches_no_app() -> None:
    app = Recorder()
    guard = ProxyGuard(app)
    messages = [
        {"type": "http.request", "body": b"a", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await guard({"type": "http", "headers": []}, receive, send)
    assert app.calls == 0 and sent == []


async def test_after_the_body_the_app_still_sees_the_disconnect() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["type"])
        seen.append((await receive())["type"])

    messages = [{"type": "http.request", "body": b"{}"}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    await ProxyGuard(app)({"type": "http", "headers": []}, receive, send)
    assert seen == ["http.request", "http.disconnect"]


async def test_non_http_scopes_pass_through() -> None:
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["type"])

    await ProxyGuard(app)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert calls == ["lifespan"]


def test_ray_callback_builds_the_guard_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_PROXY_MAX_BODY_BYTES", "2048")
    monkeypatch.setenv("SWITCHYARD_BODY_TIMEOUT_S", "7")
    monkeypatch.setenv("SWITCHYARD_HEADER_TIMEOUT_S", "3")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from app.api.proxy_guard import install_header_timeout

    try:
        (mw,) = middlewares()
        assert mw.cls is ProxyGuard
        assert mw.kwargs["options"] == GuardOptions(max_body_bytes=2048, body_timeout_s=7.0)
        assert HttpToolsProtocol._switchyard_header_timeout_s == 3.0  # type: ignore[attr-defined]
    finally:
        install_header_timeout(1e9)


@pytest.fixture
def header_timeout() -> Any:
    from app.api.proxy_guard import install_header_timeout

    install_header_timeout(0.3)
    yield
    install_header_timeout(1e9)  # the patch stays; make it inert for the other tests


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_connection_without_complete_headers_is_closed(
    header_timeout: None, http: str
) -> None:
    import uvicorn

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=http, lifespan="off",
                            log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing sent
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)  # past the deadline: an answered connection stays open
        assert b"HTTP/1.1 200" in await reader.readuntil(b"ok")
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive still works
        await writer.drain()
        assert b"HTTP/1.1 200" in await asyncio.wait_for(reader.readuntil(b"ok"), 5)
        writer.close()
    finally:
        server.should_exit = True
        await task


class Answer:
    """An inner app that answers a fixed response."""

    def __init__(self, status: int, content_type: bytes, body: bytes) -> None:
        self._start = {"type": "http.response.start", "status": status,
                       "headers": [(b"content-type", content_type)]}  # fmt: skip
        self._body = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send(self._start)
        await send({"type": "http.response.body", "body": self._body})


RAY_NO_APP = (
    b"Path '/v1/chat/completions' not found. Ping http://.../-/routes for available routes."
)


@pytest.mark.parametrize(
    ("status", "content_type", "body", "expected"),
    [
        # Ray's proxy with no application on the path (starting, or draining): retryable
        (404, b"text/plain; charset=utf-8", RAY_NO_APP, 503),
        # the app's own 404 (JSON), or another plain 404: untouched
        (404, b"application/json", b'{"error": {"code": "model_not_found"}}', 404),
        (404, b"text/plain", b"nothing here", 404),
        (200, b"text/plain", RAY_NO_APP, 200),
    ],
)
async def test_no_application_is_a_retryable_503(
    status: int, content_type: bytes, body: bytes, expected: int
) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = ProxyGuard(Answer(status, content_type, body), GuardOptions())
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"x-request-id", b"client-1")]}  # fmt: skip
    await guard(scope, receive, send)
    start, *bodies = sent
    assert start["status"] == expected
    headers = dict(start["headers"])
    assert headers[b"x-client-request-id"] == b"client-1"
    got = b"".join(m.get("body", b"") for m in bodies)
    if expected == 503:
        assert headers[b"retry-after"] == b"5" and b"x-request-id" in headers
        error = json.loads(got)["error"]
        assert (error["type"], error["code"]) == ("server_error", "not_ready")
    else:
        assert got == body
