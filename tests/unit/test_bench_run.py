"""app.bench.run: a whole run's result (schema, warm-up, schedule accuracy, secrets),
and ramps that stop at the first stage breaking the SLO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bench.metrics import SLO
from app.bench.report import SCHEMA
from app.bench.run import BenchConfig, execute
from app.bench.simserver import SimServerConfig, serve_in_background
from app.engine.simulated import SimulationProfile

FAST = SimServerConfig(
    profile=SimulationProfile(
        decode_base_s=0.002, decode_s_per_seq=0.0, prefill_s_per_token=0.0, max_batch_size=512
    )
)
SMALL = {"kind": "fixed", "input_tokens": 16, "output_tokens": 4}


async def test_open_run_result_has_every_section() -> None:
    async with serve_in_background(FAST) as url:
        config = BenchConfig(
            base_url=url,
            rate=40.0,
            warmup_s=0.25,
            duration_s=0.5,
            workload=SMALL,
            slo=SLO(ttft_s=5.0),
        )
        result = await execute(config)
    assert result["schema"] == SCHEMA
    for key in (
        "metadata",
        "config",
        "workload",
        "stages",
        "summary",
        "by_kind",
        "self_check",
        "connections",
        "records",
    ):
        assert result[key] is not None, key
    assert result["config"]["model"] == "simulated-llm"  # first generation model listed
    assert result["config"]["max_model_len"] == 2048  # from /v1/models
    records = result["records"]
    assert len(records) == 30  # 40 req/s x 0.75 s
    measured = [r for r in records if not r["warmup"]]
    assert result["summary"]["requests"] == len(measured) < len(records)
    assert result["summary"]["good_requests"] == len(measured)
    sched = result["stages"][0]["schedule"]
    assert sched["jobs"] == 30 and sched["planned_rps"] == pytest.approx(40.0)
    assert sched["achieved_rps"] == pytest.approx(40.0, rel=0.2)
    assert result["connections"]["opened"] == len(measured)
    assert result["ramp"] is None and result["sessions"] is None
    assert result["stages"][0]["server"] == {}  # the simulated endpoint exports no /metrics


async def test_api_keys_never_reach_the_result() -> None:
    async with serve_in_background(FAST) as url:
        config = BenchConfig(
            base_url=url,
            api_key="sk-secret-1",
            rate=20.0,
            warmup_s=0.0,
            duration_s=0.2,
            workload={
                "kind": "shared_prefix",
                "tenants": 2,
                "prefix_tokens": 8,
                "suffix_tokens": 4,
                "output_tokens": 2,
                "tenant_keys": {"tenant-1": "sk-secret-2", "tenant-2": "sk-secret-3"},
            },
        )
        result = await execute(config)
    text = json.dumps(result)
    assert "sk-secret" not in text
    assert result["config"]["workload"]["tenants_with_keys"] == ["tenant-1", "tenant-2"]


async def test_ramp_stops_at_the_first_stage_over_the_p95_slo() -> None:
    # one request at a time, ~20 ms each: 5 req/s is easy, 200 req/s queues for seconds
    slow = SimServerConfig(
        profile=SimulationProfile(
            decode_base_s=0.005,
            decode_s_per_seq=0.0,
            prefill_s_per_token=0.0,
            max_batch_size=1,
            max_waiting=10_000,
        )
    )
    async with serve_in_background(slow) as url:
        config = BenchConfig(
            base_url=url,
            mode="ramp",
            ramp_by="rate",
            stages=[5.0, 200.0, 400.0],
            warmup_s=0.0,
            duration_s=1.0,
            workload=SMALL,
            slo=SLO(e2e_s=0.3, p95_metric="e2e"),
        )
        result = await execute(config)
    assert [s["safe"] for s in result["stages"]] == [True, False]  # 400 req/s never runs
    assert result["ramp"] == {
        "stopped": True,
        "stop_stage": 1,
        "last_safe_stage": 0,
        "reason": result["stages"][1]["reason"],
    }
    assert "p95 e2e" in result["stages"][1]["reason"]


async def test_ramp_stops_on_the_error_rate() -> None:
    tiny = SimServerConfig(
        profile=SimulationProfile(
            decode_base_s=0.01,
            decode_s_per_seq=0.0,
            prefill_s_per_token=0.0,
            max_batch_size=1,
            max_waiting=1,
        )
    )
    async with serve_in_background(tiny) as url:
        config = BenchConfig(
            base_url=url,
            mode="ramp",
            ramp_by="concurrency",
            stages=[1, 16],
            warmup_s=0.0,
            duration_s=0.5,
            workload=SMALL,
        )
        result = await execute(config)
    first, second = result["stages"]
    assert first["safe"] and first["summary"]["failed"] == 0
    assert not second["safe"] and "error rate" in second["reason"]
    assert second["summary"]["errors"]["http_429"] > 0
    assert second["offered_rps"] > 0 and second["concurrency"] == 16
    assert result["connections"]["errors"]["http_429"] == second["summary"]["errors"]["http_429"]


async def test_agentic_run_reports_sessions() -> None:
    async with serve_in_background(FAST) as url:
        config = BenchConfig(
            base_url=url,
            mode="closed",
            concurrency=2,
            warmup_s=0.0,
            duration_s=0.5,
            workload={
                "kind": "agentic",
                "question_tokens": 8,
                "context_tokens": 8,
                "planner_output": 4,
                "step_output": 4,
            },
        )
        result = await execute(config)
    sessions = result["sessions"]
    assert sessions is not None and sessions["sessions"] >= 2
    kinds = set(result["by_kind"])
    assert {"planner", "embed", "generate_1", "generate_2"} <= kinds
    embed = [r for r in result["records"] if r["kind"] == "embed"]
    assert embed and all(r["endpoint"] == "embeddings" for r in embed)


async def test_a_timed_trace_replays_on_its_own_clock(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0.0, "input_tokens": 8, "output_tokens": 2},
        {"timestamp": 0.2, "prompt": "hello there", "output_tokens": 3, "endpoint": "completions"},
        {"timestamp": 0.6, "input_tokens": 12, "output_tokens": 2, "kind": "late"},
    ]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    async with serve_in_background(FAST) as url:
        config = BenchConfig(
            base_url=url, mode="open", rate=1.0, warmup_s=0.0, duration_s=1.0,
            time_scale=0.5, workload={"kind": "trace", "path": str(trace)},
        )  # fmt: skip
        result = await execute(config)
    records = sorted(result["records"], key=lambda r: r["intended"])
    assert len(records) == 3 and all(r["error_kind"] is None for r in records)
    t0 = records[0]["intended"]
    # timestamps x 0.5: twice as fast
    assert [r["intended"] - t0 for r in records] == pytest.approx([0.0, 0.1, 0.3], abs=1e-6)
    assert [r["endpoint"] for r in records] == ["chat", "completions", "chat"]
    assert records[2]["kind"] == "late"
