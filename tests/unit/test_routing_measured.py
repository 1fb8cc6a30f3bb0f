"""Measured quality in the routes file (app.routing.measured): filled from an eval
report, given fields winning, a missing report named, staleness (the eval sets, the
model the report scored, the model's files), and the policy and route header using it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.routing.measured import MeasuredQuality, stale
from app.routing.spec import RoutesFileError, load_routes, parse_routes
from app.routing.table import RouteRequest, RouteTable

LABELS = ["general v1 (aaaaaaaaaaaa)", "korean v1 (bbbbbbbbbbbb)"]


def report(
    path: Path,
    score: float,
    model: str = "small",
    date: str = "2026-12-07T10:00:00+00:00",
    sets: list[str] | None = None,
) -> Path:
    doc = {
        "meta": {"model": model, "date": date, "sets": sets or LABELS},
        "overall": {"score": score, "n": 10, "passed": int(score * 10)},
        "items": [],
    }
    path.write_text(json.dumps(doc))
    return path


def routes(
    small_quality: Any, big_quality: Any = 0.9, floor: float | None = None
) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "candidates": ["small", "big"],
        "weights": {"quality": 1, "latency": 0, "cost": 0},
    }
    if floor is not None:
        policy["quality_floor"] = floor
    return {
        "pools": {"a": {"kind": "local", "model": "small"}, "b": {"kind": "local", "model": "big"}},
        "models": {
            "small": {"pool": "a", "profile": {"quality": small_quality}},
            "big": {"pool": "b", "profile": {"quality": big_quality}},
        },
        "aliases": {"auto": {"policy": policy}},
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    (tmp_path / "routes").mkdir(exist_ok=True)
    path = tmp_path / "routes" / "routes.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_measured_quality_is_read_from_its_report_relative_to_the_routes_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "routes").mkdir()
    report(tmp_path / "routes" / "eval.json", 0.95)
    spec = load_routes(write(tmp_path, routes({"measured": "eval.json"})))
    q = spec.models["small"].profile.quality
    assert isinstance(q, MeasuredQuality)
    assert (q.score, q.eval, q.model, q.date[:10]) == (0.95, LABELS, "small", "2026-12-07")
    assert spec.models["small"].profile.quality_score == 0.95
    assert spec.models["small"].profile.quality_note() == "0.95 (measured 2026-12-07)"
    assert spec.models["big"].profile.quality_note() == "0.9 (declared)"
    # the policy ranks by it, and the decision says which it used
    decision = RouteTable(1, spec).decide(RouteRequest("auto", prompt_tokens=10, max_tokens=10))
    assert decision is not None and decision.model == "small"
    assert decision.quality == "0.95 (measured 2026-12-07)"


def test_given_fields_win_and_a_spec_can_carry_the_values_without_the_file() -> None:
    inline = {"measured": "gone.json", "score": 0.4, "date": "2026-12-01"}
    spec = parse_routes(yaml.safe_dump(routes(inline)))
    assert spec.models["small"].profile.quality_score == 0.4
    decision = RouteTable(1, spec).decide(RouteRequest("auto", prompt_tokens=10, max_tokens=10))
    assert decision is not None and decision.model == "big" and decision.quality == "0.9 (declared)"


def test_a_measured_score_below_the_floor_drops_the_model(tmp_path: Path) -> None:
    (tmp_path / "routes").mkdir()
    report(tmp_path / "routes" / "eval.json", 0.3)
    spec = load_routes(write(tmp_path, routes({"measured": "eval.json"}, 0.5, floor=0.4)))
    decision = RouteTable(1, spec).decide(RouteRequest("auto", prompt_tokens=10, max_tokens=10))
    assert decision is not None and decision.model == "big"
    assert decision.policy is not None and "0.3 < floor 0.4" in decision.policy.dropped["small"]


@pytest.mark.parametrize(
    ("quality", "error"),
    [
        ({"measured": "missing.json"}, "cannot read the eval report missing.json"),
        ({"measured": "bad.json"}, "cannot read the eval report bad.json"),
        ({"measured": "eval.json", "colour": 1}, "Extra inputs"),
        (1.5, "between 0 and 1"),
    ],
)
def test_a_bad_quality_is_named(tmp_path: Path, quality: Any, error: str) -> None:
    (tmp_path / "routes").mkdir()
    report(tmp_path / "routes" / "eval.json", 0.5)
    (tmp_path / "routes" / "bad.json").write_text("{not json")
    with pytest.raises(RoutesFileError, match=error) as info:
        load_routes(write(tmp_path, routes(quality)))
    assert "models.small.profile.quality" in str(info.value)


@pytest.mark.parametrize(
    ("sets", "model", "mtime", "warnings"),
    [
        (LABELS, "small", None, []),
        (LABELS, "small", 0.0, []),  # files older than the report
        (["general v1 (cccccccccccc)", LABELS[1]], "small", None, ["eval sets changed"]),
        (LABELS, "other", None, ["scored other, not small"]),
        (LABELS, "small", 2e9, ["files changed after the report"]),  # 2033
        (["general v2 (x)"], "other", 2e9, ["eval sets changed", "scored other", "files changed"]),
    ],
)
def test_stale(
    tmp_path: Path, sets: list[str], model: str, mtime: float | None, warnings: list[str]
) -> None:
    (tmp_path / "routes").mkdir()
    report(tmp_path / "routes" / "eval.json", 0.5, model=model, sets=sets)
    spec = load_routes(write(tmp_path, routes({"measured": "eval.json"})))
    got = stale(spec, LABELS, {} if mtime is None else {"small": mtime})
    assert len(got) == len(warnings)
    for line, want in zip(got, warnings, strict=True):
        assert want in line and line.startswith("models.small.profile.quality (eval.json)")
