"""GPU-time attribution (app.engine.gpu_time): each step's time split across its
requests by their weighted tokens — the rule by hand, the step-cost fit, and the
simulated engine (virtual clock) charging its own steps: the charges add up to the
engine's busy time, a prefix-cache hit costs less, the P/D legs add up."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from app.disagg.stream import _billed_as_prefilled
from app.engine.gpu_time import GpuTimeBook, StepCostFit, Work, fit
from app.engine.protocol import GenerationDelta, GenerationRequest, KvHandoff, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile, VirtualClock

# ---------------------------------------------------------------- the rule by hand

SPLITS = [
    # (step seconds, work per request, c_p, c_d, expected charges)
    pytest.param(1.0, {"a": Work(0, 1), "b": Work(0, 1)}, 1.0, 1.0, {"a": 0.5, "b": 0.5},
                 id="two-decodes-share-equally"),
    pytest.param(1.0, {"a": Work(30, 0), "b": Work(0, 1), "c": Work(0, 1)}, 1.0, 1.0,
                 {"a": 30 / 32, "b": 1 / 32, "c": 1 / 32}, id="prefill-tokens-weigh-by-count"),
    pytest.param(0.8, {"a": Work(10, 0), "b": Work(0, 1)}, 0.1, 1.0,
                 {"a": 0.8 * 1 / 2, "b": 0.8 * 1 / 2}, id="cheap-prompt-tokens"),
    pytest.param(0.2, {"a": Work(0, 1), "b": Work(0, 1)}, 0.001, 0.0, {"a": 0.1, "b": 0.1},
                 id="free-decode-tokens-still-share-a-decode-step"),
    pytest.param(0.3, {"a": Work(4, 1), "b": Work(0, 2)}, 0.5, 1.0,
                 {"a": 0.3 * 3 / 5, "b": 0.3 * 2 / 5}, id="mixed-prefill-and-decode"),
]  # fmt: skip


@pytest.mark.parametrize(("seconds", "work", "c_p", "c_d", "expected"), SPLITS)
def test_a_step_is_split_by_weighted_tokens(
    seconds: float, work: dict[str, Work], c_p: float, c_d: float, expected: dict[str, float]
) -> None:
    book = GpuTimeBook()
    book.step(seconds, work, c_p, c_d)
    assert {rid: book.charged(rid) for rid in work} == pytest.approx(expected)
    assert sum(book.charged(rid) for rid in work) == pytest.approx(seconds)


def test_busy_is_attributed_plus_unattributed_plus_open() -> None:
    book = GpuTimeBook()
    book.step(1.0, {"a": Work(10, 0), "b": Work(10, 0)}, 1.0, 1.0)
    book.step(0.5, {"a": Work(0, 1), "b": Work(0, 1)}, 1.0, 1.0)
    book.step(0.2, {}, 1.0, 1.0)  # a step with no work (nothing to charge it to)
    assert book.close("a") == pytest.approx(0.75)
    book.drop("b")  # aborted inside the engine
    book.step(0.1, {"c": Work(0, 1)}, 1.0, 1.0)
    assert (book.attributed_s, book.unattributed_s, book.open_s) == pytest.approx(
        (0.75, 0.75 + 0.2, 0.1)
    )
    assert book.busy_s == pytest.approx(book.attributed_s + book.unattributed_s + book.open_s)
    assert book.close("never-seen") == 0.0


def test_the_fit_recovers_the_step_costs() -> None:
    rng = random.Random(0)
    rows = []
    for _ in range(200):
        p, d = rng.choice([0, 0, 64, 200]), rng.randint(1, 16)
        rows.append((float(p), float(d), 0.004 + 0.0002 * p + 0.003 * d))
    c_p, c_d = fit(rows) or (0.0, 0.0)
    assert (c_p, c_d) == pytest.approx((0.0002, 0.003), rel=1e-6)


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([(0.0, float(d), 0.01 * d) for d in range(1, 40)], id="no-prefill-steps"),
        pytest.param([(64.0, 4.0, 0.1)] * 40, id="no-variation"),
        pytest.param(
            [(float(p), float(1 + p % 3), 1.0 - 0.001 * p) for p in range(40)], id="neg-slope"
        ),
    ],
)
def test_a_fit_that_cannot_tell_gives_none(rows: list[tuple[float, float, float]]) -> None:
    assert fit(rows) is None


def test_the_costs_stay_one_to_one_until_a_fit_holds() -> None:
    costs = StepCostFit(window=64, min_steps=8)
    for i in range(7):
        costs.observe(0.01 + 0.001 * i, 10 * i, 2)
    assert costs.costs() == (1.0, 1.0)  # too few steps
    for i in range(8):
        costs.observe(0.002 + 0.0001 * (8 * i) + 0.001 * (1 + i % 3), 8 * i, 1 + i % 3)
    c_p, c_d = costs.costs()
    assert c_p > 0 and c_d > 0 and (c_p, c_d) != (1.0, 1.0)


# ---------------------------------------------------------------- the simulated engine

PROFILE: dict[str, Any] = {
    "max_model_len": 256,
    "vocab_size": 1000,
    "prefill_base_s": 0.010,
    "prefill_s_per_token": 0.001,
    "decode_base_s": 0.020,
    "decode_s_per_seq": 0.005,
    "block_size": 4,
    "kv_capacity_tokens": 4096,
    "prefix_cache_blocks": 256,
    "max_batch_size": 4,
    "max_waiting": 64,
}


def _engine(**overrides: Any) -> tuple[SimulatedEngine, VirtualClock]:
    clock = VirtualClock()
    profile = SimulationProfile.model_validate({**PROFILE, **overrides})
    return SimulatedEngine(profile, clock=clock, sleep=clock.sleep), clock


def _req(rid: str, ids: tuple[int, ...], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(rid, ids, SamplingOptions(ignore_eos=True), max_tokens)


async def _charged(engine: SimulatedEngine, request: GenerationRequest) -> float:
    deltas = [d async for d in engine.generate(request)]
    assert all(d.gpu_seconds is not None for d in deltas)
    return sum(d.gpu_seconds or 0.0 for d in deltas)


async def test_charges_add_up_to_the_engines_busy_time() -> None:
    engine, _ = _engine()
    await engine.start()
    try:
        rng = random.Random(1)
        requests = [
            _req(f"r{i}", tuple(rng.randrange(1000) for _ in range(rng.randint(8, 120))),
                 rng.randint(1, 24))
            for i in range(24)
        ]  # fmt: skip
        charges = await asyncio.gather(*(_charged(engine, r) for r in requests))
        busy = engine.stats().busy_seconds_total
        assert busy > 0
        assert sum(charges) == pytest.approx(busy, rel=0.01)
        # a longer request costs more than a shorter one of the same prompt
        long, short = await asyncio.gather(
            _charged(engine, _req("long", tuple(range(500, 540)), 20)),
            _charged(engine, _req("short", tuple(range(600, 640)), 2)),
        )
        assert long > short
    finally:
        await engine.shutdown()


async def test_a_prompt_from_the_prefix_cache_costs_less_than_cold() -> None:
    engine, _ = _engine()
    await engine.start()
    try:
        ids = tuple(range(100, 200))
        cold = await _charged(engine, _req("cold", ids, 2))
        warm = await _charged(engine, _req("warm", ids, 2))
        assert warm < cold
        # what the cache saved is the uncached tokens' share of the first step
        assert cold - warm == pytest.approx(0.001 * 96, rel=0.05)
    finally:
        await engine.shutdown()


async def test_the_two_legs_of_a_disaggregated_request_add_up() -> None:
    prefill, clock = _engine(kv_connector=True)
    decode = SimulatedEngine(
        SimulationProfile.model_validate({**PROFILE, "kv_connector": True}),
        clock=clock,
        sleep=clock.sleep,
    )
    await prefill.start()
    await decode.start()
    try:
        ids = tuple(range(300, 364))
        handoff = await prefill.prefill(_req("a", ids, 6))
        assert handoff.gpu_seconds == pytest.approx(prefill.stats().busy_seconds_total)
        deltas = [d async for d in decode.generate(replace(_req("a", ids, 6), handoff=handoff))]
        decode_s = sum(d.gpu_seconds or 0.0 for d in deltas)
        assert decode_s == pytest.approx(decode.stats().busy_seconds_total)
        # the ingress puts the prefill leg on the decode leg's first delta
        first = _billed_as_prefilled(deltas[0], handoff)
        total = (first.gpu_seconds or 0.0) + sum(d.gpu_seconds or 0.0 for d in deltas[1:])
        assert total == pytest.approx(handoff.gpu_seconds + decode_s)
    finally:
        await prefill.shutdown()
        await decode.shutdown()


def test_the_prefill_legs_price_rides_with_its_seconds() -> None:
    delta = GenerationDelta("x", 1, gpu_seconds=0.2, gpu_cost_usd=0.002)
    handoff = KvHandoff({}, 10, 0, gpu_seconds=0.5, gpu_cost_usd=0.01)
    billed = _billed_as_prefilled(delta, handoff)
    assert (billed.gpu_seconds, billed.gpu_cost_usd) == pytest.approx((0.7, 0.012))
