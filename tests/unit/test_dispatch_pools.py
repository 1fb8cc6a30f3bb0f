from __future__ import annotations

import asyncio

import cloudpickle
import pytest
from ray.serve._private.constants import RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
from ray.serve.exceptions import BackPressureError

from app.dispatch.pools import EMBED_BATCH, EMBED_CALLS, Pools, fallback_reason
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)
from app.request import InferenceRequest
from app.routing.spec import RoutesSpec
from app.routing.table import LocalModel, RouteTable
from app.upstream.openai_upstream import UpstreamStreamError, UpstreamUnavailable
from tests.request_helpers import embedding


class _Wrapped(Exception):
    """Ray's wrapper of a remote exception: the original is in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("remote")
        self.cause = cause


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (UpstreamUnavailable("status_503"), "upstream_status_503"),
        (UpstreamUnavailable("connect"), "upstream_connect"),
        (EngineOverloaded("full"), "overloaded"),
        (BackPressureError(num_queued_requests=1, max_queued_requests=1), "overloaded"),
        (EngineNotReady("starting"), "unavailable"),
        (ConnectionResetError(), "connection"),
        (_Wrapped(EngineOverloaded("full")), "overloaded"),
        # the client's fault, or too late to move: never retried elsewhere
        (InvalidRequest("bad"), None),
        (ContextLengthExceeded("long"), None),
        (UpstreamStreamError("mid-stream"), None),
        (ValueError("bug"), None),
    ],
)
def test_fallback_reason(exc: BaseException, reason: str | None) -> None:
    assert fallback_reason(exc) == reason


# ---- embeddings in batches ---------------------------------------------------------------


class _TooLarge(Exception):
    """What Ray's gRPC transport raises for a reply over its limit (RESOURCE_EXHAUSTED)."""


class _Embedder:
    """A replica's ``embed`` behind a handle: each reply is pickled as Ray's gRPC
    transport does and refused above Ray's limit; vector i of the client's request
    says i."""

    def __init__(self, dim: int = 384, fail_at: int | None = None) -> None:
        self.dim = dim
        self.fail_at = fail_at
        self.batches: list[tuple[int, int]] = []  # (offset, inputs)
        self.running = 0
        self.most = 0
        self.cancelled = 0
        self.embed = self  # handle.embed.remote(...)

    async def remote(self, request: InferenceRequest, offset: int) -> tuple[list[list[float]], int]:
        inputs = request.prompt.inputs or ()
        self.batches.append((offset, len(inputs)))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01 if offset != self.fail_at else 0)
            if offset == self.fail_at:
                raise EngineOverloaded("full")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        reply = ([[float(offset + i)] * self.dim for i in range(len(inputs))], len(inputs))
        if len(cloudpickle.dumps(reply)) > RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH:
            raise _TooLarge
        return reply


def _embed_table() -> RouteTable:
    spec = RoutesSpec.model_validate(
        {"pools": {"e": {"kind": "local", "model": "emb"}}, "models": {"emb": {"pool": "e"}}}
    )
    return RouteTable(1, spec, {"emb": LocalModel("LLMServer-emb", "embed", 256)})


def test_one_reply_of_2048_vectors_is_over_rays_grpc_limit() -> None:
    """The cause of the 500 (issue 31): the whole answer in one reply does not fit,
    a batch does, up to 4,096 dimensions."""
    whole = ([[0.123456789] * 384 for _ in range(2048)], 2048)
    batch = ([[0.123456789] * 4096 for _ in range(EMBED_BATCH)], EMBED_BATCH)
    limit = RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
    assert len(cloudpickle.dumps(whole)) > limit > len(cloudpickle.dumps(batch))


@pytest.mark.parametrize("n", [1, EMBED_BATCH, EMBED_BATCH + 1, 2048])
async def test_embeddings_go_in_batches_and_come_back_in_order(n: int) -> None:
    server = _Embedder()
    pools = Pools({"LLMServer-emb": server})
    vectors, tokens = await pools.embed(_embed_table(), "e", embedding([f"x{i}" for i in range(n)]))
    assert [v[0] for v in vectors] == [float(i) for i in range(n)]
    assert tokens == n
    assert all(size <= EMBED_BATCH for _, size in server.batches)
    assert sorted(offset for offset, _ in server.batches) == list(range(0, n, EMBED_BATCH))
    assert server.most <= EMBED_CALLS


async def test_a_failing_batch_fails_the_request_and_cancels_the_rest() -> None:
    server = _Embedder(fail_at=0)
    pools = Pools({"LLMServer-emb": server})
    with pytest.raises(EngineOverloaded):  # the batch's own error: fallbacks read it
        await pools.embed(_embed_table(), "e", embedding(["x"] * 2048))
    await asyncio.sleep(0.05)
    assert server.cancelled >= 1 and server.running == 0
    assert len(server.batches) < 2048 // EMBED_BATCH  # the queued ones never started
