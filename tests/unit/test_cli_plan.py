"""``switchyard plan`` on the shipped CPU profile reports with the shipped mix."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.cli.plan import parse_objective
from app.cost.queueing import max_rate

ROOT = Path(__file__).parents[2]
REPORTS = [
    ROOT / "docs" / "benchmarks" / f"profile-tune-{p}-cpu.json"
    for p in ("interactive", "throughput")
]
MIX = ROOT / "benchmarks" / "mixes" / "cpu-chat.yaml"


def _flat(text: str) -> str:
    return " ".join(w for w in text.replace("│", " ").split())


def _point(report: Path, value: int, concurrency: int) -> dict[str, Any]:
    curve: list[dict[str, Any]] = json.loads(report.read_text())["curve"]
    (p,) = [p for p in curve if (p["value"], p["concurrency"]) == (value, concurrency)]
    return p


def _goodput(report: Path, value: int, concurrency: int) -> float:
    return float(_point(report, value, concurrency)["goodput"])


def _capacity(report: Path, value: int, concurrency: int, metric: str, limit_ms: float) -> float:
    """min(goodput, the Poisson rate whose wait fits what the limit leaves above the p95)."""
    p = _point(report, value, concurrency)
    budget = (limit_ms - p[f"{metric}_ms"]["p95"]) / 1000
    return min(p["goodput"], max_rate(concurrency, p["e2e_ms"]["p50"] / 1000, budget))


def _run(tmp_path: Path, slo: str, *extra: str) -> Any:
    args = ["plan", *map(str, REPORTS), "--rps", "2", "--mix", str(MIX), "--slo", slo,
            "--gpu-hourly", "0.10", "--out", str(tmp_path), "--stem", "p", *extra]  # fmt: skip
    return CliRunner().invoke(app, args)


def test_a_plan_from_the_reports_of_record(tmp_path: Path) -> None:
    got = _run(tmp_path, "ttft_p95=1500,itl_p95=150")
    assert got.exit_code == 0, got.output
    doc = json.loads((tmp_path / "p.json").read_text())
    chat, batch = doc["classes"]
    # chat (80 % of 2 req/s) under TTFT 1500 / ITL 150 ms: the interactive report's
    # max_num_seqs=4 at concurrency 2 — the throughput points at their batch break TTFT
    g_chat = _goodput(REPORTS[0], 4, 2)
    assert (chat["chosen"]["profile"], chat["chosen"]["concurrency"]) == ("interactive", 2)
    # random arrivals wait for one of the 2 slots: far fewer than the closed loop's goodput
    k_chat = _capacity(REPORTS[0], 4, 2, "ttft", 1500)
    assert k_chat < g_chat / 4 and chat["chosen"]["capacity"] == pytest.approx(k_chat)
    need = math.ceil(1.6 / k_chat)
    assert (chat["chosen"]["replicas_needed"], chat["chosen"]["replicas"]) == (need, need + 1)
    assert chat["chosen"]["utilisation"] == pytest.approx(1.6 / (need * g_chat))
    assert chat["chosen"]["monthly_cost"] == pytest.approx((need + 1) * 0.10 * 730)
    assert len(chat["candidates"]) == 3 and chat["rejected"]
    # batch (20 %, E2E 60 s, throughput only): max_num_seqs=16 at concurrency 16
    g_batch = _goodput(REPORTS[1], 16, 16)
    k_batch = _capacity(REPORTS[1], 16, 16, "e2e", 60000)
    assert (batch["chosen"]["value"], batch["chosen"]["concurrency"]) == (16, 16)
    assert batch["chosen"]["replicas"] == math.ceil(0.4 / k_batch) + 1 == 2
    total = doc["total"]
    assert total["gpus"] == need + 1 + 2
    assert total["monthly_cost"] == pytest.approx(total["gpus"] * 0.10 * 730)
    assert total["utilisation"] == pytest.approx(2 / (need * g_chat + g_batch))
    assert [r["source"] for r in doc["reports"]] == [p.name for p in REPORTS]
    assert all(r["commit"] for r in doc["reports"])
    out = _flat(got.output)
    assert f"total: {need + 3} replicas, {need + 3} GPUs" in out
    assert "## chat" in (tmp_path / "p.md").read_text()


def test_an_slo_no_curve_meets_is_refused(tmp_path: Path) -> None:
    got = _run(tmp_path, "ttft_p95=500,itl_p95=150")
    assert got.exit_code == 2
    out = _flat(got.output)
    assert (
        "plan refused: class 'chat': no measured point meets ttft_p95_ms=500,itl_p95_ms=150" in out
    )
    assert "nearest measured point: interactive max_num_seqs=4 concurrency 1" in out
    assert not (tmp_path / "p.json").exists()


def test_a_hardware_the_reports_were_not_measured_on_is_refused(tmp_path: Path) -> None:
    got = _run(tmp_path, "ttft_p95=1500,itl_p95=150", "--hardware", "H100")
    assert got.exit_code == 2
    assert "no profile report was measured on hardware 'H100'" in _flat(got.output)
    assert _run(tmp_path, "ttft_p95=1500,itl_p95=150", "--hardware", "epyc").exit_code == 0


def test_a_bad_mix_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "mix.yaml"
    bad.write_text("classes:\n  - {name: a, share: 1, colour: red}\n")
    got = CliRunner().invoke(
        app,
        [
            "plan",
            "--rps",
            "1",
            "--mix",
            str(bad),
            "--slo",
            "ttft=900",
            "--gpu-hourly",
            "1",
            "--out",
            str(tmp_path),
        ],
    )
    assert got.exit_code == 2 and "not a valid mix" in _flat(got.output)


@pytest.mark.parametrize("text", ["ttft_p95=1500,itl_p95=150", "ttft_p95_ms=1500,itl=150"])
def test_slo_spellings(text: str) -> None:
    assert parse_objective(text).model_dump() == {
        "ttft_p95_ms": 1500.0,
        "itl_p95_ms": 150.0,
        "e2e_p95_ms": None,
    }
