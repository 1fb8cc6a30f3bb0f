"""benchmarks.replica_routing on a tiny cluster run in virtual time: every request is
served once, the engines' own hit counts are read, and an affinity arm beats
round-robin on a shared-context workload (deterministic: same seed, virtual time)."""

from __future__ import annotations

import benchmarks.replica_routing as rr


async def test_affinity_beats_round_robin_on_shared_contexts() -> None:
    requests = rr.shared_context(48, seed=7)
    arrivals = rr.poisson(2.0, 48, seed=11)
    got = {}
    for arm in (rr.RoundRobin(), rr.Ours([f"replica-{i}" for i in range(rr.REPLICAS)])):
        res = await rr.serve(arm, requests, arrivals)
        assert res.done == 48 and len(res.ttft) == 48
        got[arm.name] = rr.figures(res)
    assert got["ours"]["hit_rate"] > 2 * got["round-robin"]["hit_rate"]
    assert got["ours"]["ttft_p50_s"] < got["round-robin"]["ttft_p50_s"]


async def test_a_closed_loop_serves_every_request() -> None:
    res = await rr.serve(rr.LeastLoaded(), rr.no_reuse(16, seed=3), None, users=4)
    assert res.done == 16 and res.cached_tokens == 0 and res.span_s > 0
