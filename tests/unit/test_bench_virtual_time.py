"""Virtual time: sleepers wake in time order, simulated engines run on it exactly."""

from __future__ import annotations

import asyncio

from app.bench.virtual_time import VirtualTime
from app.engine.protocol import GenerationRequest, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile


async def test_sleepers_wake_in_order_at_their_times() -> None:
    vt = VirtualTime()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, d: float) -> None:
        await vt.sleep(d)
        woke.append((name, vt.now))
        await vt.sleep(d)
        woke.append((name, vt.now))

    tasks = [asyncio.ensure_future(sleeper(n, d)) for n, d in (("a", 3.0), ("b", 1.0))]
    await vt.run(lambda: all(t.done() for t in tasks))
    assert woke == [("b", 1.0), ("b", 2.0), ("a", 3.0), ("a", 6.0)]


async def test_two_simulated_engines_share_one_virtual_clock() -> None:
    vt = VirtualTime()
    profile = SimulationProfile(decode_base_s=0.05, decode_s_per_seq=0.0,
                                prefill_s_per_token=0.001, eos_probability=0.0)  # fmt: skip
    engines = [SimulatedEngine(profile, clock=vt, sleep=vt.sleep) for _ in range(2)]
    for e in engines:
        await e.start()
    ends: list[float] = []

    async def one(engine: SimulatedEngine, rid: str) -> None:
        req = GenerationRequest(rid, tuple(range(100)), SamplingOptions(ignore_eos=True), 10)
        async for delta in engine.generate(req):
            if delta.finish_reason is not None:
                ends.append(vt.now)

    tasks = [asyncio.ensure_future(one(e, f"r{i}")) for i, e in enumerate(engines)]
    await vt.run(lambda: all(t.done() for t in tasks))
    # prefill step: 0.05 + 100 × 0.001, then 9 decode steps of 0.05: 0.6 s, in parallel
    assert [round(e, 9) for e in ends] == [0.6, 0.6]
    for e in engines:
        await e.shutdown()
