"""Prefill/decode disaggregation on simulated engines (virtual time,
benchmarks.pd_disagg): every arm serves every request through the same two-leg stream
the ingress runs; the fixed arms do what they say; the rule disaggregates long
uncached prompts and keeps short ones whole; on long prompts the decode role's TPOT is
free of prefill stalls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.bench.schedule import arrivals
from benchmarks import pd_disagg as bench

N = 120


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in bench.WORKLOADS:
        jobs = bench.workload(kind, N, seed=7)
        cap = asyncio.run(bench.serve("unified", jobs, None, users=bench.SETTINGS["cpu"].users))
        times = arrivals("poisson", 0.5 * cap.done / cap.span_s, N, seed=11)
        slo = bench.TTFT_SLO_X * bench.unloaded_ttft(bench.WORKLOADS[kind][0])
        out[kind] = {
            arm: bench.figures(asyncio.run(bench.serve(arm, jobs, times)), slo)
            for arm in bench.ARMS
        }
    return out


def test_every_arm_serves_every_request(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    for kind, arms in results.items():
        for arm, r in arms.items():
            assert r["requests"] == N, (kind, arm)
            assert sum(r["reasons"].values()) == N, (kind, arm)


def test_the_fixed_arms_do_what_they_say(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    for arms in results.values():
        assert arms["unified"]["remote_share"] == 0
        assert arms["pd-always"]["remote_share"] == 1
        assert arms["pd-always"]["mean_transfer_s"] > 0


def test_the_rule_splits_by_prompt_length(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    short = results["balanced"]["pd-auto"]["reasons"]
    assert short.get("short", 0) > 0 and set(short) <= {"short", "decode_busy", "prefill_busy"}
    long = results["long"]["pd-auto"]["reasons"]
    assert long.get("long_uncached", 0) > 0
    assert set(long) <= {"long_uncached", "prefill_busy"}


def test_decode_replicas_without_prefills_stream_steadily(
    results: dict[str, dict[str, dict[str, Any]]],
) -> None:
    long = results["long"]
    assert long["pd-always"]["tpot_p90_s"] < long["unified"]["tpot_p90_s"]


def test_the_split_sets_the_prefill_roles_capacity() -> None:
    """Long prompts always disaggregated are prefill-bound on the CPU calibration: in a
    closed loop (virtual time) six prefill replicas serve more than two."""
    jobs = bench.workload("long", 48, seed=3)

    def throughput(prefill_replicas: int) -> float:
        r = asyncio.run(bench.serve("pd-always", jobs, None, users=16,
                                    prefill_replicas=prefill_replicas))  # fmt: skip
        assert r.done == len(jobs)
        return r.done / r.span_s

    assert throughput(6) > 1.5 * throughput(2)
