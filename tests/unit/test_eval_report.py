"""Scores and the report (app.eval.report): the Wilson interval against hand-computed
values, failures by class, and the files a run writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.eval.graders import Answer, Verdict
from app.eval.report import document, summarise, wilson, write
from app.eval.runner import Result


@pytest.mark.parametrize(
    ("passed", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.2775),  # never below 0
        (10, 10, 0.7225, 1.0),  # never above 1
        (50, 100, 0.4038, 0.5962),
        (81, 100, 0.7222, 0.8749),
        (0, 0, 0.0, 1.0),  # nothing graded: nothing known
    ],
)
def test_wilson(passed: int, n: int, low: float, high: float) -> None:
    got = wilson(passed, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def result(layer: str, ok: bool, failure: str | None = None) -> Result:
    return Result(
        layer, f"{layer}-{ok}-{failure}", "answer", Verdict(ok, failure), Answer("x"), 0.1, 5, 2
    )  # type: ignore[arg-type]


def test_scores_per_set_and_overall() -> None:
    results = [
        result("general", True),
        result("general", False, "wrong"),
        result("general", False, "truncated"),
        result("korean", True),
        result("korean", False, "language"),
    ]
    s = summarise(results)
    assert list(s["sets"]) == ["general", "korean"]
    g, k, o = s["sets"]["general"], s["sets"]["korean"], s["overall"]
    assert (g["n"], g["passed"], k["passed"], o["n"], o["passed"]) == (3, 1, 1, 5, 2)
    assert g["score"] == pytest.approx(1 / 3) and o["score"] == pytest.approx(0.4)
    assert g["failures"]["wrong"] == 1 and g["failures"]["truncated"] == 1
    assert o["failures"]["language"] == 1 and o["failures"]["error"] == 0


def test_the_report_files(tmp_path: Path) -> None:
    meta = {
        "model": "m",
        "date": "2026-12-07T12:00:00+00:00",
        "git_commit": "abc",
        "command": "switchyard eval run --model m",
        "sets": ["general v1 (x)"],
        "concurrency": 2,
        "limit": None,
    }
    doc = document([result("general", True), result("general", False, "wrong")], meta)
    paths = write(doc, tmp_path, "eval-m")
    assert [p.name for p in paths] == ["eval-m.json", "eval-m.md", "eval-m.png"]
    back = json.loads(paths[0].read_text())
    assert back["overall"]["passed"] == 1 and len(back["items"]) == 2
    assert back["items"][1]["failure"] == "wrong"
    md = paths[1].read_text()
    assert "| general | 2 | 1 | 50.0 % |" in md and "![scores and failures](eval-m.png)" in md
