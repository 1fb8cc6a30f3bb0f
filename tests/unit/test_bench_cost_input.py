"""A report's runs, as the cost model reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.cost_input import measured, pick, runs

REPORT = Path(__file__).parents[2] / "docs" / "benchmarks" / "profiles-kv-2026-12-06-b.json"


def rec(i: int, end: float | None, prompt: int = 100, out: int = 10, **kw: Any) -> dict[str, Any]:
    return {"index": i, "kind": "fixed", "endpoint": "chat", "intended": float(i), "sent": float(i),
            "chunks": [] if end is None else [end - 1.0, end], "end": end,
            "status": 200 if end is not None else None, "opened": end is not None,
            "error_kind": None if end is not None else "connect", "error": None,
            "input_tokens": prompt, "max_tokens": out, "prompt_tokens": prompt,
            "output_tokens": out if end is not None else None, **kw}  # fmt: skip


def test_figures_of_a_run() -> None:
    data = {"records": [rec(0, 2.0), rec(1, 4.0, cached_tokens=50), rec(2, None),
                        rec(3, 1.0, warmup=True)]}  # fmt: skip
    m = measured(data)
    assert m.run == "records" and m.requests == 3
    assert m.success_rate == pytest.approx(2 / 3)
    # first intended send (0) to last completion (intended 1 + 4 s: times are relative)
    assert m.duration_s == pytest.approx(5.0)
    assert m.input_tokens_per_s == pytest.approx(200 / 5)  # completed requests' prompts
    assert m.output_tokens_per_s == pytest.approx(20 / 5)
    assert m.output_tokens_per_request == 10 and m.retry_overhead is None


def test_each_workload_class_has_its_own_figures() -> None:
    data = {"records": [rec(0, 2.0, kind="chat", prompt=100, out=10),
                        rec(1, 3.0, kind="rag", prompt=900, out=40),
                        rec(2, None, kind="rag", prompt=900, out=40),
                        rec(3, 4.0, kind="chat", prompt=60, out=30)]}  # fmt: skip
    m = measured(data)
    chat, rag = m.classes
    assert (chat.name, chat.requests, chat.success_rate) == ("chat", 2, 1.0)
    assert (chat.input_tokens_per_request, chat.output_tokens_per_request) == (80, 20)
    assert (rag.name, rag.requests, rag.success_rate) == ("rag", 2, 0.5)
    assert (rag.input_tokens_per_request, rag.output_tokens_per_request) == (900, 40)


def test_runs_are_named_by_path_and_picked_by_suffix() -> None:
    data = {"arms": {"a": {"loads": {"c1": {"records": [rec(0, 1.0)]},
                                     "c8": {"records": [rec(0, 2.0)]}}}}}  # fmt: skip
    assert [n for n, _ in runs(data)] == ["arms.a.loads.c1", "arms.a.loads.c8"]
    assert pick(data, "c8")[0] == "arms.a.loads.c8"
    with pytest.raises(ValueError, match="2 runs: pick one with --run"):
        pick(data, None)
    with pytest.raises(ValueError, match="no run named 'c32'"):
        pick(data, "c32")
    with pytest.raises(ValueError, match="no request records"):
        pick({"arms": {}}, None)


def test_a_shipped_report_of_record() -> None:
    data = json.loads(REPORT.read_text())
    m = measured(data, "default.loads.c32-run1")
    assert m.success_rate == 1.0 and m.requests == 32
    assert m.output_tokens_per_request == 32  # 64 in / 32 out, ignore_eos
    assert m.output_tokens_per_s > 0 and m.input_tokens_per_s > m.output_tokens_per_s
