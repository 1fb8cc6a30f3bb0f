"""``switchyard bench`` against a deployed Switchyard application (simulated engines):
the generator's counts agree with the gateway's own ledger and metrics — every request
it saw completed is one ledger record with the same tokens — and a session workload
reaches the embedding model through the gateway."""

from __future__ import annotations

import pytest

from app.bench.metrics import SLO
from app.bench.run import BenchConfig, execute
from tests.integration.conftest import Gateway


async def test_bench_counts_agree_with_the_ledger_and_gateway_metrics(
    sim_gateway: Gateway,
) -> None:
    key = sim_gateway.new_key(tenant="bench-ledger")
    config = BenchConfig(
        base_url=sim_gateway.root,
        api_key=key,
        model="sim-chat",
        mode="open",
        rate=20.0,
        warmup_s=0.0,
        duration_s=1.5,
        workload={"kind": "fixed", "input_tokens": 16, "output_tokens": 8},
        slo=SLO(ttft_s=5.0),
    )
    result = await execute(config)
    s = result["summary"]
    assert s["requests"] == 30 and s["completed"] == 30 and s["goodput"] is not None
    records = sim_gateway.records("bench-ledger", 30)
    assert len(records) == 30  # one ledger record per request, none lost or doubled
    assert sum(r["completion_tokens"] for r in records) == s["total_output_tokens"] == 240
    assert sum(r["prompt_tokens"] for r in records) == s["total_input_tokens"]
    server = result["stages"][0]["server"]  # scraped from the gateway's /metrics
    assert server["gateway_ttft"]["count"] == 30
    assert result["metadata"]["model_id"] == "sim-chat"
    assert result["metadata"]["engine"] == "switchyard"
    assert key not in str(result)


async def test_agentic_sessions_run_through_the_gateway(sim_gateway: Gateway) -> None:
    config = BenchConfig(
        base_url=sim_gateway.root,
        api_key=sim_gateway.new_key(tenant="bench-agent"),
        model="sim-chat",
        embed_model="sim-embed",
        mode="open",
        rate=4.0,
        warmup_s=0.0,
        duration_s=1.0,
        workload={"kind": "agentic", "planner_output": 8, "step_output": 8},
    )
    result = await execute(config)
    sessions = result["sessions"]
    assert sessions is not None and sessions["sessions"] == 4 == sessions["completed"]
    kinds = result["by_kind"]
    assert kinds["embed"]["completed"] == 4 and kinds["generate_2"]["completed"] == 4
    calls = sum(k["completed"] for k in kinds.values())
    assert len(sim_gateway.records("bench-agent", calls)) == calls
    assert sessions["predicted_tail_fraction"] == pytest.approx(
        sum(1 - 0.95**n for n in _calls(result)) / 4
    )


def _calls(result: dict[str, object]) -> list[int]:
    per: dict[int, int] = {}
    for r in result["records"]:  # type: ignore[attr-defined]
        per[r["session"]] = per.get(r["session"], 0) + 1
    return list(per.values())
