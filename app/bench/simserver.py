"""An OpenAI-compatible HTTP server over the SIMULATED engine, without Ray.

Everything it answers is a simulation (:mod:`app.engine.simulated`): no weights, no
model, words from a fixed list. It is a light target for calibrating the load generator
and for routing experiments, never for real answers. Endpoints: ``/v1/chat/completions``
and ``/v1/completions`` (SSE with ``stream: true``: a role chunk first for chat, one
chunk per engine delta, a usage chunk with ``stream_options.include_usage``, then
``[DONE]``), ``/v1/embeddings``, ``/v1/models`` (with ``max_model_len``), ``/health``, and
the simulation controls ``POST /sim/stall`` and ``GET /sim/stats``. Bodies and errors
are as in vLLM (:mod:`app.bench.simrequests`): unknown body fields are ignored, a prompt
leaving no room for the requested ``max_tokens`` is a 400 ``context_length_exceeded``, a
full engine queue is a 429; a client that disconnects aborts its engine request.

Timing. An engine step takes ``decode_base_s + decode_s_per_seq * batch``, plus
``prefill_base_s + prefill_s_per_token * uncached prompt tokens`` when it admits requests,
and gives each running request one token (one SSE chunk here). So
``SimulationProfile(prefill_base_s=0.03, prefill_s_per_token=0, decode_base_s=0.02,
decode_s_per_seq=0)`` gives TTFT ≈ 0.05 s and ITL ≈ 0.02 s below ``max_batch_size``
concurrent requests: known delays to check SSE timing against.

Replicas. ``replicas`` engines can stand behind the generation model (round-robin);
with ``replica_speed_spread`` their step times differ slightly, so their steps drift out
of phase as a real pool's do (one engine steps every running stream at the same instant).

Stall. ``POST /sim/stall {"seconds": s}`` (0 <= s <= 3600) holds every response of the
server until ``now + s`` by the stall rule of :mod:`app.bench.simstall`: new requests do
not start and running ones send nothing further until it ends. ``GET /sim/stats``
reports the generation engine's ``running``, ``waiting``, ``finished_total`` and
``aborted_total`` with the server's ``open_streams``, ``requests_received``,
``requests_served`` and ``stalled_s`` (left).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import socket
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

import uvicorn
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api.openai_format import DONE, ResponseHeader, encode_embedding, sse
from app.bench.client import raise_fd_limit
from app.bench.simrequests import (
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    HttpError,
    check_context_length,
    engine_error,
    parse_body,
)
from app.bench.simstall import CallStream, EngineCall, Stall
from app.engine.protocol import EngineError, GenerationRequest
from app.engine.simulated import Clock, SimulatedEngine, SimulationProfile, Sleep
from app.schema import StrictFrozen

__all__ = ["SimServerConfig", "build_sim_app", "run_sim_server"]
__all__ += ["serve_in_background"]

B = TypeVar("B", bound=BaseModel)


class SimServerConfig(StrictFrozen):
    model: str = "simulated-llm"
    embed_model: str = "simulated-embed"
    profile: SimulationProfile = Field(default_factory=SimulationProfile)
    embed_profile: SimulationProfile = Field(default_factory=SimulationProfile)
    replicas: int = Field(default=1, ge=1, le=64)
    """Engines behind the generation model, requests assigned round-robin."""
    replica_speed_spread: float = Field(default=0.0, ge=0.0, le=1.0)
    """Replica k's step times are scaled by 1 + spread * k / (replicas - 1): replicas of a
    real pool are never in phase, and lockstep engines would burst every stream's token
    at the same instant."""

    def replica_profiles(self) -> list[SimulationProfile]:
        n, spread, p = self.replicas, self.replica_speed_spread, self.profile
        out = []
        for k in range(n):
            f = 1.0 + (spread * k / (n - 1) if n > 1 else 0.0)
            out.append(p.model_copy(update={
                "prefill_s_per_token": p.prefill_s_per_token * f,
                "prefill_base_s": p.prefill_base_s * f,
                "decode_base_s": p.decode_base_s * f,
                "decode_s_per_seq": p.decode_s_per_seq * f,
            }))  # fmt: skip
        return out


class _SimServer:
    def __init__(self, config: SimServerConfig, clock: Clock | None = None,
                 sleep: Sleep | None = None) -> None:  # fmt: skip
        self.config = config
        self.engines = [SimulatedEngine(p, clock=clock, sleep=sleep)
                        for p in config.replica_profiles()]  # fmt: skip
        self.engine = self.engines[0]
        self._turn = itertools.cycle(self.engines)
        self.embedder = SimulatedEngine(config.embed_profile, task="embed")
        self.stall = Stall() if clock is None or sleep is None else Stall(clock, sleep)
        self.open_streams = self.received = self.served = 0

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        for engine in (*self.engines, self.embedder):
            await engine.start()
        try:
            yield
        finally:
            for engine in (*self.engines, self.embedder):
                await engine.shutdown()

    async def _parse(self, request: Request, schema: type[B], model: str) -> B:
        self.received += 1
        return await parse_body(request, schema, model)

    async def generate(self, request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        engine = next(self._turn)
        limit = engine.max_model_len
        try:
            body: ChatBody | CompletionBody
            if chat:
                body = await self._parse(request, ChatBody, self.config.model)
                messages = [{"role": m.role, "content": m.text()} for m in body.messages]
                ids = engine.apply_chat_template(messages)
            else:
                body = await self._parse(request, CompletionBody, self.config.model)
                prompt = body.prompt
                if isinstance(prompt, list) and isinstance(prompt[0], int):
                    ids = [int(p) for p in prompt]
                else:
                    ids = engine.tokenize(str(prompt if isinstance(prompt, str) else prompt[0]))
            asked = body.requested_max_tokens()
            check_context_length(len(ids), asked, limit)
            sampling = body.sampling()
            max_tokens = asked or limit - len(ids)
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
            await self.stall.wait()
            engine_request = GenerationRequest(rid, tuple(ids), sampling, max_tokens)
            call = EngineCall(engine, engine_request, self.stall)
            await call.enqueued()
        except HttpError as exc:
            return exc.response()
        header = ResponseHeader("chat" if chat else "completion", rid, int(time.time()), body.model)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return CallStream(self._events(header, call, usage), call)
        try:
            async with contextlib.aclosing(call.deltas()) as deltas:
                parts = [delta async for delta in deltas]
        except EngineError as exc:
            return engine_error(exc).response()
        finally:
            await call.close()
        self.served += 1
        text, finish = "".join(d.text for d in parts), parts[-1].finish_reason or "stop"
        return JSONResponse(header.response(text, finish, call.usage()))

    async def _events(
        self, header: ResponseHeader, call: EngineCall, include_usage: bool
    ) -> AsyncGenerator[str, None]:
        self.open_streams += 1
        try:
            role = header.kind == "chat"  # like vLLM: a role chunk with the first delta
            async with contextlib.aclosing(call.deltas()) as deltas:
                async for delta in deltas:
                    if role:
                        yield sse(header.chunk("", role=True))
                        role = False
                    if delta.text or delta.finish_reason is not None:
                        yield sse(header.chunk(delta.text or None, delta.finish_reason))
            if include_usage:
                yield sse(header.usage_chunk(call.usage()))
            self.served += 1
        except EngineError as exc:
            yield sse(engine_error(exc).body)
        finally:
            self.open_streams -= 1
        yield DONE

    async def embeddings(self, request: Request) -> Response:
        try:
            body = await self._parse(request, EmbeddingBody, self.config.embed_model)
            await self.stall.wait()
            vectors, tokens = await self.embedder.embed(body.inputs())
        except HttpError as exc:
            return exc.response()
        except EngineError as exc:
            return engine_error(exc).response()
        await self.stall.wait()
        self.served += 1
        fmt = body.encoding_format
        data = [
            {"object": "embedding", "index": i, "embedding": encode_embedding(v, fmt)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": body.model, "usage": usage})

    async def models(self, request: Request) -> Response:
        served = ((self.config.model, self.engine), (self.config.embed_model, self.embedder))
        data = [
            {"id": name, "object": "model", "created": int(time.time()), "parent": None,
             "owned_by": "switchyard-sim", "root": e.model_name, "max_model_len": e.max_model_len,
             "task": "embed" if e.supports_embed else "generate"}
            for name, e in served
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def start_stall(self, request: Request) -> Response:
        try:
            seconds = float(json.loads(await request.body())["seconds"])
            if not 0 <= seconds <= 3600:
                raise ValueError(seconds)
        except (ValueError, TypeError, KeyError, IndexError):  # JSONDecodeError is a ValueError
            message = 'Expected a JSON body {"seconds": s} with 0 <= s <= 3600.'
            return HttpError(400, message, "invalid_value", param="seconds").response()
        left = self.stall.start(seconds)
        return JSONResponse({"stalled_until": time.time() + left, "stalled_s": left})

    async def stats(self, request: Request) -> Response:
        stats = [e.stats() for e in self.engines]
        return JSONResponse({
            "running": sum(s.running for s in stats), "waiting": sum(s.waiting for s in stats),
            "finished_total": sum(s.finished_total for s in stats),
            "aborted_total": sum(s.aborted_total for s in stats),
            "replicas": len(stats), "open_streams": self.open_streams,
            "requests_received": self.received, "requests_served": self.served,
            "stalled_s": self.stall.remaining(),
        })  # fmt: skip


def build_sim_app(
    config: SimServerConfig, clock: Clock | None = None, sleep: Sleep | None = None
) -> Starlette:
    """The Starlette app; its lifespan starts and shuts down the simulated engines.
    ``clock``/``sleep``: the generation engines' time (virtual time in tests,
    ``app.bench.virtual_time``); the wall clock by default."""
    sim = _SimServer(config, clock, sleep)
    routes = [
        Route("/v1/chat/completions", sim.generate, methods=["POST"]),
        Route("/v1/completions", sim.generate, methods=["POST"]),
        Route("/v1/embeddings", sim.embeddings, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/health", sim.health, methods=["GET"]),
        Route("/sim/stall", sim.start_stall, methods=["POST"]),
        Route("/sim/stats", sim.stats, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=sim.lifespan)


def _uvicorn_config(
    config: SimServerConfig, host: str, port: int, clock: Clock | None = None,
    sleep: Sleep | None = None,
) -> uvicorn.Config:  # fmt: skip
    has = importlib.util.find_spec
    return uvicorn.Config(
        build_sim_app(config, clock, sleep),
        host=host,
        port=port,
        loop="uvloop" if has("uvloop") else "asyncio",
        http="httptools" if has("httptools") else "h11",
        log_level="warning",
        access_log=False,
        backlog=4096,
        limit_concurrency=None,
        timeout_graceful_shutdown=2,
    )


def run_sim_server(config: SimServerConfig, host: str, port: int) -> None:
    """Serve until interrupted (uvloop and httptools where installed)."""
    raise_fd_limit()
    uvicorn.Server(_uvicorn_config(config, host, port)).run()


class _InProcessServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # leave the host process's signal handlers alone
        yield


@contextlib.asynccontextmanager
async def serve_in_background(
    config: SimServerConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    clock: Clock | None = None,
    sleep: Sleep | None = None,
) -> AsyncIterator[str]:
    """Serve in the running event loop on ``port`` (0: a free one) while the context is
    open; yields the base URL (``http://host:port``, no ``/v1``). ``clock``/``sleep``:
    the engines' time (``build_sim_app``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: accepted sockets inherit it, and asyncio sets TCP_NODELAY
    # only on those (with 0, each SSE chunk would wait for the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    server = _InProcessServer(_uvicorn_config(config, host, port, clock, sleep))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                raise RuntimeError(f"the simulated server did not start: {task.exception()!r}")
            await asyncio.sleep(0.005)
        bound = sock.getsockname()[1]
        yield f"http://[{host}]:{bound}" if ":" in host else f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        sock.close()
