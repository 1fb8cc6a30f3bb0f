"""app.bench.compare: A/B ratios against hand-computed values, metadata differences and
result-file validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.compare import ResultError, Row, compare, format_comparison, load_result
from app.bench.metrics import SLO, summarize
from app.bench.records import RequestRecord
from app.bench.report import SCHEMA

SLO_ = SLO(ttft_s=0.2)


def _records(ttft: float, gap: float, end: float, failures: int = 0) -> list[RequestRecord]:
    """Ten requests one second apart, four output tokens each; the last ``failures``
    of them fail with HTTP 429."""
    out = []
    for i in range(10):
        r = RequestRecord(index=i, kind="short", endpoint="chat", intended=float(i), sent=i + 0.0)
        if i >= 10 - failures:
            r.error_kind, r.status, r.end = "http_429", 429, 0.01
        else:
            r.chunks = [ttft + k * gap for k in range(4)]
            r.end, r.output_tokens, r.prompt_tokens = end, 4, 50
        out.append(r)
    return out


def _result(
    records: list[RequestRecord],
    slo: SLO | None = SLO_,
    *,
    model: str = "smollm2",
    commit: str = "abc123",
    rate: float = 1.0,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "metadata": {
            "model_id": model,
            "engine": "vllm",
            "engine_version": "0.29.0",
            "git_commit": commit,
            "gpu": "none",
            "model_revision": "main",
        },
        "config": {
            "mode": "open",
            "arrival": "poisson",
            "seed": 1,
            "endpoint": "chat",
            "workload": {"kind": "fixed", "input_tokens": 64, "rate": rate},
            "slo": None if slo is None else slo.model_dump(),
        },
        "stages": [{"stage": 0, "label": f"rate={rate:g}/s"}],
        "summary": summarize(records, slo, duration_s=10.0),
    }


# A: TTFT 100 ms, chunks 100 ms apart, E2E 450 ms -> TPOT (450 - 100) / 3 ms, ITL 100 ms.
# B: TTFT 250 ms, chunks 50 ms apart, E2E 450 ms -> TPOT (450 - 250) / 3 ms, ITL 50 ms;
#    two of ten fail. Durations are fixed at 10 s.
A = _result(_records(0.10, 0.10, 0.45))
B = _result(_records(0.25, 0.05, 0.45, failures=2))


def _rows(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Row]:
    return {r.name: r for r in compare(a, b)}


def test_ratios_match_hand_computed_values() -> None:
    rows = _rows(A, B)
    assert rows["request_throughput"].a == pytest.approx(1.0)  # 10 completed / 10 s
    assert rows["request_throughput"].b == pytest.approx(0.8)
    assert rows["request_throughput"].ratio == pytest.approx(0.8)
    assert rows["output_throughput"].a == pytest.approx(4.0)  # 40 tokens / 10 s
    assert rows["output_throughput"].ratio == pytest.approx(3.2 / 4.0)
    assert rows["ttft p50"].a == pytest.approx(100.0)
    assert rows["ttft p99"].ratio == pytest.approx(2.5)
    assert rows["itl p95"].ratio == pytest.approx(0.5)
    assert rows["tpot p50"].a == pytest.approx(350.0 / 3)
    assert rows["tpot p50"].ratio == pytest.approx(200.0 / 350.0)
    assert rows["e2e p99"].ratio == pytest.approx(1.0)
    assert rows["error_rate"].b == pytest.approx(0.2)


def test_ratio_is_none_when_a_is_zero_or_a_value_missing() -> None:
    rows = _rows(A, B)
    assert rows["error_rate"].a == 0.0 and rows["error_rate"].ratio is None  # 0.2 / 0
    assert rows["goodput"].a == pytest.approx(1.0)  # every A request has TTFT <= 200 ms
    assert rows["goodput"].b == 0.0 and rows["goodput"].ratio == 0.0  # B's TTFT is 250 ms
    no_slo = _rows(A, _result(_records(0.1, 0.1, 0.45), slo=None))
    assert no_slo["goodput"].b is None and no_slo["goodput"].ratio is None
    empty = _rows(A, _result([]))
    assert empty["ttft p50"].b is None and empty["ttft p50"].ratio is None


def test_covers_every_key_metric() -> None:
    names = [r.name for r in compare(A, B) if r.kind == "metric"]
    expected = ["request_throughput", "output_throughput", "goodput", "error_rate"]
    expected += [f"{m} {q}" for m in ("ttft", "tpot", "itl", "e2e") for q in ("p50", "p95", "p99")]
    assert names == expected


def test_format_shows_a_b_ratio_and_na() -> None:
    text = format_comparison(compare(A, B))
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "unit", "A", "B", "B/A"]
    ttft = next(line for line in lines if line.startswith("ttft p99"))
    assert ttft.split() == ["ttft", "p99", "ms", "100.00", "250.00", "2.500x"]
    err = next(line for line in lines if line.startswith("error_rate"))
    assert err.split() == ["error_rate", "0.00%", "20.00%", "n/a"]
    assert lines[-1] == "metadata: same model, engine, git commit, GPU, workload and SLO"


def test_metadata_differences_are_called_out() -> None:
    other = _result(_records(0.1, 0.1, 0.45), model="qwen", commit="def456+dirty", rate=2.0)
    rows = _rows(A, other)
    assert rows["model"].differs and rows["git_commit"].differs
    assert not rows["engine"].differs and rows["engine"].a == "vllm 0.29.0"
    assert rows["workload"].differs
    assert rows["workload"].note == "differs in stages, workload.rate"
    last = format_comparison(compare(A, other)).splitlines()[-1]
    assert last.startswith("metadata differs, compare with care: ")
    assert "model (smollm2 vs qwen)" in last
    assert "git_commit (abc123 vs def456+dirty)" in last
    assert "workload (differs in stages, workload.rate)" in last
    assert "engine" not in last


def test_slo_difference_is_metadata() -> None:
    looser = _result(_records(0.1, 0.1, 0.45), slo=SLO(ttft_s=1.0))
    assert _rows(A, looser)["slo"].differs


def test_load_result_accepts_a_result_and_rejects_others(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps(A))
    assert load_result(good)["summary"]["completed"] == 10
    assert load_result(str(good))["schema"] == SCHEMA

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "other/2", "summary": {}}))
    with pytest.raises(ResultError, match=r"schema 'other/2', expected 'switchyard.bench/1'"):
        load_result(wrong)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ResultError, match="not a switchyard bench result"):
        load_result(listed)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ResultError, match="not JSON"):
        load_result(broken)
    with pytest.raises(ResultError, match="cannot read"):
        load_result(tmp_path / "missing.json")
    assert issubclass(ResultError, ValueError)
