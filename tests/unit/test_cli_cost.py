"""``switchyard cost`` on a shipped report of record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app


def _flat(text: str) -> str:
    """The words of a (boxed, wrapped) error, joined by single spaces."""
    return " ".join(w for w in text.replace("│", " ").split())


REPORT = Path(__file__).parents[2] / "docs" / "benchmarks" / "profiles-kv-2026-12-06-b.json"


def test_cost_of_a_report_of_record(tmp_path: Path) -> None:
    args = [
        "cost",
        str(REPORT),
        "--gpu-hourly",
        "0.10",
        "--run",
        "default.loads.c32-run1",
        "--utilisation",
        "0.3",
        "--scenario",
        "cheap=0.05@2.0",
        "--out",
        str(tmp_path),
    ]
    got = CliRunner().invoke(app, args)
    assert got.exit_code == 0, got.output
    doc = json.loads((tmp_path / "cost-profiles-kv-2026-12-06-b.json").read_text())
    monthly = doc["sheet"]["monthly"]
    assert {m["traffic"] for m in monthly} == {"low", "medium", "high"}
    assert {m["case"] for m in monthly} == {"best", "base", "worst"}
    scenarios = {m["scenario"] for m in monthly}
    assert {"measured ×1", "cheap"} <= scenarios and any(s.startswith("API ") for s in scenarios)
    assert doc["commit"] and doc["sheet"]["price_dates"]
    (fixed,) = doc["sheet"]["classes"]  # one workload class in that run
    assert fixed["name"] == "short" and fixed["requests"] == 32  # the report's workload
    assert fixed["per_request"] == pytest.approx(doc["sheet"]["unit_costs"]["per_request"])
    assert (
        "## $/request per workload class"
        in (tmp_path / "cost-profiles-kv-2026-12-06-b.md").read_text()
    )
    assert (tmp_path / "cost-profiles-kv-2026-12-06-b.png").stat().st_size > 0


def test_ambiguous_run_and_undated_price_are_refused(tmp_path: Path) -> None:
    got = CliRunner().invoke(app, ["cost", str(REPORT), "--gpu-hourly", "1"])
    assert got.exit_code == 2 and "pick one with --run" in _flat(got.output)
    prices = tmp_path / "p.yaml"
    prices.write_text(
        "rows:\n  - {provider: p, model: m, input_per_1m: 1, output_per_1m: 2, source: x}\n"
    )
    got = CliRunner().invoke(
        app,
        [
            "cost",
            str(REPORT),
            "--gpu-hourly",
            "1",
            "--run",
            "default.loads.t1",
            "--prices",
            str(prices),
        ],
    )
    assert got.exit_code == 2 and "price row 1 (p/m): date" in _flat(got.output)
