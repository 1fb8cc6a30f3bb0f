"""VLLMEngine (the real vLLM CPU engine) behind the Engine protocol, in-process on the
tiny random-weight Llama: streaming deltas, abort on cancellation, prefix caching, the
KV-cache events a router in precise mode follows, and LoRA adapters loaded on first use
and evicted least recently used (host cache of one adapter)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.engine.lora import LoraSettings
from app.engine.protocol import Adapter, GenerationDelta, GenerationRequest, SamplingOptions
from app.engine.settings import EngineSettings
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.models.quantize import Scheme, quantize
from app.scheduler.blocks import chain_hashes
from app.scheduler.kv_events import Translator
from app.scheduler.kv_feed import KvEventFeed
from app.serving.llm_server import free_port

CPU_BLOCK = 128  # vLLM's KV block size on CPU
KV_PORT = free_port()


@pytest.fixture(scope="module")
def engine_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    # vLLM's output handler tasks live on this loop: cancel them before closing it.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, engine_loop: asyncio.AbstractEventLoop) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(
        VLLMEngineConfig(
            model_path=tiny_model_dir,
            served_name="tiny",
            max_model_len=512,
            kv_cache_memory_bytes=64 * 1024**2,
            max_num_seqs=4,
            publish_kv_events=True,
            lora=LoraSettings(max_loras=1, max_cpu_loras=1, max_lora_rank=8),
        ),
        kv_events_port=KV_PORT,
    )
    engine_loop.run_until_complete(eng.start())
    yield eng
    eng.close()


def _request(rid: str, ids: list[int], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        rid, tuple(ids), SamplingOptions(temperature=0.0, ignore_eos=True), max_tokens
    )


async def _drain(stream: AsyncIterator[object]) -> list[object]:
    return [d async for d in stream]


def test_stream_counts_every_token(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    ids = engine.apply_chat_template([{"role": "user", "content": "hello world"}])
    deltas = engine_loop.run_until_complete(_drain(engine.generate(_request("a", ids, 7))))
    assert sum(d.num_new_tokens for d in deltas) == 7  # type: ignore[attr-defined]
    assert deltas[0].prompt_tokens == len(ids)  # type: ignore[attr-defined]
    assert deltas[-1].finish_reason == "length"  # type: ignore[attr-defined]
    assert engine.stats().running == 0
    # vLLM's own per-request stats ride on the last delta (a trace's engine spans).
    times = deltas[-1].times  # type: ignore[attr-defined]
    assert times is not None and times.decode_s > 0 and times.prefill_s > 0
    assert all(d.times is None for d in deltas[:-1])  # type: ignore[attr-defined]


def test_cancelling_the_consumer_aborts_in_the_engine(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    async def scenario() -> tuple[int, int, int]:
        before = engine.stats()
        stream = engine.generate(_request("b", engine.tokenize("the quick brown fox"), 400))
        await stream.__anext__()
        during = engine.stats().running
        await stream.aclose()  # what a cancelled gateway does to the generator
        for _ in range(100):
            if engine.stats().running == before.running:
                break
            await asyncio.sleep(0.01)
        after = engine.stats()
        return during, after.running - before.running, after.aborted_total - before.aborted_total

    during, running_delta, aborted_delta = engine_loop.run_until_complete(scenario())
    assert during == 1
    assert running_delta == 0
    assert aborted_delta == 1


def test_repeated_prompt_hits_the_prefix_cache(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    ids = engine.tokenize("the lazy dog jumps " * 20)
    engine_loop.run_until_complete(_drain(engine.generate(_request("c1", ids, 1))))
    deltas = engine_loop.run_until_complete(_drain(engine.generate(_request("c2", ids, 1))))
    assert deltas[0].cached_prompt_tokens >= 16  # type: ignore[attr-defined]


def _charged(deltas: list[object]) -> float:
    seconds = [d.gpu_seconds for d in deltas]  # type: ignore[attr-defined]
    assert all(s is not None for s in seconds)
    return sum(seconds)


async def _busy_settled(engine: VLLMEngine) -> float:
    """vLLM's busy-seconds total once it stops moving: its iteration stats reach the
    logger after the outputs, later on a loaded machine (a fixed 0.2 s wait missed the
    last step once in CI). Three equal reads 0.1 s apart, at most 5 s."""
    last, same = engine.stats().busy_seconds_total, 0
    for _ in range(50):
        await asyncio.sleep(0.1)
        now = engine.stats().busy_seconds_total
        same = same + 1 if now == last else 0
        if same >= 2:
            break
        last = now
    return last


def test_gpu_time_charges_add_up_to_the_engines_own_busy_time(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    """Each step's time split across its requests (app.engine.vllm_gpu_time) adds up to
    the busy time vLLM's own iteration details report, within 5 %."""

    async def run() -> tuple[float, list[float]]:
        before = await _busy_settled(engine)  # the previous test's last stats are in
        streams = [
            _drain(engine.generate(_request(f"g{i}", [(7 * i + j) % 300 + 5 for j in
                                                       range(40 + 30 * i)], 6 + 4 * i)))
            for i in range(6)
        ]  # fmt: skip
        results = await asyncio.gather(*streams)
        busy = await _busy_settled(engine)  # the last step's stats are in
        return busy - before, [_charged(r) for r in results]

    busy, charges = engine_loop.run_until_complete(run())
    assert busy > 0
    assert sum(charges) == pytest.approx(busy, rel=0.05)
    assert charges[-1] > charges[0]  # the longest prompt and answer cost the most


