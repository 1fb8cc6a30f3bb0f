"""The proxy guard: an ASGI middleware that runs inside Ray Serve's HTTP proxy, before
Ray reads a single header, and makes every request safe to hand to a replica.

Installed with ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=app.api.proxy_guard:middlewares``
in the environment of whatever starts Ray (``make run``, the integration tests, the Ray
containers of a RayService). Rules, in order:

1. Request id: every request gets a fresh gateway id in ``x-request-id`` (32 hex
   characters), the one key of its response id, logs, engine request ids and ledger
   record. A client's own ``x-request-id`` or ``x-client-request-id`` is kept as
   ``x-client-request-id`` when it is a sane token (``CLIENT_ID_PATTERN``: 1–128 of
   ``[A-Za-z0-9._:-]``) and echoed on the response; otherwise it is dropped and the
   replacement logged (never reflected, so CR/LF cannot reach a response).
2. Headers Ray itself decodes as UTF-8 (the session id and multiplexed model id) must
   be valid UTF-8 of at most ``MAX_ID_HEADER_BYTES``: else 400 naming the header.
3. Ray's internal per-request headers (``x-request-timeout-seconds``,
   ``x-request-disconnect-disabled``) are removed: clients cannot set Ray's timeouts.
4. The body is read here, completely, before the request reaches Ray's router:
   a body over ``max_body_bytes`` is answered 413 once the client has sent it (read
   and discarded up to ``drain_bytes``, so clients that upload before they read, like
   ``urllib``, see the 413 and not a reset); a body that has not fully arrived within
   ``body_timeout_s`` of the request's start is answered 408. A slow upload so holds
   a coroutine in the proxy, never a replica's ``max_ongoing_requests`` slot.

5. Headers: uvicorn (Ray's HTTP server) has no deadline for a request's headers, so a
   connection that sends them slowly, or never, is held forever. ``install_header_timeout``
   gives each new connection ``header_timeout_s`` to complete its first request's headers,
   then closes it (no response: there is no request to answer); a connection idle after a
   response is closed by Ray's ``keep_alive_timeout_s``.

6. No application: while no application serves the path — the app is starting, or
   draining on its way down (``switchyard serve``'s SIGTERM deletes it while the proxy
   still answers) — Ray's proxy answers a plain-text ``404 Path '…' not found``. The
   guard turns exactly that answer into a retryable ``503`` with ``Retry-After``
   (``not_ready``); any other 404 (the app's own) passes untouched.

Every refusal has the API's error shape ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("switchyard.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REQUEST_ID = b"x-request-id"
CLIENT_REQUEST_ID = b"x-client-request-id"
GUARD_MARK = b"x-switchyard-proxy"  # set by the guard; a client's copy is removed
CLIENT_ID_PATTERN = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
MAX_ID_HEADER_BYTES = 256
# Headers Ray Serve's proxy decodes as UTF-8 (an undecodable one was a bare 500).
UTF8_HEADERS = (b"x-session-id", b"serve_multiplexed_model_id", b"serve-multiplexed-model-id")
# Ray Serve's per-request controls: never from a client.
RAY_INTERNAL_HEADERS = (b"x-request-timeout-seconds", b"x-request-disconnect-disabled")


@dataclass(frozen=True)
class GuardOptions:
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float = 30.0
    drain_bytes: int = 64 * 1024 * 1024  # discard at most this much of an oversized body


def new_request_id() -> str:
    return uuid.uuid4().hex


def _error(status: int, message: str, code: str, param: str | None = None) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}
    return json.dumps(body).encode()


async def _respond(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class ProxyGuard:
    def __init__(self, app: ASGIApp, options: GuardOptions | None = None) -> None:
        self._app = app
        self._options = options or GuardOptions()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        rid = new_request_id()
        headers, client_id, bad = self._headers(scope.get("headers", []), rid)
        echo = [(REQUEST_ID, rid.encode())]
        if client_id is not None:
            echo.append((CLIENT_REQUEST_ID, client_id))
        if bad is not None:
            await _respond(send, 400, bad, echo)
            return
        scope = dict(scope, headers=headers)
        body = await self._read_body(receive, started, send, echo)
        if body is None:
            return
        replay = _Replay(body, receive)
        await self._app(scope, replay, _NoAppAnswer(send, echo, client_id))

    def _headers(
        self, raw: list[tuple[bytes, bytes]], rid: str
    ) -> tuple[list[tuple[bytes, bytes]], bytes | None, bytes | None]:
        """(the headers to pass on, the client's sane id, an error body or None)."""
        out: list[tuple[bytes, bytes]] = []
        client_id: bytes | None = None
        offered: bytes | None = None
        for name, value in raw:
            lname = name.lower()
            if lname in (REQUEST_ID, CLIENT_REQUEST_ID):
                if lname == CLIENT_REQUEST_ID or offered is None:
                    offered = value
                continue
            if lname in RAY_INTERNAL_HEADERS or lname == GUARD_MARK:
                continue
            if lname in UTF8_HEADERS:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    param = lname.decode()
                    msg = f"The `{param}` header is not valid UTF-8."
                    return out, None, _error(400, msg, "invalid_header", param)
                if len(value) > MAX_ID_HEADER_BYTES:
                    param = lname.decode()
                    msg = f"The `{param}` header is longer than {MAX_ID_HEADER_BYTES} bytes."
                    return out, None, _error(400, msg, "invalid_header", param)
            out.append((name, value))
        if offered is not None:
            if CLIENT_ID_PATTERN.match(offered):
                client_id = offered
            else:
                log.warning(
                    "request %s: client request id dropped (not a token of 1-128 "
                    "[A-Za-z0-9._:-]; %d bytes)", rid, len(offered)
                )
        out.append((REQUEST_ID, rid.encode()))
        if client_id is not None:
            out.append((CLIENT_REQUEST_ID, client_id))
        out.append((GUARD_MARK, b"1"))
        return out, client_id, None

    async def _read_body(
        self, receive: Receive, started: float, send: Send, echo: list[tuple[bytes, bytes]]
    ) -> list[Message] | None:
        """The request's body messages, or None once a 408/413 has been sent."""
        o = self._options
        messages: list[Message] = []
        size = 0
        too_large = False
        while True:
            left = o.body_timeout_s - (time.monotonic() - started)
            try:
                if left <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except TimeoutError:
                msg = f"The request body did not arrive within {o.body_timeout_s:g} s."
                await _respond(send, 408, _error(408, msg, "request_timeout"), echo)
                return None
            if message["type"] == "http.disconnect":
                return None  # the client left before its body was complete
            size += len(message.get("body", b""))
            if size > o.max_body_bytes:
                too_large = True
                messages.clear()
            elif not too_large:
                messages.append(message)
            more = bool(message.get("more_body", False))
            if too_large and (not more or size > o.drain_bytes):
                msg = f"Request body exceeds the limit of {o.max_body_bytes} bytes."
                await _respond(send, 413, _error(413, msg, "request_too_large"), echo)
                return None
            if not more:
                return messages


NO_APP_PREFIX = b"Path '"  # Ray's proxy: "Path '<path>' not found. Ping …/-/routes …"
NO_APP_RETRY_AFTER_S = 5


def no_app_body() -> bytes:
    """The 503 body for a path no application serves (here and in HAProxy's config)."""
    msg = "No application serves this path right now (starting or stopping); retry."
    error = {"message": msg, "type": "server_error", "param": None, "code": "not_ready"}
    return json.dumps({"error": error}).encode()


class _NoAppAnswer:
    """``send`` for the app: adds the client's id to the response, and replaces Ray's
    own plain-text "no application serves this path" 404 by a retryable 503 (rule 6).
    Only a 404 start with a plain-text body is held until its body is seen."""

    def __init__(
        self, send: Send, echo: list[tuple[bytes, bytes]], client_id: bytes | None
    ) -> None:
        self._send = send
        self._echo = echo
        self._client_id = client_id
        self._held: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self._client_id is not None:
                message = dict(message)
                message["headers"] = [
                    *message.get("headers", []), (CLIENT_REQUEST_ID, self._client_id)
                ]
            if message.get("status") == 404 and _plain_text(message):
                self._held = message
                return
        elif self._held is not None and message["type"] == "http.response.body":
            held, self._held = self._held, None
            if message.get("body", b"").startswith(NO_APP_PREFIX):
                retry = [(b"retry-after", str(NO_APP_RETRY_AFTER_S).encode())]
                await _respond(self._send, 503, no_app_body(), [*self._echo, *retry])
                return
            await self._send(held)
        await self._send(message)


def _plain_text(message: Message) -> bool:
    for name, value in message.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.startswith(b"text/plain"))
    return False


