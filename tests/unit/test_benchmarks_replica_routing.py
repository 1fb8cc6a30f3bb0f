"""benchmarks.replica_routing on a tiny cluster run in virtual time: every request is
served once, the engines' own hit counts are read, and an affinity arm beats
round-robin on a shared-context workload (deterministic: same seed, virtual time)."""

from __future__ import annotations

import benchmarks.replica_arms as arms
import benchmarks.replica_routing as rr
from app.engine.kv_events import KvEvent


async def test_affinity_beats_round_robin_on_shared_contexts() -> None:
    requests = rr.shared_context(48, seed=7)
    arrivals = rr.poisson(2.0, 48, seed=11)
    got = {}
    for arm in (arms.RoundRobin(), arms.Ours([f"replica-{i}" for i in range(rr.REPLICAS)])):
        res = await rr.serve(arm, requests, arrivals)
        assert res.done == 48 and len(res.ttft) == 48
        got[arm.name] = rr.figures(res)
    assert got["ours"]["hit_rate"] > 2 * got["round-robin"]["hit_rate"]
    assert got["ours"]["ttft_p50_s"] < got["round-robin"]["ttft_p50_s"]


async def test_a_closed_loop_serves_every_request() -> None:
    res = await rr.serve(arms.LeastLoaded(), rr.no_reuse(16, seed=3), None, users=4)
    assert res.done == 16 and res.cached_tokens == 0 and res.span_s > 0


class Listening(arms.Ours):
    heard = 0

    def engine_events(self, replica: str, events: list[KvEvent]) -> None:
        self.heard += len(events)
        super().engine_events(replica, events)


async def test_precise_arms_hear_the_engines_and_agent_sessions_run_in_order() -> None:
    names = [f"replica-{i}" for i in range(rr.REPLICAS)]
    precise = Listening(names, "precise")
    sessions = rr.agentic(4, seed=1)
    assert [len(s) for s in sessions] == [rr.AGENT_CALLS] * 4
    grown = [len(c.tokens) for c in sessions[0]]
    assert grown == sorted(grown) and sessions[0][1].tokens[: grown[0]] == sessions[0][0].tokens
    starts = rr.bursts(4, 2, 1.0, seed=2)
    assert starts[0] == starts[1] < starts[2] == starts[3]
    res = await rr.serve(precise, [], starts, sessions=sessions)
    assert res.done == 16 and len(res.session_e2e) == 4
    assert precise.heard >= 16  # every prefill stored blocks, and the engines said so
    assert res.cached_tokens > 0  # later calls reuse the growing context
