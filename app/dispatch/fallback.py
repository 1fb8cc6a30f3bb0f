"""Dispatch with bounded fallbacks: the first pool the route decision chose, then its
fallbacks, until one produces the first delta.

Rule: a failure before the first token moves the request to the next pool only when
``fallback_reason`` accepts it (connection, timeout, overload, unavailable, 429/5xx from
an upstream); at most ``max_attempts`` pools, each at most once (the decision lists
them without repeats), within ``total_timeout_s`` for all attempts together. The
request was admitted once, before dispatch, so a fallback never bills twice; the
ledger records the pool that answered and the number of attempts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.dispatch.pools import AttemptsExhausted, Pools, PoolStream, fallback_reason
from app.engine.protocol import GenerationDelta
from app.observability.metrics import GatewayMetrics
from app.routing.table import RouteDecision, RouteTable
from app.serving.llm_server import GeneratePayload


@dataclass
class Dispatched:
    stream: PoolStream | None = None
    first: GenerationDelta | None = None
    pool: str | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)  # "pool:reason" per failed attempt


async def dispatch(
    pools: Pools,
    table: RouteTable,
    decision: RouteDecision,
    payload_for: Callable[[str], GeneratePayload],
    prompt_tokens: int,
    metrics: GatewayMetrics,
    into: Dispatched,
) -> None:
    """Fill ``into`` as attempts proceed (so a cancelled caller can still cancel the live
    stream); raise the non-retryable error, or ``AttemptsExhausted``."""
    limits = table.spec.fallback
    order = [decision.pool, *decision.fallbacks][: limits.max_attempts]
    deadline = time.monotonic() + limits.total_timeout_s
    last: BaseException | None = None
    for pool in order:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        into.attempts += 1
        into.pool = pool
        stream: PoolStream | None = None
        try:
            stream = pools.open(table, pool, payload_for(pool), prompt_tokens)
            into.stream = stream
            into.first = await asyncio.wait_for(stream.__anext__(), left)
            return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            reason = "timeout" if isinstance(exc, TimeoutError) else fallback_reason(exc)
            if stream is not None:
                stream.cancel()
            into.stream = None
            if reason is None:
                raise
            into.failures.append(f"{pool}:{reason}")
            metrics.fallbacks.labels(reason).inc()
            last = exc
    raise AttemptsExhausted(last or TimeoutError("no time left"), into.failures)
