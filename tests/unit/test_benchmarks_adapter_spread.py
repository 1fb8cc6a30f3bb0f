"""The hot-adapter spread on simulated engines (virtual time): pinned routing keeps a hot
adapter on one replica and its queue grows; ours serves it from at least two warm
replicas, with as few cold loads as pinning and far fewer than adapter-blind routing.
Counts come from the engines' own counters and the replicas that served each request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks import adapter_spread as bench

N = 400


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    jobs = bench.workload(N, seed=7)
    cap = asyncio.run(bench.serve("least-loaded", jobs, None, users=bench.USERS))
    rate = 0.8 * cap.done / cap.span_s
    arrivals = bench.poisson(rate, N, seed=11)
    return {arm: bench.figures(asyncio.run(bench.serve(arm, jobs, arrivals)))
            for arm in bench.ARMS}  # fmt: skip


def test_every_request_is_served_by_every_arm(results: dict[str, dict[str, Any]]) -> None:
    for arm, r in results.items():
        assert r["requests"] == N, arm
        assert sum(r["requests_per_replica"].values()) == N, arm


def test_pinning_keeps_the_hot_adapter_on_one_replica(results: dict[str, dict[str, Any]]) -> None:
    assert results["pinned"]["hot_adapter_replicas"] == 1


def test_ours_spreads_the_hot_adapter(results: dict[str, dict[str, Any]]) -> None:
    ours, pinned = results["ours"], results["pinned"]
    assert ours["hot_adapter_replicas"] >= 2
    assert ours["ttft_p90_s"] < pinned["ttft_p90_s"]
    assert ours["balance_max_over_mean_p90"] < pinned["balance_max_over_mean_p90"]


def test_ours_loads_adapters_where_they_are_held(results: dict[str, dict[str, Any]]) -> None:
    # adapter-blind routing loads adapters everywhere; affinity loads each about once
    ours, blind = results["ours"], results["least-loaded"]
    assert ours["cold_loads"] * 4 < blind["cold_loads"]
    assert blind["hot_adapter_replicas"] == bench.REPLICAS