def test_a_prompt_from_the_prefix_cache_costs_less_gpu_time_than_cold(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    ids = [(13 * j) % 300 + 5 for j in range(400)]
    cold = engine_loop.run_until_complete(_drain(engine.generate(_request("cold", ids, 2))))
    warm = engine_loop.run_until_complete(_drain(engine.generate(_request("warm", ids, 2))))
    assert cold[0].cached_prompt_tokens == 0  # type: ignore[attr-defined]
    assert warm[0].cached_prompt_tokens >= 256  # type: ignore[attr-defined]
    assert _charged(warm) < _charged(cold)


def test_the_cpu_engine_publishes_kv_events_a_router_translates_into_its_own_hashes(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop
) -> None:
    feed = KvEventFeed()
    try:
        feed.follow("r0", f"tcp://127.0.0.1:{KV_PORT}")
        time.sleep(0.5)  # the subscription reaches the publisher (ZMQ's slow joiner)
        ids = engine.tokenize("a fresh context for the events test " * 30)
        assert len(ids) > 2 * CPU_BLOCK
        request = GenerationRequest(
            "kv1", tuple(ids), SamplingOptions(temperature=0.0), 1, cache_salt="tenant-x"
        )
        engine_loop.run_until_complete(_drain(engine.generate(request)))
        translator, stored = Translator(CPU_BLOCK), []
        deadline = time.monotonic() + 10
        want = list(chain_hashes(ids, CPU_BLOCK, "tenant-x"))
        while stored != want and time.monotonic() < deadline:
            for _, events in feed.drain():
                stored += translator.apply(events).stored
            time.sleep(0.05)
        assert stored == want  # every full block, in the router's own salted hashes
    finally:
        feed.close()


def _greedy(
    engine: VLLMEngine, loop: asyncio.AbstractEventLoop, rid: str, adapter: Adapter | None
) -> tuple[str, ...]:
    ids = engine.tokenize("the router streams tokens to")
    request = GenerationRequest(
        rid, tuple(ids), SamplingOptions(temperature=0.0, ignore_eos=True), 8, adapter=adapter
    )
    deltas = loop.run_until_complete(_drain(engine.generate(request)))
    assert sum(d.num_new_tokens for d in deltas if isinstance(d, GenerationDelta)) == 8
    return tuple(d.text for d in deltas if isinstance(d, GenerationDelta))


def test_each_lora_adapter_changes_the_output_its_own_way(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop, tiny_loras: dict[str, Path]
) -> None:
    a1, a2 = (Adapter(f"tiny:{n}", str(tiny_loras[n])) for n in ("a1", "a2"))
    base = _greedy(engine, engine_loop, "l-base", None)
    first = _greedy(engine, engine_loop, "l-a1", a1)
    second = _greedy(engine, engine_loop, "l-a2", a2)
    assert len({base, first, second}) == 3  # each adapter is applied, and differently
    assert _greedy(engine, engine_loop, "l-a1-again", a1) == first  # greedy repeats
    assert _greedy(engine, engine_loop, "l-base-again", None) == base  # the base is intact


def test_adapters_beyond_the_host_cache_are_evicted_and_load_again(
    engine: VLLMEngine, engine_loop: asyncio.AbstractEventLoop, tiny_loras: dict[str, Path]
) -> None:
    adapters = [Adapter(f"tiny:{n}", str(p)) for n, p in sorted(tiny_loras.items())]
    held = engine.stats().adapters  # what an earlier test left in the cache
    before = engine.stats().extra["adapter_loads_total"]
    outputs = [_greedy(engine, engine_loop, f"e-{i}", a) for i, a in enumerate(adapters * 2)]
    assert outputs[:3] == outputs[3:]  # every adapter still answers, the same way
    after = engine.stats()
    # max_cpu_loras 1: every request found another adapter held, so each loaded (the
    # first one not when an earlier test left it held)
    loads = 6 - (adapters[0].name in held)
    assert after.extra["adapter_loads_total"] - before == loads
    assert after.adapters == ("tiny:a3",)  # the engine holds the last one only
    again = _greedy(engine, engine_loop, "e-warm", adapters[2])
    assert again == outputs[2]
    assert engine.stats().extra["adapter_loads_total"] - before == loads  # held: no load


def test_with_priority_scheduling_an_interactive_request_overtakes_waiting_batch(
    tiny_model_dir: Path, engine_loop: asyncio.AbstractEventLoop
) -> None:
    """One sequence slot, vLLM's scheduling_policy priority: a batch request runs, a
    second batch request and then an interactive one wait; the interactive one runs
    next (the band reaches vLLM as GenerationRequest.priority). First come, first
    served would run the batch one first."""
    eng = VLLMEngine(
        VLLMEngineConfig(
            model_path=tiny_model_dir,
            served_name="tiny-priority",
            max_model_len=512,
            kv_cache_memory_bytes=64 * 1024**2,
            max_num_seqs=1,
            settings=EngineSettings(engine_kwargs={"scheduling_policy": "priority"}),
        )
    )
    engine_loop.run_until_complete(eng.start())
    ids = eng.apply_chat_template([{"role": "user", "content": "hello world"}])

    def request(rid: str, tokens: int, priority: int) -> GenerationRequest:
        sampling = SamplingOptions(temperature=0.0, ignore_eos=True)
        return GenerationRequest(rid, tuple(ids), sampling, tokens, priority=priority)

    async def scenario() -> list[str]:
        finished: list[str] = []

        async def run(req: GenerationRequest, started: asyncio.Event | None = None) -> None:
            async for d in eng.generate(req):
                if started is not None:
                    started.set()
                if d.finish_reason is not None:
                    finished.append(req.request_id)

        first = asyncio.Event()
        running = asyncio.create_task(run(request("batch-1", 400, 2), first))
        await first.wait()
        late_batch = asyncio.create_task(run(request("batch-2", 4, 2)))
        while eng.stats().running + eng.stats().waiting < 2:  # it reached the engine first
            await asyncio.sleep(0.01)
        interactive = asyncio.create_task(run(request("interactive", 4, 0)))
        await asyncio.gather(running, late_batch, interactive)
        return finished

    try:
        assert engine_loop.run_until_complete(scenario()) == ["batch-1", "interactive", "batch-2"]
    finally:
        eng.close()


def test_a_speculative_engine_reports_its_drafts_from_vllms_own_stats(
    tiny_model_dir: Path, engine_loop: asyncio.AbstractEventLoop
) -> None:
    """vLLM's n-gram (prompt lookup) proposer on the CPU engine: a prompt that repeats
    itself gives the proposer matches; the drafts it proposed and the target accepted
    come back from vLLM's SpecDecodingStats through the engine's stat logger, and the
    first delta's totals are what the acceptance health rule reads."""
    eng = VLLMEngine(
        VLLMEngineConfig(
            model_path=tiny_model_dir,
            served_name="tiny-ngram",
            max_model_len=512,
            kv_cache_memory_bytes=64 * 1024**2,
            max_num_seqs=2,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        )
    )  # fmt: skip
    engine_loop.run_until_complete(eng.start())
    try:
        words = "alpha beta gamma delta " * 24
        ids = eng.apply_chat_template([{"role": "user", "content": words}])
        deltas = engine_loop.run_until_complete(_drain(eng.generate(_request("s", ids, 48))))
        assert sum(d.num_new_tokens for d in deltas) == 48  # type: ignore[attr-defined]
        s = eng.stats()
        assert s.spec_drafts_total > 0
        assert s.spec_draft_tokens_total >= s.spec_drafts_total
        assert 0 <= s.spec_accepted_tokens_total <= s.spec_draft_tokens_total
    finally:
        eng.close()


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16"])
def test_a_model_quantized_here_is_served_by_the_cpu_engine(
    scheme: Scheme, tiny_model_dir: Path, engine_loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """``switchyard models quantize``'s output is what vLLM's CPU build loads: the
    compressed-tensors config is read as such and the int8 / int4 kernels generate."""
    model = quantize(tiny_model_dir, tmp_path / scheme, scheme, group_size=32)
    eng = VLLMEngine(
        VLLMEngineConfig(
            model_path=model,
            served_name=f"tiny-{scheme}",
            max_model_len=512,
            kv_cache_memory_bytes=64 * 1024**2,
            max_num_seqs=2,
        )
    )
    engine_loop.run_until_complete(eng.start())
    try:
        assert eng.knobs()["quantization"] == "compressed-tensors"
        ids = eng.apply_chat_template([{"role": "user", "content": "hello world"}])
        deltas = engine_loop.run_until_complete(_drain(eng.generate(_request("q", ids, 8))))
        assert sum(d.num_new_tokens for d in deltas) == 8  # type: ignore[attr-defined]
    finally:
        eng.close()
