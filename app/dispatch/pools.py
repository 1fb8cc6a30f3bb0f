"""Dispatch to a pool: an LLMServer deployment (a Ray Serve handle) or an external
OpenAI-compatible upstream, behind one ``PoolStream`` shape (``__anext__`` for the next
delta, a synchronous ``cancel`` that stops the work at the pool).

``fallback_reason`` says which failures before the first token may move a request to
its next pool (connection errors, timeouts, overload, 429/5xx from an upstream); a
request the pool refused as invalid is never retried elsewhere.

Embeddings go to a replica in batches of at most ``EMBED_BATCH`` inputs,
``EMBED_CALLS`` batches in flight, the vectors put back in input order. Why: Ray Serve
carries a deployment-handle call over gRPC when ``RAY_SERVE_USE_GRPC_BY_DEFAULT`` is on
(``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` turns it on; ``switchyard serve``, the images and
the manifests set that), and the caller takes a reply of at most
``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH`` bytes (4 MiB by default). A vector
pickles at about 9 bytes per number, so one reply of 2,048 384-d vectors (7 MB) failed
with gRPC's ``RESOURCE_EXHAUSTED`` after the engine had done all the work — a 500. A
batch of 64 stays under 2.5 MB up to 4,096 dimensions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, Protocol

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from app.dispatch.disagg import DisaggregatedPool, open_pd
from app.engine.protocol import EngineNotReady, EngineOverloaded, GenerationDelta
from app.request import InferenceRequest, Prompt
from app.routing.spec import UpstreamPool
from app.routing.table import RouteTable
from app.upstream.openai_upstream import OpenAIUpstream, UpstreamUnavailable

EMBED_BATCH = 64  # inputs per replica call (module docstring)
EMBED_CALLS = 4  # replica calls of one request in flight


class PoolStream(Protocol):
    def __anext__(self) -> Any: ...

    def cancel(self) -> None: ...


class UpstreamStream:
    """An upstream's async generator with a synchronous ``cancel``."""

    def __init__(self, agen: AsyncIterator[GenerationDelta]) -> None:
        self._agen = agen
        self._closing: asyncio.Task[None] | None = None

    async def __anext__(self) -> GenerationDelta:
        return await self._agen.__anext__()

    def cancel(self) -> None:
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None and self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(aclose())


def fallback_reason(exc: BaseException) -> str | None:
    """Why ``exc`` (raised before the first token) lets the request try another pool."""
    cause = getattr(exc, "cause", None)
    for candidate in (exc, cause):
        if isinstance(candidate, UpstreamUnavailable):
            return f"upstream_{candidate.reason}"
        if isinstance(candidate, EngineOverloaded | BackPressureError):
            return "overloaded"
        if isinstance(candidate, EngineNotReady | DeploymentUnavailableError):
            return "unavailable"
        if isinstance(candidate, ConnectionError | TimeoutError):
            return "connection"
        if isinstance(candidate, RayActorError):  # ActorDiedError, ActorUnavailableError
            return "replica_died"
    return None


class AttemptsExhausted(Exception):
    """Every pool tried failed in a retryable way; carries the last failure."""

    def __init__(self, last: BaseException, failures: list[str]) -> None:
        super().__init__(f"all pools failed: {', '.join(failures)}")
        self.last = last
        self.failures = failures


class Pools:
    """The pools of the current route table, for one gateway replica."""

    def __init__(
        self,
        servers: dict[str, Any],
        count_tokens: Callable[[str | None], Callable[[str], int] | None] | None = None,
        disaggregated: dict[str, DisaggregatedPool] | None = None,
    ) -> None:
        self._servers = servers  # deployment name → handle
        self._disaggregated = disaggregated or {}  # by decode deployment
        self._count_tokens = count_tokens or (lambda model: None)
        self._upstreams: dict[str, tuple[UpstreamPool, OpenAIUpstream]] = {}

    def _upstream(self, name: str, spec: UpstreamPool) -> OpenAIUpstream:
        known = self._upstreams.get(name)
        if known is not None and known[0] == spec:
            return known[1]
        client = OpenAIUpstream(name, spec, count_tokens=self._count_tokens(spec.tokenizer))
        self._upstreams[name] = (spec, client)
        return client

    def open(
        self,
        table: RouteTable,
        pool: str,
        request: InferenceRequest,
        attempt: int,
        prompt_tokens: int = 0,
        budget_s: float | None = None,
    ) -> PoolStream:
        """Start dispatch attempt ``attempt`` of ``request`` on ``pool``; an upstream's
        first delta carries ``prompt_tokens`` as its estimate; ``budget_s`` is the time
        the attempt has for its first delta (a disaggregated pool fits its hand-off
        deadlines in it)."""
        deployment = table.deployment(pool)
        if deployment is not None:
            pd = self._disaggregated.get(deployment)
            if pd is not None:
                return open_pd(pd, self._servers, request, attempt, budget_s)
            handle = self._servers[deployment].options(stream=True)
            stream: PoolStream = handle.generate.remote(request, attempt)
            return stream
        spec = table.upstream(pool)
        if spec is None:
            raise UpstreamUnavailable("connect")
        client = self._upstream(pool, spec)
        agen = client.generate(request, attempt, prompt_tokens_estimate=prompt_tokens)
        return UpstreamStream(agen)

    async def embed(
        self, table: RouteTable, pool: str, request: InferenceRequest
    ) -> tuple[list[list[float]], int]:
        """Embeddings of ``request`` from a local pool, in batches (module docstring);
        upstream pools embed nothing here: unavailable, so the request may go to its
        next pool. The first failing batch fails the request and cancels the rest."""
        deployment = table.deployment(pool)
        if deployment is None:
            raise UpstreamUnavailable("not_found", f"pool {pool} serves no embeddings")
        server = self._servers[deployment]
        inputs = request.prompt.inputs or ()
        if len(inputs) <= EMBED_BATCH:
            return await _embed_call(server, request, 0)
        gate = asyncio.Semaphore(EMBED_CALLS)

        async def batch(offset: int) -> tuple[list[list[float]], int]:
            part = replace(request, prompt=Prompt(inputs=inputs[offset : offset + EMBED_BATCH]))
            async with gate:
                return await _embed_call(server, part, offset)

        tasks = [asyncio.ensure_future(batch(i)) for i in range(0, len(inputs), EMBED_BATCH)]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # after a failure (or our cancel): stop the others
                task.cancel()
        return [v for vectors, _ in results for v in vectors], sum(n for _, n in results)

    async def aclose(self) -> None:
        for _, client in self._upstreams.values():
            await client.aclose()


async def _embed_call(
    server: Any, request: InferenceRequest, offset: int
) -> tuple[list[list[float]], int]:
    """One replica call: ``LLMServer.embed`` of ``request``'s inputs, which start at
    input ``offset`` of the client's request (its errors name the client's index)."""
    result: tuple[list[list[float]], int] = await server.embed.remote(request, offset)
    return result
