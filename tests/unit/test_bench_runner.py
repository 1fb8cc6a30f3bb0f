"""app.bench.runner: open-loop schedules are kept and flagged, closed-loop users never
overlap their own requests, sessions chain their calls — against the simulated
endpoint in this process."""

from __future__ import annotations

import itertools

import pytest

from app.bench.agentic import AgenticWorkload
from app.bench.client import Client
from app.bench.prompts import PromptFactory, SimulatedCounter
from app.bench.runner import Recorder, RequestJobs, SessionJobs, closed_loop, open_loop
from app.bench.schedule import arrivals
from app.bench.simserver import SimServerConfig, serve_in_background
from app.bench.workloads import FixedWorkload
from app.engine.simulated import SimulationProfile

FAST = SimServerConfig(
    profile=SimulationProfile(
        decode_base_s=0.002, decode_s_per_seq=0.0, prefill_s_per_token=0.0, max_batch_size=512
    )
)
FACTORY = PromptFactory(SimulatedCounter(), seed=0)


def _fixed(output_tokens: int = 4) -> FixedWorkload:
    return FixedWorkload("simulated-llm", "chat", 16, output_tokens, FACTORY, 0)


async def test_open_loop_keeps_the_schedule_and_flags_warmup() -> None:
    offsets = arrivals("constant", 100.0, 30)
    async with serve_in_background(FAST) as url, Client(url) as client:
        rec = Recorder(client)
        start = await open_loop(rec, RequestJobs(_fixed()), offsets, stage=2, warmup_s=0.1)
    records = sorted(rec.records, key=lambda r: r.intended)
    assert len(records) == 30 and all(r.ok for r in records)
    assert [r.intended - start for r in records] == pytest.approx(offsets)
    assert all(r.lag >= 0 for r in records) and {r.stage for r in records} == {2}
    # offsets 0.01 .. 0.09 are warm-up (< 0.1 s), 0.10 onwards measured
    assert [r.warmup for r in records] == [o < 0.1 for o in offsets]
    assert rec.done == 30 and rec.failed == 0 and rec.in_flight == 0


async def test_closed_loop_users_send_one_request_at_a_time() -> None:
    async with serve_in_background(FAST) as url, Client(url) as client:
        rec = Recorder(client)
        await closed_loop(rec, RequestJobs(_fixed(8)), 3, stage=0, warmup_s=0.0, duration_s=0.6)
    assert rec.max_in_flight <= 3 and len(rec.records) > 3
    # a user's next request is intended at (or after) the end of its previous one
    ends = sorted(r.intended + (r.end or 0) for r in rec.records)
    starts = sorted(r.intended for r in rec.records)
    for k, start in enumerate(starts[3:]):
        assert start >= ends[k] - 1e-9
    assert max(r.intended for r in rec.records) < rec.clock()


async def test_closed_loop_stops_at_max_jobs() -> None:
    async with serve_in_background(FAST) as url, Client(url) as client:
        rec = Recorder(client)
        await closed_loop(
            rec, RequestJobs(_fixed()), 4, stage=0, warmup_s=0.0, duration_s=60.0, max_jobs=10
        )
    assert len(rec.records) == 10


async def test_think_time_spaces_a_users_requests() -> None:
    async with serve_in_background(FAST) as url, Client(url) as client:
        rec = Recorder(client)
        await closed_loop(
            rec, RequestJobs(_fixed(2)), 1, stage=0, warmup_s=0.0, duration_s=0.6, think_s=0.2
        )
    gaps = [
        b.intended - (a.intended + (a.end or 0))
        for a, b in zip(rec.records, rec.records[1:], strict=False)
    ]
    assert gaps and sum(gaps) / len(gaps) > 0.05  # exponential, mean 0.2 s


async def test_sessions_chain_their_calls_in_order() -> None:
    agent = AgenticWorkload("simulated-llm", "simulated-embed", FACTORY, seed=1, step_output=8)
    async with serve_in_background(FAST) as url, Client(url, keep_text=True) as client:
        rec = Recorder(client)
        await open_loop(rec, SessionJobs(agent), [0.0, 0.01, 0.02], stage=0, warmup_s=0.0)
    by_session: dict[int, list[str]] = {}
    for r in sorted(rec.records, key=lambda r: (r.session or 0, r.step or 0)):
        assert r.ok, r.error
        by_session.setdefault(r.session or 0, []).append(r.kind)
    assert set(by_session) == {0, 1, 2}
    for index, kinds in by_session.items():
        plan = agent.session(index)
        assert len(kinds) == plan.calls
        assert kinds[:3] == ["planner", "embed", "generate_1"]
    # a chained call is intended when the previous one ended
    for s in by_session:
        calls = sorted((r for r in rec.records if r.session == s), key=lambda r: r.step or 0)
        for a, b in itertools.pairwise(calls):
            assert b.intended >= a.intended + (a.end or 0) - 1e-9


async def test_a_failed_call_ends_its_session() -> None:
    agent = AgenticWorkload("simulated-llm", "no-such-embedder", FACTORY, seed=1)
    async with serve_in_background(FAST) as url, Client(url, keep_text=True) as client:
        rec = Recorder(client)
        await open_loop(rec, SessionJobs(agent), [0.0], stage=0, warmup_s=0.0)
    assert [r.kind for r in rec.records] == ["planner", "embed"]
    assert rec.records[1].error_kind == "http_4xx" and rec.failed == 1
