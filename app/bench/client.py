"""The load generator's HTTP client: one request, timed from its SSE stream.

Rules: streaming requests ask for ``stream_options.include_usage`` so output tokens come
from the server's ``usage``; a chunk "carries content" when a choice has non-empty
``delta.content`` (chat) or ``text`` (completions) and only such chunks are timed
(role-only and finish-only chunks are not tokens). A request is complete at ``[DONE]``
(streams) or when the body is read (embeddings). Failures are classified, never
dropped: connect errors (no status line), timeouts, 429, other 4xx, 5xx, an error event
inside the stream, and disconnects (the body ended before ``[DONE]``).

aiohttp is used rather than httpx: it holds 1,000+ concurrent streams from one core.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from app.bench.records import PATHS, ErrorKind, RequestRecord, RequestSpec

Clock = Callable[[], float]


class Client:
    """An aiohttp session against one OpenAI-compatible base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 30.0,
        keep_text: bool = False,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.keep_text = keep_text
        self.clock = clock
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=connect_timeout_s, connect=None
        )
        self._session: aiohttp.ClientSession | None = None
        self.open_streams = 0
        self.max_open_streams = 0

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Client as an async context manager"
        return self._session

    async def get_json(self, path: str) -> Any:
        assert self._session is not None, "use Client as an async context manager"
        async with self._session.get(self.base_url + path) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def send(self, spec: RequestSpec, record: RequestRecord) -> RequestRecord:
        """Send ``spec`` now; fill ``record`` (its ``intended`` is already set)."""
        assert self._session is not None, "use Client as an async context manager"
        record.sent = self.clock()
        body = dict(spec.body)
        if spec.endpoint != "embeddings":
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        try:
            async with self._session.post(
                self.base_url + PATHS[spec.endpoint], json=body, headers=spec.headers or None
            ) as resp:
                record.opened = True
                record.status = resp.status
                if resp.status != 200:
                    text = (await resp.read()).decode(errors="replace")
                    _fail(record, _status_kind(resp.status), f"HTTP {resp.status}: {text}")
                elif spec.endpoint == "embeddings":
                    await self._read_embedding(resp, record)
                else:
                    await self._read_stream(resp, record)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            _fail(record, "timeout", f"{type(exc).__name__}: {exc}")
        except aiohttp.ClientConnectorError as exc:
            _fail(record, "connect", f"{type(exc).__name__}: {exc}")
        except (aiohttp.ClientError, json.JSONDecodeError, OSError) as exc:
            _fail(record, "disconnect", f"{type(exc).__name__}: {exc}")
        return record

    async def _read_embedding(self, resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
        data = await resp.json()
        record.end = self.clock() - record.intended
        usage = data.get("usage") or {}
        record.prompt_tokens = usage.get("prompt_tokens")
        if not data.get("data"):
            _fail(record, "stream_error", "embedding response without data")

    async def _read_stream(self, resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
        """Read the SSE body block by block; every event of a block carries the block's
        arrival time (taken before any parsing)."""
        now, t0 = self.clock, record.intended
        texts: list[str] = []
        done = False
        pending = b""
        self.open_streams += 1
        self.max_open_streams = max(self.max_open_streams, self.open_streams)
        try:
            async for block in resp.content.iter_any():
                arrived = now() - t0
                lines = (pending + block).split(b"\n")
                pending = lines.pop()
                for raw in lines:
                    if not raw.startswith(b"data:"):
                        continue
                    payload = raw[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    if not payload:
                        continue
                    event = json.loads(payload)
                    if "error" in event:
                        _fail(record, "stream_error", json.dumps(event["error"]))
                        return
                    text = _content(event)
                    if text:
                        record.chunks.append(arrived)
                        if self.keep_text:
                            texts.append(text)
                    usage = event.get("usage")
                    if usage:
                        record.output_tokens = usage.get("completion_tokens")
                        record.prompt_tokens = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        record.cached_tokens = details.get("cached_tokens")
                if done:
                    break
        finally:
            self.open_streams -= 1
        if not done:
            _fail(record, "disconnect", "stream ended before [DONE]")
            return
        record.end = now() - t0
        record.text = "".join(texts)
        if not record.chunks:
            _fail(record, "stream_error", "no content chunk")


def _content(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        text += (delta.get("content") or "") if delta is not None else (choice.get("text") or "")
    return text


def _status_kind(status: int) -> ErrorKind:
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


def _fail(record: RequestRecord, kind: ErrorKind, message: str) -> None:
    record.error_kind = kind
    record.error = message[:300]
    record.end = None


def raise_fd_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit; returns the
    soft limit now in force (unchanged where the system refuses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def wait_ready(client: Client, timeout_s: float = 60.0) -> dict[str, Any]:
    """Poll ``GET /v1/models`` until the server answers, then ``GET /ready`` (Switchyard's
    readiness probe: 200 once a generation went through; a server without it answers 404
    and is taken as ready) until it is 200; return the model listing. Connection failures
    and a 503 from ``/ready`` are retried until ``timeout_s``; any other HTTP error
    status (401, 404 on the listing…) is raised at once."""
    deadline = time.monotonic() + timeout_s
    listing: dict[str, Any] | None = None
    while True:
        try:
            if listing is None:
                listing = await client.get_json("/v1/models")
            async with client.session.get(client.base_url + "/ready") as resp:
                if resp.status != 503:
                    return listing
        except aiohttp.ClientResponseError:
            raise
        except (aiohttp.ClientError, OSError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{client.base_url}/ready still 503 after {timeout_s:g} s")
        await asyncio.sleep(0.5)
