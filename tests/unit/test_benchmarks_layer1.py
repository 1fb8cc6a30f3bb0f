"""benchmarks.layer1: the pure helpers (percentile summary, per-second and window
counting, budget accounting, spike spacing, targets, report rendering) on hand-computed
cases. No wall-clock assertions."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.layer1 import evaluate_targets, render_markdown
from benchmarks.layer1_common import (
    PHASES,
    budget_accuracy,
    per_second,
    rate_window,
    spikes,
    summarize,
)


def test_summarize_in_milliseconds_with_interpolated_percentiles() -> None:
    s = summarize([0.004, 0.001, 0.003, 0.002])  # seconds, unsorted
    assert s["n"] == 4
    # sorted ms [1, 2, 3, 4]; position (n - 1) * q / 100
    assert s["p50_ms"] == pytest.approx(2.5)  # 1.5 -> 2 + 0.5
    assert s["p90_ms"] == pytest.approx(3.7)  # 2.7 -> 3 + 0.7
    assert s["p99_ms"] == pytest.approx(3.97)  # 2.97
    assert s["p99_9_ms"] == pytest.approx(3.997)  # 2.997
    assert s["mean_ms"] == pytest.approx(2.5)
    assert s["max_ms"] == pytest.approx(4.0)


def test_summarize_of_nothing() -> None:
    s = summarize([])
    assert s["n"] == 0
    assert {s[k] for k in s if k != "n"} == {None}


def test_per_second_counts_whole_seconds_and_drops_the_rest() -> None:
    offsets = [0.0, 0.05, 0.999, 1.0, 2.5, -0.1, 3.0]
    assert per_second(offsets, 3) == [3, 1, 1]
    assert per_second([], 2) == [0, 0]


def test_per_second_of_an_even_schedule() -> None:
    rate = 20.0
    assert per_second([i / rate for i in range(int(rate * 5))], 5) == [20] * 5


def test_rate_window_exact() -> None:
    counts = [20] * 10 + [10] * 60  # draining first, then the refill rate
    w = rate_window(counts, 60, 600)
    assert w == {
        "window_s": 60,
        "admitted": 600,
        "expected": 600.0,
        "per_minute": 600.0,
        "error_pct": 0.0,
    }


def test_rate_window_scaled_short_window() -> None:
    counts = [20] * 10 + [10] * 19 + [11]  # 30 s, the last 20 s counted
    w = rate_window(counts, 20, 600)
    assert w["admitted"] == 201
    assert w["expected"] == pytest.approx(200.0)
    assert w["per_minute"] == pytest.approx(603.0)
    assert w["error_pct"] == pytest.approx(0.5)


def _rec(prompt: int, completion: int, ingress: str) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "ingress": ingress}


def test_budget_accuracy_detects_room_left_for_one_more_request() -> None:
    records = [_rec(21, 64, "r1"), _rec(21, 64, "r2"), _rec(21, 64, "r1"), _rec(21, 30, "r2")]
    b = budget_accuracy(records, budget=400, min_output=16, max_tokens=64)
    assert b["billed"] == 3 * 85 + 51 == 306
    assert b["overshoot"] == -94
    assert b["unused"] == 94
    assert b["smallest_request"] == 21 + 16
    assert b["false_refusal"] is True  # 94 tokens could still hold a 37-token request
    assert b["capped"] == 1
    assert b["records"] == 4
    assert b["per_ingress"] == {"r1": 2, "r2": 2}


def test_budget_accuracy_tight_and_overshooting() -> None:
    records = [_rec(21, 64, "r1")] * 4  # 340 tokens
    tight = budget_accuracy(records, budget=370, min_output=16, max_tokens=64)
    assert (tight["unused"], tight["false_refusal"]) == (30, False)  # 30 < 37
    over = budget_accuracy(records, budget=300, min_output=16, max_tokens=64)
    assert over["overshoot"] == 40
    assert budget_accuracy([], budget=10, min_output=16, max_tokens=64)["smallest_request"] == 16


def test_spikes_report_a_periodic_cost() -> None:
    samples = [0.1, 3.0, 0.1, 0.1, 3.0, 0.1, 0.1, 3.0, 2.5]  # 2.5 is not above 2.5
    assert spikes(samples, 2.5) == {"count": 3, "median_gap": 3}
    assert spikes([0.1, 9.0], 2.5) == {"count": 1, "median_gap": None}


def _summary(p50: float, p99: float) -> dict[str, Any]:
    return {"n": 10, "p50_ms": p50, "p90_ms": p50, "p99_ms": p99, "p99_9_ms": p99,
            "mean_ms": p50, "max_ms": p99}  # fmt: skip


def _doc() -> dict[str, Any]:
    def config(p50: float, p99: float) -> dict[str, Any]:
        return {
            "summary": {ph: _summary(p50, p99) for ph in PHASES},
            "spikes": {"count": 2, "median_gap": 47},
            "samples_ms": {ph: [p50] for ph in PHASES},
        }

    return {
        "meta": {"date": "2026-11-29T10:00:00+00:00", "cpu_count": 2},
        "inprocess": {
            "configs": {"sqlite-limits": config(0.8, 4.5), "redis-limits": config(1.5, 3.0)},
            "hf_tokenizer": {"skipped": "SmolLM2 is not prepared"},
        },
        "http": {
            "summary": {"a: anon": _summary(10.0, 15.0), "b: limits": _summary(10.5, 16.0)},
            "deltas": {"b: limits": {"p50_ms": 0.5, "p99_ms": 1.0, "mean_ms": 0.5}},
        },
        "rate": {
            **{"limit_rpm": 600, "rate": 20.0, "seconds": 70, "drain_sent": 672},
            **{"sent": 1400, "statuses": {"200": 700, "429": 700}, "lateness_p99_ms": 1.5},
            **{"admitted_per_s": [10] * 70, "sent_per_s": [20] * 70},
            "window": rate_window([10] * 70, 60, 600),
        },
        "budget": {
            "outcomes": {"ok": 235, "insufficient_quota": 16},
            "accuracy": budget_accuracy([_rec(21, 64, "r1")] * 2, 200, 16, 64),
        },
    }


def test_targets_pass_and_miss() -> None:
    rows = {r["target"]: r for r in evaluate_targets(_doc())}
    assert rows["in-process sqlite-limits p50"]["pass"] is True  # 0.8 <= 1
    assert rows["in-process sqlite-limits p99"]["pass"] is False  # 4.5 > 3
    assert rows["in-process redis-limits p50"]["pass"] is True  # 1.5 <= 2
    assert rows["rpm=600 admitted, 2 replicas"]["value"] == 0.0
    assert rows["budget overshoot (tokens)"]["value"] == -30  # 170 billed of 200
    assert rows["unused budget (tokens)"]["pass"] is True  # 30 < 37


def test_targets_without_results_are_unknown_not_passed() -> None:
    rows = evaluate_targets({"meta": {}})
    assert [r["pass"] for r in rows] == [None, None, None]


def test_render_markdown_has_every_section() -> None:
    doc = _doc()
    doc["targets"] = evaluate_targets(doc)
    md = render_markdown(doc, "layer1-x.png")
    assert md.startswith("# Layer-1 overhead and shared-limit accuracy (2026-11-29)")
    assert "| in-process sqlite-limits p99 | 4.500 | <= 3.0 ms | **miss** |" in md
    assert "| sqlite-limits | total | 0.800 | 0.800 | 4.500 | 4.500 | 0.800 |" in md
    assert "sqlite-limits 2 (every ~47th)" in md
    assert "SmolLM2 HF tokenizer: skipped (SmolLM2 is not prepared)." in md
    assert "| b: limits | 10.500 | 16.000 | 10.500 | 0.500 | 1.000 |" in md
    assert "| a: anon | 10.000 | 15.000 | 10.000 | – | – |" in md
    assert "Admitted over the last 60 s: **600**" in md
    assert "| 200 | 170 | -30 | 30 | 37 | 2 |" in md
    assert "![layer 1](layer1-x.png)" in md
    assert md.rstrip().endswith("```")
