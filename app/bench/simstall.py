"""The stall rule of the simulated server (:mod:`app.bench.simserver`), and the engine
calls it gates.

A stall (:meth:`Stall.start`, behind ``POST /sim/stall {"seconds": s}``) holds every
response of the server until ``now + s``; a later stall may extend it, never shorten it.
Requests arriving during the stall do not start generating until it ends, and responses
in progress send nothing further until it ends (the engine keeps stepping; held chunks
then leave in a burst). Every request awaits one shared ``asyncio.Event``
(:meth:`Stall.wait`) before it starts and before each chunk or body it sends; an
:class:`EngineCall` awaits it before each delta it yields. An injected stall thus shows
in open-loop p99 and is hidden by a closed loop, whose users simply wait.

An :class:`EngineCall` is one generation request on the engine: its refusal becomes an
HTTP status at once (:meth:`EngineCall.enqueued`), and :meth:`EngineCall.close` aborts
it unless it finished (client gone, error); a streamed response (:class:`CallStream`)
closes its call however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.openai_format import Usage
from app.bench.simrequests import engine_error
from app.engine.protocol import EngineError, GenerationDelta, GenerationRequest
from app.engine.simulated import Clock, SimulatedEngine, Sleep

__all__ = ["CallStream", "EngineCall", "Stall"]


class Stall:
    """The server-wide hold of the stall rule (see the module docstring), on the
    engines' clock (``clock``/``sleep``: the wall clock by default, virtual time in
    tests)."""

    def __init__(self, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self._open = asyncio.Event()
        self._open.set()
        self.until = 0.0  # on ``clock``
        self._release: asyncio.Task[None] | None = None

    def start(self, seconds: float) -> float:
        """Hold everything until ``seconds`` from now (never earlier than a running
        stall ends); returns the seconds left."""
        self.until = max(self.until, self._clock() + seconds)
        if self.remaining() > 0:
            self._open.clear()
            if self._release is None or self._release.done():
                self._release = asyncio.get_running_loop().create_task(self._open_at_end())
        return self.remaining()

    def remaining(self) -> float:
        return max(0.0, self.until - self._clock())

    async def _open_at_end(self) -> None:  # a sleep may end early, or the stall grow: re-check
        while (left := self.remaining()) > 0:
            await self._sleep(left)
        self._open.set()

    async def wait(self) -> None:
        if not self._open.is_set():
            await self._open.wait()


class EngineCall:
    """One engine request: its deltas (each released by the stall) and its usage."""

    def __init__(self, engine: SimulatedEngine, request: GenerationRequest, stall: Stall) -> None:
        self.engine, self.rid, self.stall = engine, request.request_id, stall
        self.gen = engine.generate(request)
        self.first = asyncio.create_task(self._first())
        self.prompt, self.completion, self.cached = len(request.prompt_token_ids), 0, 0

    async def _first(self) -> GenerationDelta:
        return await anext(self.gen)

    async def enqueued(self) -> None:
        """Let the engine enqueue now (it does on the first ``anext``), so a refusal
        becomes an HTTP status without waiting for the first token."""
        await asyncio.sleep(0)  # the task's first step runs the engine's admission checks
        if self.first.done() and not self.first.cancelled():
            exc = self.first.exception()
            if isinstance(exc, EngineError):
                raise engine_error(exc)

    async def deltas(self) -> AsyncGenerator[GenerationDelta, None]:
        delta = await self.first
        while True:
            self.completion += delta.num_new_tokens
            self.prompt = delta.prompt_tokens or self.prompt
            self.cached = delta.cached_prompt_tokens
            await self.stall.wait()
            yield delta
            if delta.finish_reason is not None:
                return
            delta = await anext(self.gen)

    def usage(self) -> Usage:
        return Usage(self.prompt, self.completion, self.cached)

    async def close(self) -> None:
        """Abort the engine request unless it finished (client gone, error)."""
        if not self.first.done():
            self.first.cancel()  # its CancelledError runs the engine's abort as well
        else:
            _ = self.first.cancelled() or self.first.exception()  # mark it retrieved
            await self.gen.aclose()
        await self.engine.abort(self.rid)  # no-op once finished


class CallStream(StreamingResponse):
    """SSE response that closes its iterator and its call however it ends (Starlette
    cancels the iterator when the client disconnects)."""

    def __init__(self, content: AsyncGenerator[str, None], call: EngineCall) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._content, self._call = content, call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._content.aclose()
            await self._call.close()
