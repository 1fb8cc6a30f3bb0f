"""Bounded fallbacks: order, the attempt bound, the time bound, no loop, and which
failures move a request on (table-driven against a scripted pool set)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.dispatch.fallback import Answer, dispatch, dispatch_embed, embed_timeout_s
from app.dispatch.pools import AttemptsExhausted
from app.engine.protocol import EngineOverloaded, GenerationDelta, InvalidRequest
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest, Outcome
from app.routing.spec import FallbackLimits, RoutesSpec
from app.routing.table import RouteRequest, RouteTable
from app.upstream.openai_upstream import UpstreamUnavailable
from tests.request_helpers import embedding, inference

FIRST = GenerationDelta("hi", 1)


class _Stream:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.cancelled = False

    async def __anext__(self) -> GenerationDelta:
        if isinstance(self.outcome, tuple):  # (seconds, then this exception)
            await asyncio.sleep(self.outcome[0])
            raise self.outcome[1]
        if isinstance(self.outcome, float):
            await asyncio.sleep(self.outcome)
            return FIRST
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return FIRST

    def cancel(self) -> None:
        self.cancelled = True


class _Pools:
    """Each pool answers with its scripted outcome: a delta, an exception or a delay."""

    def __init__(self, script: dict[str, Any]) -> None:
        self.script = script
        self.opened: list[str] = []
        self.attempts: list[tuple[str, int]] = []
        self.budgets: list[float | None] = []
        self.streams: list[_Stream] = []

    def open(
        self,
        table: Any,
        pool: str,
        request: InferenceRequest,
        attempt: int,
        prompt_tokens: int,
        budget_s: float | None = None,
    ) -> _Stream:
        self.opened.append(pool)
        self.budgets.append(budget_s)
        self.attempts.append((request.engine_id(attempt), prompt_tokens))
        stream = _Stream(self.script[pool])
        self.streams.append(stream)
        return stream

    async def embed(
        self, table: Any, pool: str, request: InferenceRequest
    ) -> tuple[list[list[float]], int]:
        self.opened.append(pool)
        answer = self.script[pool]
        if isinstance(answer, float):
            await asyncio.sleep(answer)
        if isinstance(answer, BaseException):
            raise answer
        return [[1.0]], 3


def _table(
    max_attempts: int = 3, total_timeout_s: float = 5.0, embedding_input_s: float = 0.05
) -> RouteTable:
    spec = RoutesSpec.model_validate(
        {
            "pools": {p: {"kind": "local", "model": "m"} for p in ("a", "b", "c", "d")},
            "models": {"m": {"pool": "a", "fallbacks": ["b", "c", "d", "b"]}},
            "fallback": {
                "max_attempts": max_attempts,
                "total_timeout_s": total_timeout_s,
                "embedding_input_s": embedding_input_s,
            },
        }
    )
    return RouteTable(1, spec)


REQUEST = inference("r", prompt_text="x")
DOWN = UpstreamUnavailable("connect")


async def _run(
    script: dict[str, Any], table: RouteTable
) -> tuple[Outcome, _Pools, GenerationDelta, Answer]:
    pools = _Pools(script)
    decision = table.decide(RouteRequest("m"))
    assert decision is not None
    outcome = Outcome("completion")
    answer = await dispatch(
        pools, table, decision, REQUEST, outcome, GatewayMetrics([]), 7  # type: ignore[arg-type]
    )
    return outcome, pools, answer.first, answer


@pytest.mark.parametrize(
    ("script", "opened", "answered", "failures"),
    [
        ({"a": FIRST}, ["a"], "a", []),
        ({"a": DOWN, "b": FIRST}, ["a", "b"], "b", ["a:upstream_connect"]),
        ({"a": EngineOverloaded("x"), "b": DOWN, "c": FIRST}, ["a", "b", "c"], "c",
         ["a:overloaded", "b:upstream_connect"]),
    ],
)  # fmt: skip
async def test_fallback_order(
    script: dict[str, Any], opened: list[str], answered: str, failures: list[str]
) -> None:
    outcome, pools, first, answer = await _run(script, _table())
    assert pools.opened == opened
    assert (outcome.pool, outcome.attempts, outcome.failures, first) == (
        answered,
        len(opened),
        failures,
        FIRST,
    )
    assert all(s.cancelled for s in pools.streams[:-1]) and not pools.streams[-1].cancelled
    # one engine id per attempt, from the gateway's id; the gateway's prompt count
    assert pools.attempts == [(f"r-{n}", 7) for n in range(1, len(opened) + 1)]
    # the answer: the stream that produced the first delta, and where it came from
    assert answer.stream is pools.streams[-1]
    assert (answer.pool, answer.attempts) == (answered, len(opened))


async def test_the_attempt_bound_and_no_pool_twice() -> None:
    with pytest.raises(AttemptsExhausted) as info:
        await _run({p: DOWN for p in "abcd"}, _table(max_attempts=10))
    # the decision lists b once even though the routes list it twice: a, b, c, d
    assert [f.split(":")[0] for f in info.value.failures] == ["a", "b", "c", "d"]
    with pytest.raises(AttemptsExhausted) as bounded:
        await _run({p: DOWN for p in "abcd"}, _table(max_attempts=2))
    assert len(bounded.value.failures) == 2


async def test_the_time_bound_covers_all_attempts() -> None:
    with pytest.raises(AttemptsExhausted) as info:
        await _run({"a": 1.0, "b": 1.0, "c": FIRST}, _table(total_timeout_s=0.2))
    assert info.value.failures == ["a:timeout"]  # no time left for b and c


async def test_each_attempt_is_told_the_time_it_has_left() -> None:
    script = {"a": (0.1, EngineOverloaded("x")), "b": FIRST}
    _, pools, _, _ = await _run(script, _table(total_timeout_s=0.5))
    a, b = pools.budgets
    assert a is not None and b is not None
    assert 0.45 < a <= 0.5 and b <= a - 0.1  # b gets what a left


async def test_a_request_the_pool_refused_is_not_retried() -> None:
    pools = _Pools({"a": InvalidRequest("bad"), "b": FIRST})
    table = _table()
    decision = table.decide(RouteRequest("m"))
    assert decision is not None
    with pytest.raises(InvalidRequest):
        await dispatch(
            pools, table, decision, REQUEST, Outcome("completion"), GatewayMetrics([])  # type: ignore[arg-type]
        )
    assert pools.opened == ["a"]


@pytest.mark.parametrize(
    ("script", "opened", "failures"),
    [
        ({"a": 0.0}, ["a"], []),
        ({"a": DOWN, "b": EngineOverloaded("x"), "c": 0.0}, ["a", "b", "c"],
         ["a:upstream_connect", "b:overloaded"]),
    ],
)  # fmt: skip
async def test_embeddings_take_the_same_fallbacks(
    script: dict[str, Any], opened: list[str], failures: list[str]
) -> None:
    pools, table = _Pools(script), _table()
    decision = table.decide(RouteRequest("m"))
    assert decision is not None
    outcome = Outcome("embeddings")
    vectors, tokens = await dispatch_embed(
        pools, table, decision, embedding(["x"]), outcome, GatewayMetrics([])  # type: ignore[arg-type]
    )
    assert (vectors, tokens) == ([[1.0]], 3)
    assert (pools.opened, outcome.failures, outcome.pool) == (opened, failures, opened[-1])


async def test_an_embedding_the_pool_refused_is_not_retried() -> None:
    pools, table = _Pools({"a": InvalidRequest("bad"), "b": 0.0}), _table()
    decision = table.decide(RouteRequest("m"))
    assert decision is not None
    with pytest.raises(InvalidRequest):
        await dispatch_embed(
            pools, table, decision, embedding(["x"]), Outcome("embeddings"), GatewayMetrics([])  # type: ignore[arg-type]
        )
    assert pools.opened == ["a"]


@pytest.mark.parametrize(
    ("limits", "inputs", "seconds"),
    [
        ({}, 1, 30.05),
        ({}, 2048, 30 + 0.05 * 2048),  # OpenAI's cap: 132.4 s, not 30
        ({"total_timeout_s": 10, "embedding_input_s": 0.5}, 4, 12.0),
        ({"embedding_input_s": 0}, 2048, 30.0),  # off: the generation bound
        ({}, 0, 30.0),
    ],
)  # fmt: skip
def test_the_embeddings_bound_grows_with_the_inputs(
    limits: dict[str, float], inputs: int, seconds: float
) -> None:
    assert embed_timeout_s(FallbackLimits.model_validate(limits), inputs) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("embedding_input_s", "answered"),
    [(0.2, True), (0.0, False)],
)  # fmt: skip
async def test_an_embedding_longer_than_total_timeout_s_is_awaited_per_input(
    embedding_input_s: float, answered: bool
) -> None:
    """3 inputs, a pool that takes 0.3 s, total_timeout_s 0.1: with 0.2 s per input the
    bound is 0.7 s and the vectors come back; without, the request times out."""
    table = _table(max_attempts=1, total_timeout_s=0.1, embedding_input_s=embedding_input_s)
    pools, decision = _Pools({"a": 0.3}), table.decide(RouteRequest("m"))
    assert decision is not None
    outcome = Outcome("embeddings")
    run = dispatch_embed(
        pools, table, decision, embedding(["x", "y", "z"]), outcome, GatewayMetrics([])  # type: ignore[arg-type]
    )
    if answered:
        assert await run == ([[1.0]], 3)
    else:
        with pytest.raises(AttemptsExhausted):
            await run
        assert outcome.failures == ["a:timeout"]


def test_a_negative_per_input_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        FallbackLimits.model_validate({"embedding_input_s": -1})


async def test_the_first_delta_ends_the_prompts_pending_prefill_at_its_replica_router() -> None:
    """The pool's replica router counts the prompt as prefilling on its replica until
    the first delta comes back (app.scheduler.plugins.prefill); a pool that failed
    first keeps nothing pending (its leg ended: Ray reports it completed)."""
    from app.routing.table import LocalModel
    from app.scheduler.config import ReplicaRouting
    from app.scheduler.loop import Scheduler
    from app.scheduler.state import RoutedRequest
    from app.scheduler.views import register

    spec = RoutesSpec.model_validate(
        {"pools": {"a": {"kind": "local", "model": "m"}}, "models": {"m": {"pool": "a"}}}
    )
    table = RouteTable(1, spec, local={"m": LocalModel("LLMServer-prefill-test", "generate", 128)})
    s = Scheduler(ReplicaRouting())
    s.set_replicas(["r0", "r1"])
    register("LLMServer-prefill-test", s)
    s.routed("ray-1", RoutedRequest(REQUEST.id, prompt_tokens=300), "r0")
    assert s.ctx.prefill.pending(["r0", "r1"]) == [300, 0]
    decision = table.decide(RouteRequest("m"))
    assert decision is not None
    await dispatch(_Pools({"a": FIRST}), table, decision, REQUEST, Outcome("completion"),  # type: ignore[arg-type]
                   GatewayMetrics([]))  # fmt: skip
    assert s.ctx.prefill.pending(["r0", "r1"]) == [0, 0]
    assert s.ctx.book.in_flight("r0") == 1  # still running: Ray has not reported it done
