"""SimulatedEngine against a virtual clock: every time asserted here is virtual.

Test profile (see ``BASE``): prefill 10 ms + 1 ms per uncached token, decode 20 ms +
5 ms per running sequence, blocks of 4 tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Literal

import pytest
from pydantic import ValidationError

from app.engine.protocol import (
    Adapter,
    Engine,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    KvHandoff,
    SamplingOptions,
)
from app.engine.simulated import SimulatedEngine, SimulationProfile, VirtualClock

PREFILL_BASE = 0.010
PREFILL_PER_TOKEN = 0.001
DECODE_BASE = 0.020
DECODE_PER_SEQ = 0.005
BASE: dict[str, Any] = {
    "max_model_len": 64,
    "vocab_size": 1000,
    "prefill_base_s": PREFILL_BASE,
    "prefill_s_per_token": PREFILL_PER_TOKEN,
    "decode_base_s": DECODE_BASE,
    "decode_s_per_seq": DECODE_PER_SEQ,
    "block_size": 4,
    "kv_capacity_tokens": 256,
    "prefix_cache_blocks": 64,
    "max_waiting": 8,
    "max_batch_size": 8,
}

Timed = list[tuple[float, GenerationDelta]]


def decode(batch: int) -> float:
    return DECODE_BASE + DECODE_PER_SEQ * batch


def first_step(uncached: int, batch: int = 1) -> float:
    return PREFILL_BASE + PREFILL_PER_TOKEN * uncached + decode(batch)


def prompt(n: int, start: int = 0) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def req(
    request_id: str,
    prompt_ids: tuple[int, ...],
    max_tokens: int = 4,
    **sampling: Any,
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        sampling=SamplingOptions(**sampling),
        max_tokens=max_tokens,
    )


@contextlib.asynccontextmanager
async def sim(
    task: Literal["generate", "embed"] = "generate", **overrides: Any
) -> AsyncIterator[tuple[SimulatedEngine, VirtualClock]]:
    clock = VirtualClock()
    profile = SimulationProfile.model_validate({**BASE, **overrides})
    engine = SimulatedEngine(profile, task=task, clock=clock, sleep=clock.sleep)
    await engine.start()
    try:
        yield engine, clock
    finally:
        await engine.shutdown()


async def collect(
    engine: SimulatedEngine, clock: VirtualClock, request: GenerationRequest
) -> Timed:
    return [(clock(), delta) async for delta in engine.generate(request)]


def text_of(timed: Timed) -> str:
    return "".join(delta.text for _, delta in timed)


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def tokens_of(timed: Timed) -> int:
    return sum(delta.num_new_tokens for _, delta in timed)


async def until(condition: Any, max_iterations: int = 1000) -> None:
    for _ in range(max_iterations):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


# ------------------------------------------------------------------ identity, profile
def test_implements_the_protocol_and_says_it_is_simulated() -> None:
    engine = SimulatedEngine(SimulationProfile())
    assert isinstance(engine, Engine)
    assert engine.model_name.startswith("simulated/")
    assert "simulated" in repr(engine).lower()
    assert (engine.supports_generate, engine.supports_embed) == (True, False)
    assert engine.max_model_len == 2048


@pytest.mark.parametrize(
    "bad",
    [
        {"unknown_field": 1},
        {"block_size": 0},
        {"max_model_len": 4096, "kv_capacity_tokens": 4000},
        {"eos_probability": 1.5},
    ],
)
def test_profile_rejects_invalid_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SimulationProfile.model_validate(bad)


def test_profile_is_frozen() -> None:
    profile = SimulationProfile()
    with pytest.raises(ValidationError):
        profile.block_size = 32  # type: ignore[misc]


# ------------------------------------------------------------------ prefill / decode timing
@pytest.mark.asyncio
@pytest.mark.parametrize("prompt_len", [1, 7, 33])
async def test_prefill_cost_scales_with_prompt_tokens(prompt_len: int) -> None:
    async with sim() as (engine, clock):
        timed = await collect(engine, clock, req("r", prompt(prompt_len), max_tokens=3))

    assert timed[0][0] == pytest.approx(first_step(prompt_len))
    assert timed[0][1].prompt_tokens == prompt_len
    assert timed[-1][0] == pytest.approx(first_step(prompt_len) + 2 * decode(1))


P = prompt(21)
_PREFIX_CASES = {
    "identical prompt: all full blocks before the last token": (P, 20),
    "shared 12-token prefix": (P[:12] + prompt(9, 500), 12),
    "prompt ending on a block boundary recomputes its last block": (P[:16], 12),
    "longer prompt hits what the first one cached": (P + prompt(8, 500), 20),
    "different first token": ((999, *P[1:]), 0),
}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("second", "cached"), list(_PREFIX_CASES.values()), ids=list(_PREFIX_CASES)
)
async def test_prefix_hit_shrinks_prefill(second: tuple[int, ...], cached: int) -> None:
    async with sim() as (engine, clock):
        await collect(engine, clock, req("first", P, max_tokens=1))
        start = clock()
        timed = await collect(engine, clock, req("second", second, max_tokens=1))
        extra = engine.stats().extra

    ttft = timed[0][0] - start
    assert ttft == pytest.approx(first_step(len(second) - cached))
    assert timed[0][1].cached_prompt_tokens == cached
    assert extra["prefix_cache_hit_tokens"] == cached
    assert extra["prefix_cache_queried_tokens"] == len(P) + len(second)


@pytest.mark.asyncio
@pytest.mark.parametrize(("cache_blocks", "cached"), [(8, 16), (4, 0), (0, 0)])
async def test_prefix_cache_lru_evicts_older_prompts(cache_blocks: int, cached: int) -> None:
    a, b = prompt(17), prompt(17, 100)  # 4 full blocks each
    async with sim(prefix_cache_blocks=cache_blocks) as (engine, clock):
        await collect(engine, clock, req("a1", a, max_tokens=1))
        await collect(engine, clock, req("b", b, max_tokens=1))
        timed = await collect(engine, clock, req("a2", a, max_tokens=1))

    assert timed[0][1].cached_prompt_tokens == cached


@pytest.mark.asyncio
@pytest.mark.parametrize("batch", [1, 2, 4])
async def test_decode_step_time_grows_with_batch(batch: int) -> None:
    async with sim() as (engine, clock):
        results = await asyncio.gather(
            *(collect(engine, clock, req(f"r{i}", prompt(8, 100 * i), 5)) for i in range(batch))
        )

    for timed in results:
        times = [t for t, _ in timed]
        assert times[0] == pytest.approx(first_step(8 * batch, batch))
        assert gaps(times) == pytest.approx([decode(batch)] * 4)


# ------------------------------------------------------------------ admission
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "limit",
    [
        # 16 KV blocks: the first request reserves 12 (8 + 40 tokens), the second 5.
        {"max_model_len": 64, "kv_capacity_tokens": 64},
        {"max_batch_size": 1},
    ],
    ids=["kv-capacity", "batch-size"],
)
async def test_request_waits_until_another_finishes(limit: dict[str, Any]) -> None:
    async with sim(**limit) as (engine, clock):
        first = asyncio.create_task(collect(engine, clock, req("a", prompt(8), 40)))
        second = asyncio.create_task(collect(engine, clock, req("b", prompt(8, 100), 12)))
        await until(lambda: engine.stats().running == 1 and engine.stats().waiting == 1)
        await until(lambda: engine.stats().extra["steps"] >= 3)
        assert engine.stats().waiting == 1
        timed_a, timed_b = await first, await second

    a_done = first_step(8) + 39 * decode(1)
    assert timed_a[-1][0] == pytest.approx(a_done)
    assert timed_b[0][0] == pytest.approx(a_done + first_step(8))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "budget,admitted_per_step",
    [(None, [3]), (24, [3]), (16, [2, 1]), (10, [1, 1, 1]), (4, [1, 1, 1])],
)
async def test_a_step_admits_prompts_within_its_token_budget(
    budget: int | None, admitted_per_step: list[int]
) -> None:
    """Three 8-token prompts waiting together: a step admits as many as its prefill
    token budget holds, and always the first."""
    async with sim(max_prefill_tokens_per_step=budget) as (engine, clock):
        results = await asyncio.gather(
            *(collect(engine, clock, req(f"r{i}", prompt(8, 100 * i), 3)) for i in range(3))
        )
    firsts = sorted(timed[0][0] for timed in results)
    expected, now, batch = [], 0.0, 0
    for n in admitted_per_step:
        batch += n
        now += first_step(8 * n, batch)
        expected += [now] * n
    assert firsts == pytest.approx(expected)


@pytest.mark.asyncio
async def test_waiting_queue_is_fifo_without_overtaking() -> None:
    # 16 blocks: a takes 12; b needs 8 (waits); c needs 2 (would fit, must not overtake).
    async with sim(max_model_len=64, kv_capacity_tokens=64) as (engine, clock):
        ta = asyncio.create_task(collect(engine, clock, req("a", prompt(8), 40)))
        await until(lambda: engine.stats().running == 1)
        tb = asyncio.create_task(collect(engine, clock, req("b", prompt(16, 100), 16)))
        tc = asyncio.create_task(collect(engine, clock, req("c", prompt(4, 200), 4)))
        await until(lambda: engine.stats().waiting == 2)
        await until(lambda: engine.stats().extra["steps"] >= 5)
        assert engine.stats().waiting == 2
        assert engine.stats().extra["kv_used_tokens"] == 48
        timed_a, timed_b, timed_c = await ta, await tb, await tc

    a_done = timed_a[-1][0]
    both_prefill = first_step(16 + 4, batch=2)
    assert timed_b[0][0] == pytest.approx(a_done + both_prefill)
    assert timed_c[0][0] == pytest.approx(a_done + both_prefill)


@pytest.mark.asyncio
async def test_overload_raises_immediately() -> None:
    async with sim(max_waiting=2, max_batch_size=1) as (engine, clock):
        running = engine.generate(req("a", prompt(8), 50))
        await anext(running)
        waiters = [
            asyncio.create_task(collect(engine, clock, req(f"w{i}", prompt(8, 10 * i), 2)))
            for i in (1, 2)
        ]
        await until(lambda: engine.stats().waiting == 2)
        before = clock()
        with pytest.raises(EngineOverloaded):
            await anext(engine.generate(req("rejected", prompt(8, 90), 2)))
        assert clock() == before
        assert engine.stats().waiting == 2
        await running.aclose()
        for waiter in waiters:
            assert (await waiter)[-1][1].finish_reason == "length"


# ------------------------------------------------------------------ abort, cancellation
@pytest.mark.asyncio
async def test_abort_frees_capacity_and_counts() -> None:
    async with sim(max_model_len=64, kv_capacity_tokens=64) as (engine, clock):
        ta = asyncio.create_task(collect(engine, clock, req("a", prompt(8), 40)))
        tb = asyncio.create_task(collect(engine, clock, req("b", prompt(8, 100), 12)))
        await until(lambda: engine.stats().extra["steps"] >= 2)
        assert engine.stats().waiting == 1
        aborted_at = clock()
        await engine.abort("a")
        stats = engine.stats()
        assert (stats.running, stats.aborted_total) == (0, 1)
        assert stats.extra["kv_used_tokens"] == 0
        timed_a, timed_b = await ta, await tb
        await engine.abort("a")  # unknown / finished ids are ignored
        stats = engine.stats()

    assert timed_a[-1][1].finish_reason == "abort"
    assert (stats.aborted_total, stats.finished_total) == (1, 1)
    # b is admitted at the next step boundary (the step in flight ends first).
    assert timed_b[0][0] == pytest.approx(aborted_at + decode(1) + first_step(8))


@pytest.mark.asyncio
async def test_cancelled_consumer_aborts_within_one_step() -> None:
    async with sim() as (engine, clock):
        sink_b: Timed = []

        async def consume(request: GenerationRequest, sink: Timed) -> None:
            async for delta in engine.generate(request):
                sink.append((clock(), delta))

        ta = asyncio.create_task(consume(req("a", prompt(8), 20), []))
        tb = asyncio.create_task(consume(req("b", prompt(8, 100), 8), sink_b))
        await until(lambda: len(sink_b) == 3)
        ta.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ta
        stats = engine.stats()
        assert (stats.running, stats.aborted_total) == (1, 1)
        assert stats.extra["kv_used_tokens"] == 16  # only b's 8 + 8 tokens
        await tb

    times = [t for t, _ in sink_b]
    assert times[3] - times[2] == pytest.approx(decode(2))  # the step in flight
    assert gaps(times[3:]) == pytest.approx([decode(1)] * 4)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["aclose", "garbage-collected"])
async def test_consumer_that_stops_iterating_aborts(how: str) -> None:
    async with sim() as (engine, _clock):
        gen = engine.generate(req("a", prompt(8), 20))
        await anext(gen)
        if how == "aclose":
            await gen.aclose()
        else:
            del gen
            await until(lambda: engine.stats().aborted_total == 1)
        stats = engine.stats()

    assert (stats.running, stats.aborted_total, stats.finished_total) == (0, 1, 0)
    assert stats.extra["kv_used_tokens"] == 0


@pytest.mark.asyncio
async def test_shutdown_aborts_in_flight_and_refuses_new_work() -> None:
    async with sim() as (engine, clock):
        task = asyncio.create_task(collect(engine, clock, req("a", prompt(8), 20)))
        await until(lambda: engine.stats().running == 1)
    assert (await task)[-1][1].finish_reason == "abort"
    with pytest.raises(EngineNotReady):
        await anext(engine.generate(req("b", prompt(8), 2)))


# ------------------------------------------------------------------ text
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("sampling_a", "id_a", "sampling_b", "id_b", "same"),
    [
        ({"seed": 1}, "x", {"seed": 1}, "y", True),
        ({"seed": 1}, "x", {"seed": 2}, "x", False),
        ({"temperature": 0.0}, "x", {"temperature": 0.0}, "y", True),
        ({"temperature": 0.0, "seed": 1}, "x", {"temperature": 0.0, "seed": 2}, "y", True),
        ({"temperature": 1.0}, "x", {"temperature": 1.0}, "y", False),
        ({"temperature": 1.0}, "x", {"temperature": 1.0}, "x", True),
    ],
)
async def test_determinism(
    sampling_a: dict[str, Any],
    id_a: str,
    sampling_b: dict[str, Any],
    id_b: str,
    same: bool,
) -> None:
    texts = []
    for request_id, sampling in ((id_a, sampling_a), (id_b, sampling_b)):
        async with sim() as (engine, clock):
            timed = await collect(engine, clock, req(request_id, prompt(10), 8, **sampling))
        texts.append(text_of(timed))
    assert (texts[0] == texts[1]) is same
    assert len(texts[0].split(" ")) == 8


@pytest.mark.asyncio
async def test_length_finish_and_max_model_len_cap() -> None:
    async with sim(max_model_len=64) as (engine, clock):
        short = await collect(engine, clock, req("a", prompt(10), 5))
        capped = await collect(engine, clock, req("b", prompt(60), 50))

    assert [d.finish_reason for _, d in short] == [None] * 4 + ["length"]
    assert tokens_of(short) == 5
    assert capped[-1][1].finish_reason == "length"
    assert tokens_of(capped) == 4


def _stop_cases(reference: str) -> dict[str, tuple[str, ...]]:
    words = reference.split(" ")
    return {
        "a word": (" " + words[3],),
        "across a token boundary": (words[4][-2:] + " " + words[5][:2],),
        "earliest of several": (" " + words[6], " " + words[2]),
        "absent": ("zzz",),
    }


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "case", ["a word", "across a token boundary", "earliest of several", "absent"]
)
async def test_stop_strings(case: str) -> None:
    async with sim() as (engine, clock):
        reference = text_of(await collect(engine, clock, req("ref", prompt(10), 10, seed=3)))
        stop = _stop_cases(reference)[case]
        timed = await collect(engine, clock, req("s", prompt(10), 10, seed=3, stop=stop))

    cuts = [i for s in stop if (i := reference.find(s)) >= 0]
    expected = reference[: min(cuts)] if cuts else reference
    assert text_of(timed) == expected
    assert timed[-1][1].finish_reason == ("stop" if cuts else "length")
    assert all(s not in text_of(timed) for s in stop)
    if cuts:
        assert tokens_of(timed) < 10


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("ignore_eos", "finish", "num_tokens", "text_empty"),
    [(False, "stop", 1, True), (True, "length", 6, False)],
)
async def test_simulated_eos(
    ignore_eos: bool, finish: str, num_tokens: int, text_empty: bool
) -> None:
    async with sim(eos_probability=1.0) as (engine, clock):
        timed = await collect(engine, clock, req("r", prompt(5), 6, ignore_eos=ignore_eos))

    assert timed[-1][1].finish_reason == finish
    assert tokens_of(timed) == num_tokens
    assert (text_of(timed) == "") is text_empty


@pytest.mark.asyncio
async def test_rare_eos_is_deterministic() -> None:
    lengths = []
    for _ in range(2):
        async with sim(eos_probability=0.2) as (engine, clock):
            timed = await collect(engine, clock, req("r", prompt(5), 40, seed=11))
        lengths.append(tokens_of(timed))
    assert lengths[0] == lengths[1]


# ------------------------------------------------------------------ tokenizer, embed, errors
def test_tokenizer_is_deterministic_and_in_vocab() -> None:
    profile = SimulationProfile(vocab_size=1000)
    one, two = SimulatedEngine(profile), SimulatedEngine(profile)
    ids = one.tokenize("Hello, switch yard! Hello")
    assert ids == two.tokenize("Hello, switch yard! Hello")
    assert len(ids) == 6
    assert ids[0] == ids[-1]
    assert all(0 <= i < 1000 for i in ids)


def test_chat_template_ends_with_generation_prompt() -> None:
    engine = SimulatedEngine(SimulationProfile())
    ids = engine.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert ids == engine.tokenize("<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n")
    assert ids[-1] == engine.tokenize("<|assistant|>")[0]


@pytest.mark.asyncio
async def test_embed_returns_unit_vectors_and_token_count() -> None:
    async with sim(task="embed", embedding_dim=384) as (engine, clock):
        assert (engine.supports_generate, engine.supports_embed) == (False, True)
        vectors, tokens = await engine.embed(["the quick train", "the quick train", ""])
        again, _ = await engine.embed(["the quick train"])
        with pytest.raises(EngineError):
            await anext(engine.generate(req("r", prompt(4))))

    assert tokens == 6
    assert clock() == pytest.approx(2 * PREFILL_BASE + 9 * PREFILL_PER_TOKEN)
    assert [len(v) for v in vectors] == [384, 384, 384]
    for vector in vectors:
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0)
    assert vectors[0] == vectors[1] == again[0]


@pytest.mark.asyncio
async def test_generate_engine_refuses_embed() -> None:
    async with sim() as (engine, _clock):
        with pytest.raises(EngineError):
            await engine.embed(["x"])


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (req("r", ()), ValueError),
        (req("r", prompt(64)), ValueError),
        (req("r", prompt(4), max_tokens=0), ValueError),
    ],
    ids=["empty-prompt", "prompt-too-long", "no-tokens"],
)
async def test_invalid_requests(request_: GenerationRequest, error: type[Exception]) -> None:
    async with sim() as (engine, _clock):
        with pytest.raises(error):
            await anext(engine.generate(request_))
        assert engine.stats().waiting == 0


@pytest.mark.asyncio
async def test_duplicate_request_id_and_not_started() -> None:
    engine = SimulatedEngine(SimulationProfile.model_validate(BASE))
    with pytest.raises(EngineNotReady):
        await anext(engine.generate(req("r", prompt(4))))
    async with sim() as (engine, _clock):
        first = engine.generate(req("r", prompt(4), 10))
        await anext(first)
        with pytest.raises(ValueError):
            await anext(engine.generate(req("r", prompt(4))))
        await first.aclose()


@pytest.mark.asyncio
async def test_stats_extra() -> None:
    async with sim() as (engine, clock):
        await collect(engine, clock, req("r", prompt(9), 3))
        stats = engine.stats()

    assert (stats.running, stats.waiting, stats.finished_total) == (0, 0, 1)
    assert stats.extra["steps"] == 3
    assert stats.extra["kv_used_tokens"] == 0
    assert stats.extra["busy_s"] == pytest.approx(clock())
    assert set(stats.extra) >= {
        "prefix_cache_hit_tokens",
        "prefix_cache_queried_tokens",
        "kv_used_tokens",
        "steps",
    }


async def test_scheduler_failure_fails_requests_instead_of_hanging() -> None:
    async def broken_sleep(seconds: float) -> None:
        raise RuntimeError("simulated bug")

    engine = SimulatedEngine(SimulationProfile.model_validate(BASE), sleep=broken_sleep)
    await engine.start()
    with pytest.raises(EngineError, match="simulated bug"):
        await anext(engine.generate(req("r", prompt(4))))
    with pytest.raises(EngineNotReady):
        await anext(engine.generate(req("r2", prompt(4))))
    await engine.shutdown()


# ------------------------------------------------------------------ LoRA adapters
LOAD = 0.050


def areq(request_id: str, prompt_ids: tuple[int, ...], adapter: str | None, n: int = 2) -> Any:
    base = req(request_id, prompt_ids, max_tokens=n)
    return replace(base, adapter=Adapter(adapter, f"/adapters/{adapter}") if adapter else None)


@pytest.mark.asyncio
async def test_adapter_is_refused_when_lora_is_off() -> None:
    async with sim() as (engine, clock):
        with pytest.raises(InvalidRequest, match="LoRA"):
            await collect(engine, clock, areq("r", prompt(8), "m:a"))


_COLD_CASES = {
    # adapters asked for in order, max_cpu_loras → which requests load (True) and
    # what the engine holds at the end, least recently used first
    "first use loads, second is warm": (["a", "a"], 2, [True, False], ("m:a",)),
    "two adapters both held": (["a", "b", "a"], 2, [True, True, False], ("m:b", "m:a")),
    "LRU evicts the older": (["a", "b", "c", "a"], 2, [True, True, True, True], ("m:c", "m:a")),
    "use refreshes recency": (["a", "b", "a", "c", "a"], 2, [True, True, False, True, False],
                              ("m:c", "m:a")),
}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("order", "cpu", "cold", "held"), list(_COLD_CASES.values()), ids=list(_COLD_CASES)
)
async def test_adapters_load_cold_once_and_evict_lru(
    order: list[str], cpu: int, cold: list[bool], held: tuple[str, ...]
) -> None:
    async with sim(max_loras=1, max_cpu_loras=cpu, adapter_load_s=LOAD) as (engine, clock):
        got = []
        for i, name in enumerate(order):
            start = clock()
            timed = await collect(engine, clock, areq(f"r{i}", prompt(8, 100 * i), f"m:{name}"))
            load = timed[0][1].adapter_load_s
            got.append(load is not None)
            # a cold load lengthens the admitting step by exactly the load time
            assert timed[0][0] - start == pytest.approx(first_step(8) + (LOAD if load else 0))
            assert all(d.adapter_load_s is None for _, d in timed[1:])
        stats = engine.stats()

    assert got == cold
    assert stats.adapters == held
    assert stats.extra["adapter_loads_total"] == sum(cold)
    assert stats.extra["adapter_load_seconds_total"] == pytest.approx(LOAD * sum(cold))


@pytest.mark.asyncio
async def test_a_batch_mixes_at_most_max_loras_adapters() -> None:
    # max_loras 1: b (adapter y) waits while a (x) runs; c (x) overtakes b; d (base) too
    async with sim(max_loras=1, adapter_load_s=0.0) as (engine, clock):
        ta = asyncio.create_task(collect(engine, clock, areq("a", prompt(8), "m:x", n=6)))
        await until(lambda: engine.stats().running == 1)
        tb = asyncio.create_task(collect(engine, clock, areq("b", prompt(8, 100), "m:y")))
        tc = asyncio.create_task(collect(engine, clock, areq("c", prompt(8, 200), "m:x")))
        td = asyncio.create_task(collect(engine, clock, areq("d", prompt(8, 300), None)))
        await until(lambda: engine.stats().running == 3)
        assert engine.stats().waiting == 1
        timed_a, timed_b, timed_c, timed_d = await ta, await tb, await tc, await td

    assert timed_c[-1][0] < timed_b[0][0] and timed_d[-1][0] < timed_b[0][0]
    assert timed_b[0][0] > timed_a[-1][0]  # y only once no request with x runs


@pytest.mark.asyncio
async def test_prefix_blocks_are_keyed_per_adapter() -> None:
    async with sim(max_loras=2, adapter_load_s=0.0) as (engine, clock):
        await collect(engine, clock, areq("a1", P, "m:a"))
        same = await collect(engine, clock, areq("a2", P, "m:a"))
        other = await collect(engine, clock, areq("b", P, "m:b"))
        base = await collect(engine, clock, areq("base", P, None))

    assert same[0][1].cached_prompt_tokens == 20
    assert other[0][1].cached_prompt_tokens == 0
    assert base[0][1].cached_prompt_tokens == 0


# ------------------------------------------------------------------ prefill/decode hand-off
TRANSFER = {"kv_connector": True, "kv_bytes_per_token": 1000, "transfer_bytes_per_s": 1e6,
            "transfer_base_s": 0.002}  # fmt: skip


def transfer_s(tokens: int) -> float:
    return 0.002 + 1000 * tokens / 1e6


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[SimulatedEngine, SimulatedEngine, VirtualClock]]:
    """A prefill engine and a decode engine on one virtual clock."""
    clock = VirtualClock()
    profile = SimulationProfile.model_validate({**BASE, **TRANSFER})
    p = SimulatedEngine(profile, clock=clock, sleep=clock.sleep)
    d = SimulatedEngine(profile, clock=clock, sleep=clock.sleep)
    await p.start()
    await d.start()
    try:
        yield p, d, clock
    finally:
        await p.shutdown()
        await d.shutdown()


async def test_a_prefill_costs_one_prefill_step_and_caches_the_prompt() -> None:
    async with pair() as (p, _, clock):
        handoff = await p.prefill(req("a", prompt(20)))
        assert clock() == pytest.approx(first_step(20))
        assert (handoff.prompt_tokens, handoff.cached_prompt_tokens) == (20, 0)
        again = await p.prefill(req("b", prompt(20)))
        assert again.cached_prompt_tokens == 16  # 4 full blocks; the last token is computed
        assert p.stats().extra["prefills_total"] == 2 and p.stats().finished_total == 2


async def test_a_handed_off_request_waits_for_the_pull_then_computes_one_token() -> None:
    async with pair() as (p, d, clock):
        handoff = await p.prefill(req("a", prompt(20)))
        start = clock()
        greedy = req("a", prompt(20), max_tokens=3, temperature=0.0)
        timed = await collect(d, clock, replace(greedy, handoff=handoff))
        first_at = timed[0][0] - start
        assert first_at == pytest.approx(transfer_s(20) + first_step(1))
        assert tokens_of(timed) == 3
        assert timed[0][1].cached_prompt_tokens == 0  # nothing reused here: pulled, not cached
        extra = d.stats().extra
        assert (extra["kv_transfers_total"], extra["kv_transfer_tokens_total"]) == (1, 20)
        assert extra["kv_transfer_bytes_total"] == 20_000
        assert extra["kv_transfer_seconds_total"] == pytest.approx(transfer_s(20))
        assert text_of(timed) == text_of(
            await collect(p, clock, req("u", prompt(20), max_tokens=3, temperature=0.0))
        )


async def test_the_decode_engine_pulls_only_what_its_own_cache_lacks() -> None:
    async with pair() as (p, d, clock):
        await collect(d, clock, req("warm", prompt(12), max_tokens=1))  # d holds 3 blocks
        handoff = await p.prefill(req("a", prompt(20)))
        await collect(d, clock, replace(req("a", prompt(20), max_tokens=1), handoff=handoff))
        assert d.stats().extra["kv_transfer_tokens_total"] == 8  # 20 minus 12 held


async def test_an_engine_without_a_connector_refuses_prefill_and_hand_offs() -> None:
    async with sim() as (engine, clock):
        with pytest.raises(InvalidRequest, match="no KV connector"):
            await engine.prefill(req("a", prompt(8)))
        handoff = KvHandoff({"engine": "x"}, 8)
        with pytest.raises(InvalidRequest, match="no KV connector"):
            await collect(engine, clock, replace(req("b", prompt(8)), handoff=handoff))
        assert "prefills_total" not in engine.stats().extra


async def test_the_engine_family_is_kept_as_vllm_keeps_it() -> None:
    """Telemetry under the same names as vLLM's: per step the tokens computed, per
    finished request its queue, prefill and decode times, prefix lookups and hits."""
    async with sim(max_batch_size=1) as (engine, clock):
        a = asyncio.create_task(collect(engine, clock, req("a", prompt(16), max_tokens=3)))
        b = asyncio.create_task(collect(engine, clock, req("b", prompt(16), max_tokens=1)))
        deltas_a, deltas_b = await asyncio.gather(a, b)
        s, samples = engine.stats(), engine.telemetry.drain()
    # Each request's last delta carries its own times (a trace's engine spans).
    assert [d.times for _, d in deltas_a[:-1]] == [None] * (len(deltas_a) - 1)
    assert (deltas_a[-1][1].times, deltas_b[-1][1].times) == samples.requests
    first_a = first_step(16)
    # a: prefilled at 0, two more decode steps; b waited for them, then hit 12 tokens
    # (3 whole blocks; the last prompt token is always computed).
    assert samples.step_tokens == (17, 1, 1, 4 + 1)
    (ta, tb) = samples.requests
    assert (ta.queued_s, ta.prefill_s) == (0.0, pytest.approx(first_a))
    assert ta.decode_s == pytest.approx(2 * decode(1))
    assert tb.queued_s == pytest.approx(first_a + 2 * decode(1))
    assert tb.prefill_s == pytest.approx(first_step(4)) and tb.decode_s == 0.0
    assert (s.prefix_queried_tokens_total, s.prefix_hit_tokens_total) == (32, 12)
    assert (s.steps_total, s.preemptions_total, s.kv_cache_usage) == (4, 0, 0.0)


async def test_kv_usage_is_the_fraction_of_blocks_held() -> None:
    async with sim() as (engine, _):
        stream = engine.generate(req("long", prompt(16), max_tokens=40))
        await stream.__anext__()
        usage = engine.stats().kv_cache_usage
        await stream.aclose()
    assert usage == pytest.approx(14 / 64)  # ceil((16 + 40) / 4) blocks of 256 / 4


# ------------------------------------------------------------------ speculative decoding
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("acceptance", "per_delta", "drafts", "drafted", "accepted"),
    [
        # max_tokens 11, k = 4: the prefill step gives token 1, then each decode step
        # drafts min(4, remaining - 1) and gains 1 + accepted
        (1.0, [1, 5, 5], 2, 8, 8),
        # drafts shrink as the end nears; the last token's step drafts nothing
        (0.0, [1] * 11, 9, 4 * 6 + 3 + 2 + 1, 0),
    ],
)
async def test_speculation_gains_the_accepted_tokens_and_counts_the_drafts(
    acceptance: float, per_delta: list[int], drafts: int, drafted: int, accepted: int
) -> None:
    async with sim(spec_tokens=4, spec_acceptance=acceptance, spec_s_per_token=0.002) as (
        engine,
        clock,
    ):
        timed = await collect(engine, clock, req("r", prompt(8), max_tokens=11))
        assert [d.num_new_tokens for _, d in timed] == per_delta
        assert timed[-1][1].finish_reason == "length"
        t = engine.telemetry
        assert (t.spec_drafts_total, t.spec_draft_tokens_total, t.spec_accepted_tokens_total) \
            == (drafts, drafted, accepted)  # fmt: skip
        s = engine.stats()
        assert (s.spec_draft_tokens_total, s.spec_accepted_tokens_total) == (drafted, accepted)
        # a decode step's time includes verifying its draft tokens (4 in the first)
        assert gaps([at for at, _ in timed])[0] == pytest.approx(decode(1) + 0.002 * 4)


def test_simulated_drafts_follow_the_truncated_geometric_law() -> None:
    from app.engine.simulated_spec import SimulatedDrafts

    for alpha in (0.3, 0.7):
        drafts = SimulatedDrafts(4, alpha)
        kept = [drafts.accepted(b"stream", pos, 4) for pos in range(4000)]
        expected = sum(alpha**i for i in range(1, 5))
        assert sum(kept) / len(kept) == pytest.approx(expected, abs=0.05)
        assert max(kept) == 4 and min(kept) == 0


@pytest.mark.asyncio
async def test_without_spec_tokens_nothing_is_drafted() -> None:
    async with sim() as (engine, clock):
        timed = await collect(engine, clock, req("r", prompt(8), max_tokens=5))
        assert [d.num_new_tokens for _, d in timed] == [1] * 5
        assert engine.stats().spec_draft_tokens_total == 0
