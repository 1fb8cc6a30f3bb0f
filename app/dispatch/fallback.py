"""Dispatch with bounded fallbacks: the first pool the route decision chose, then its
fallbacks, until one produces the first delta (``dispatch``, which returns one
``Answer``: the stream, its first delta and its provenance) or the embeddings
(``dispatch_embed``). Each attempt is written on the request's ``Outcome`` as it
happens (pool, attempts, failures: the ledger and the log line read them, also when
every attempt failed); the results come back up as the return value.

Rule: a failure before the first token moves the request to the next pool only when
``fallback_reason`` accepts it (connection, timeout, overload, unavailable, 429/5xx from
an upstream); at most ``max_attempts`` pools, each at most once (the decision lists
them without repeats), within ``total_timeout_s`` for all attempts together. The
request was admitted once, before dispatch, so a fallback never bills twice; the
ledger records the pool that answered and the number of attempts. A first delta is
told to the pool's replica router (``app.scheduler.views.first_token``): the replica has
computed that prompt.

An embeddings request waits for all of its vectors, not for a first token, and the
engine's work grows with its inputs: its bound is ``total_timeout_s +
embedding_input_s × inputs`` (``embed_timeout_s``; 30 s + 0.05 s × 2,048 = 132.4 s by
default), so a 2,048-input request on a small CPU is not cut off at 30 s (it was: 503
``overloaded`` while the replica was still embedding).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from app.disagg.outcome import PdOutcome
from app.disagg.stream import PdStream
from app.dispatch.pools import AttemptsExhausted, Pools, PoolStream, fallback_reason
from app.engine.protocol import GenerationDelta
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest, Outcome, ReplicaChoice
from app.routing.spec import FallbackLimits
from app.routing.table import RouteDecision, RouteTable
from app.scheduler import views

T = TypeVar("T")


async def _attempts(
    table: RouteTable,
    decision: RouteDecision,
    outcome: Outcome,
    metrics: GatewayMetrics,
    attempt: Callable[[str, float], Awaitable[T]],
    timeout_s: float | None = None,
) -> T:
    """The one attempt loop: ``attempt(pool, seconds_left)`` on each pool in order
    until one returns, all within ``timeout_s`` (default ``total_timeout_s``); a failure
    ``fallback_reason`` accepts moves on, any other is raised. ``outcome`` gets the
    pool, the attempts and each failure as they happen."""
    limits = table.spec.fallback
    order = [decision.pool, *decision.fallbacks][: limits.max_attempts]
    deadline = time.monotonic() + (limits.total_timeout_s if timeout_s is None else timeout_s)
    last: BaseException | None = None
    for pool in order:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        outcome.attempts += 1
        outcome.pool = pool
        try:
            return await attempt(pool, left)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            reason = "timeout" if isinstance(exc, TimeoutError) else fallback_reason(exc)
            if reason is None:
                raise
            outcome.failures.append(f"{pool}:{reason}")
            metrics.fallbacks.labels(reason).inc()
            last = exc
    raise AttemptsExhausted(last or TimeoutError("no time left"), outcome.failures)


@dataclass(frozen=True)
class Answer:
    """What dispatch hands back up (module docstring): the stream that produced the
    first delta, that delta, and where it came from — the pool, how many attempts it
    took, the replica router's choice (``ReplicaNote``) and, from a disaggregated pool,
    how its legs ran."""

    stream: PoolStream
    first: GenerationDelta
    pool: str
    attempts: int
    replica: ReplicaChoice | None = None
    pd: PdOutcome | None = None


async def dispatch(
    pools: Pools,
    table: RouteTable,
    decision: RouteDecision,
    request: InferenceRequest,
    outcome: Outcome,
    metrics: GatewayMetrics,
    prompt_tokens: int = 0,
) -> Answer:
    """The answer of the first pool that produced a first delta; ``prompt_tokens`` is
    the gateway's count (an upstream's first delta carries it). A cancelled caller
    (the client left, its session was cancelled, the replica stops) cancels the running
    attempt's stream here. Raises the non-retryable error, or ``AttemptsExhausted``."""

    async def first_delta(pool: str, left: float) -> tuple[PoolStream, GenerationDelta]:
        stream = pools.open(table, pool, request, outcome.attempts, prompt_tokens, left)
        try:
            first = await asyncio.wait_for(stream.__anext__(), left)
        except BaseException:
            stream.cancel()
            raise
        deployment = table.deployment(pool)
        if deployment is not None:  # its replica router's pending prefill ends
            views.first_token(deployment, request.id)
        return stream, first

    stream, first = await _attempts(table, decision, outcome, metrics, first_delta)
    return Answer(
        stream,
        first,
        outcome.pool or decision.pool,
        outcome.attempts,
        request.replica_note.read(),
        stream.outcome if isinstance(stream, PdStream) else None,
    )


async def dispatch_embed(
    pools: Pools,
    table: RouteTable,
    decision: RouteDecision,
    request: InferenceRequest,
    outcome: Outcome,
    metrics: GatewayMetrics,
) -> tuple[list[list[float]], int]:
    """The vectors and prompt tokens of an embeddings request, from the first pool that
    answers, under the same rule as ``dispatch`` with the time bound of
    ``embed_timeout_s``."""

    async def embed(pool: str, left: float) -> tuple[list[list[float]], int]:
        return await asyncio.wait_for(pools.embed(table, pool, request), left)

    inputs = len(request.prompt.inputs or ())
    timeout_s = embed_timeout_s(table.spec.fallback, inputs)
    return await _attempts(table, decision, outcome, metrics, embed, timeout_s)


def embed_timeout_s(limits: FallbackLimits, inputs: int) -> float:
    """Seconds all attempts of an embeddings request of ``inputs`` inputs have
    (module docstring)."""
    return limits.total_timeout_s + limits.embedding_input_s * inputs
