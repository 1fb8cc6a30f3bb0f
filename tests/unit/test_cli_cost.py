"""``switchyard cost`` on a shipped report of record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app.cli.cost import parse_scenario
from app.cli.main import app
from app.cost.scenarios import Instance


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("big=2.5@10", Instance("big", 2.5, 10.0)),
        ("small=0.4@1.5@0.61", Instance("small", 0.4, 1.5, 0.61)),
        ("small=0.4@1.5@0.61@0.97", Instance("small", 0.4, 1.5, 0.61, 0.97)),
    ],
)
def test_a_scenario_names_its_price_capacity_and_optionally_quality_and_slo(
    text: str, expected: Instance
) -> None:
    assert parse_scenario(text) == expected


@pytest.mark.parametrize("bad", ["big=2.5", "big=x@1", "big=1@2@3@4@5"])
def test_a_malformed_scenario_is_refused(bad: str) -> None:
    with pytest.raises(typer.BadParameter, match="NAME=HOURLY@CAPACITY_RPS"):
        parse_scenario(bad)


def test_quality_and_slo_stand_beside_each_scenarios_cost(tmp_path: Path) -> None:
    args = ["cost", str(REPORT), "--gpu-hourly", "0.10", "--run", "default.loads.c32-run1",
            "--quality", "0.64", "--slo", "e2e=20000", "--scenario", "cheap=0.05@2.0@0.5@0.9",
            "--api-quality", "gpt-4o-mini=0.8", "--out", str(tmp_path)]  # fmt: skip
    got = CliRunner().invoke(app, args)
    assert got.exit_code == 0, got.output
    doc = json.loads((tmp_path / "cost-profiles-kv-2026-12-06-b.json").read_text())
    rows = {m["scenario"]: m for m in doc["sheet"]["monthly"] if m["case"] == "base"}
    measured = rows["measured ×1"]
    data = json.loads(REPORT.read_text())
    records = [r for r in data["arms"]["default"]["loads"]["c32-run1"]["records"]]
    e2e_ok = [r for r in records if not r.get("warmup") and r["end"] is not None
              and r["end"] <= 20.0]  # fmt: skip
    assert measured["quality"] == 0.64
    assert measured["slo_met"] == pytest.approx(len(e2e_ok) / 32)
    assert (rows["cheap"]["quality"], rows["cheap"]["slo_met"]) == (0.5, 0.9)
    api = [m for name, m in rows.items() if name.startswith("API ") and "4o-mini" in name]
    assert api and all(m["quality"] == 0.8 for m in api)
    md = (tmp_path / "cost-profiles-kv-2026-12-06-b.md").read_text()
    assert "| quality | SLO met |" in md
    unknown = CliRunner().invoke(app, [*args[:-2], "--api-quality", "nope=1", "--out", "x"])
    assert unknown.exit_code == 2 and "no price for 'nope'" in _flat(unknown.output)
