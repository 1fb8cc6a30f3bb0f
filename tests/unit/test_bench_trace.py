"""Trace replay: JSONL lines to requests, the trace's own schedule, and errors that name
the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.bench.prompts import PromptFactory, SimulatedCounter
from app.bench.trace import TraceError, TraceWorkload

COUNT = SimulatedCounter().count
FACTORY = PromptFactory(SimulatedCounter(), seed=0)


def _trace(tmp_path: Path, lines: list[Any]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


TRACE = [
    {"timestamp": 0.0, "input_tokens": 30, "output_tokens": 7},
    "",
    {"timestamp": 0.5, "prompt": "Hello there, model.", "output_tokens": 3, "tenant": "acme"},
    {
        "timestamp": 2.0,
        "messages": [{"role": "user", "content": "Hi you"}],
        "output_tokens": 4,
        "kind": "support",
    },
    {"timestamp": 2.0, "prompt": "Go on", "output_tokens": 2, "endpoint": "completions"},
]


def test_trace_replay(tmp_path: Path) -> None:
    w = TraceWorkload.from_jsonl(_trace(tmp_path, TRACE), "m", FACTORY, seed=1)
    assert len(w) == 4
    assert w.offsets() == [0.0, 0.5, 2.0, 2.0] and w.offsets(0.5) == [0.0, 0.25, 1.0, 1.0]
    s0, s1, s2, s3 = (w.request(i) for i in range(4))
    assert (s0.kind, s0.input_tokens, s0.output_tokens) == ("trace", 30, 7)
    assert COUNT(s0.body["messages"][0]["content"]) == 30
    assert s1.body["messages"] == [{"role": "user", "content": "Hello there, model."}]
    assert (s1.tenant, s1.input_tokens) == ("acme", 5)
    assert (s2.kind, s2.body["messages"], s2.input_tokens) == ("support", TRACE[3]["messages"], 2)  # type: ignore[index]
    assert (s3.endpoint, s3.body["prompt"], s3.body["max_tokens"]) == ("completions", "Go on", 2)
    assert w.request(4).body != s0.body and w.request(4).input_tokens == 30  # wraps, new text
    desc = w.describe()
    assert desc["requests"] == 4 and desc["duration_s"] == 2.0
    assert desc["kinds"] == {"trace": 3, "support": 1}


def test_trace_without_timestamps_has_no_schedule(tmp_path: Path) -> None:
    w = TraceWorkload.from_jsonl(
        _trace(tmp_path, [{"input_tokens": 9, "output_tokens": 1}]), "m", FACTORY
    )
    assert w.offsets() is None


@pytest.mark.parametrize(
    ("bad", "line", "error"),
    [
        ("{not json", 3, "Invalid JSON"),
        ({"input_tokens": 5, "output_tokens": 1, "extra": 1}, 3, "extra: Extra inputs"),
        ({"input_tokens": 5}, 3, "output_tokens: Field required"),
        ({"input_tokens": 5, "prompt": "x", "output_tokens": 1}, 3, "exactly one of"),
        ({"output_tokens": 1}, 3, "exactly one of"),
        ({"input_tokens": 0, "output_tokens": 1}, 3, "input_tokens"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "output_tokens": 1,
                "endpoint": "completions",
            },
            3,
            "messages need the chat endpoint",
        ),
        ({"timestamp": 1.0, "input_tokens": 5, "output_tokens": 1}, 3, "every line or none"),
    ],
)
def test_trace_errors_name_the_line(tmp_path: Path, bad: Any, line: int, error: str) -> None:
    lines = [{"input_tokens": 5, "output_tokens": 1}, "", bad]
    with pytest.raises(TraceError, match=rf"trace\.jsonl line {line}: .*{error}"):
        TraceWorkload.from_jsonl(_trace(tmp_path, lines), "m", FACTORY)


def test_trace_timestamps_must_not_go_back(tmp_path: Path) -> None:
    lines = [{"timestamp": t, "input_tokens": 5, "output_tokens": 1} for t in (0, 3, 2)]
    with pytest.raises(TraceError, match=r"line 3: timestamp 2\.0 goes back"):
        TraceWorkload.from_jsonl(_trace(tmp_path, lines), "m", FACTORY)
    with pytest.raises(TraceError, match="no requests"):
        TraceWorkload.from_jsonl(_trace(tmp_path, [""]), "m", FACTORY)
