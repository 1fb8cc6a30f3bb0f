"""Workload specs: validation of spec dicts and the spec -> workload factory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.bench.agentic import AgenticWorkload
from app.bench.prompts import PromptFactory, SimulatedCounter
from app.bench.records import RequestSpec
from app.bench.specs import AgenticSpec, build_workload, parse_workload_spec
from app.bench.trace import TraceError, TraceWorkload
from app.bench.workloads import FixedWorkload, MixWorkload, SharedPrefixWorkload

FACTORY = PromptFactory(SimulatedCounter(), seed=0)
TRACE = [  # line 2 is blank; line 4 is a messages line without an endpoint
    {"input_tokens": 30, "output_tokens": 7},
    "",
    {"prompt": "Hello there, model.", "output_tokens": 3},
    {"messages": [{"role": "user", "content": "Hi you"}], "output_tokens": 4},
]


def _trace(tmp_path: Path, lines: list[Any]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        ({"kind": "fixed", "input_tokens": 20, "output_tokens": 4}, FixedWorkload),
        ({"kind": "mix", "weights": {"short": 1}}, MixWorkload),
        ({"kind": "shared_prefix", "tenants": 2, "prefix_tokens": 30}, SharedPrefixWorkload),
        ({"kind": "agentic", "embed_model": "e"}, AgenticWorkload),
    ],
)
def test_build_workload_from_spec(data: dict[str, Any], cls: type) -> None:
    w = build_workload(parse_workload_spec(data), "m", FACTORY, max_model_len=4096, seed=3)
    assert isinstance(w, cls) and w.name == data["kind"]
    assert isinstance(w.request(0), RequestSpec) and w.describe()["workload"] == data["kind"]


def test_build_trace_and_agentic_defaults(tmp_path: Path) -> None:
    path = _trace(tmp_path, TRACE)
    spec = parse_workload_spec({"kind": "trace", "path": str(path)})
    w = build_workload(spec, "m", FACTORY, 4096, 0)
    assert isinstance(w, TraceWorkload) and w.request(0).endpoint == "chat"
    spec = parse_workload_spec({"kind": "trace", "path": str(path), "endpoint": "completions"})
    with pytest.raises(TraceError, match="line 4: messages need the chat endpoint"):
        build_workload(spec, "m", FACTORY, 4096, 0)  # the messages line has no endpoint
    agent = build_workload(AgenticSpec(), "m", FACTORY, 4096, 0, embed_model="emb")
    assert isinstance(agent, AgenticWorkload) and agent.embed_model == "emb"
    assert build_workload(AgenticSpec(), "m", FACTORY, 4096, 0).embed_model == "m"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"kind": "fixed", "input_tokens": 20, "bogus": 1}, "Extra inputs"),
        ({"kind": "nope"}, "does not match any of the expected tags"),
        ({"input_tokens": 20}, "Unable to extract tag"),
        ({"kind": "shared_prefix", "distribution": "pareto"}, "distribution"),
    ],
)
def test_spec_validation(data: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        parse_workload_spec(data)


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "fixed", "input_tokens": 4000, "output_tokens": 200},
        {"kind": "shared_prefix", "prefix_tokens": 4000, "suffix_tokens": 64},
        {"kind": "agentic", "min_steps": 3, "max_steps": 2},
    ],
)
def test_build_rejects_shapes_that_cannot_run(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"max_model_len|min_steps"):
        build_workload(parse_workload_spec(data), "m", FACTORY, 4096, 0)