class _Replay:
    """``receive`` for the app: the buffered body first, then the client's own
    messages (so a disconnect is still seen)."""

    def __init__(self, messages: list[Message], receive: Receive) -> None:
        self._messages = messages
        self._receive = receive

    async def __call__(self) -> Message:
        if self._messages:
            return self._messages.pop(0)
        return await self._receive()


def install_header_timeout(seconds: float) -> None:
    """Make uvicorn's HTTP protocols close a connection whose first request's headers
    have not all arrived ``seconds`` after it opened (idempotent; the latest value wins)."""
    from uvicorn.protocols.http import h11_impl, httptools_impl

    protocols: tuple[Any, ...] = (httptools_impl.HttpToolsProtocol, h11_impl.H11Protocol)
    for proto in protocols:
        proto._switchyard_header_timeout_s = seconds
        if getattr(proto, "_switchyard_patched", False):
            continue
        original = proto.connection_made

        def connection_made(self: Any, transport: Any, _original: Any = original) -> None:
            _original(self, transport)
            deadline = type(self)._switchyard_header_timeout_s
            self.loop.call_later(deadline, _close_if_headless, self)

        proto.connection_made = connection_made
        proto._switchyard_patched = True


def _close_if_headless(protocol: Any) -> None:
    if protocol.cycle is None and not protocol.transport.is_closing():
        log.info("closing a connection whose request headers did not arrive in time")
        protocol.transport.close()


def middlewares() -> list[Any]:
    """Ray Serve's HTTP-proxy callback: the guard, configured from the settings (and the
    header deadline installed in the proxy's uvicorn)."""
    from starlette.middleware import Middleware

    from app.settings import load_settings

    s = load_settings()
    install_header_timeout(s.header_timeout_s)
    options = GuardOptions(max_body_bytes=s.proxy_max_body_bytes, body_timeout_s=s.body_timeout_s)
    return [Middleware(ProxyGuard, options=options)]
