"""benchmarks.agent_api: the request bodies are ones the gateway accepts and constrain
what they say; the SSE timing parser and the report on a synthetic result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.protocol import ChatCompletionRequest
from benchmarks.agent_api import KINDS, body, pct, schema, stream, write


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_a_request_the_gateway_accepts(kind: str) -> None:
    req = ChatCompletionRequest.model_validate(body(kind, 8, "_x"))
    structured = req.sampling().structured
    if kind == "plain":
        assert structured is None and req.tool_mode() is None
        assert req.sampling().ignore_eos  # the same number of tokens as the others
    else:
        assert structured is not None
        assert "city_x" in json.dumps(structured.schema)
    if kind == "named_tool":
        assert req.tool_mode() is not None and req.tool_mode().name == "record_city"  # type: ignore[union-attr]


def test_a_new_suffix_is_a_new_schema() -> None:
    assert schema("_a") != schema("_b")
    assert schema("_a")["required"] == ["city_a", "population_a"]


def test_pct_is_the_one_percentile_definition() -> None:
    # linear interpolation between the closest ranks (app.stats), not the nearest rank
    assert pct([0.3, 0.1, 0.2], 50) == 0.2
    assert pct([0.3, 0.1, 0.2], 95) == pytest.approx(0.29)
    assert pct([], 50) is None


async def test_stream_times_content_and_tool_call_chunks_and_reads_errors() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},  # not content
        {"choices": [{"index": 0, "delta": {"content": "Par"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]},
        {"error": {"code": "session_cancelled", "message": "m"}},
    ]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=text)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        got = await stream(http, "http://bench/v1/chat/completions", {})
    assert (got["status"], got["error"], got["chunks"]) == (200, "session_cancelled", 2)
    assert got["ttft"] is not None and len(got["itls"]) == 1


def _kind(ttft: float, itl: float) -> dict[str, Any]:
    ratios = {"ttft_p50_ratio": ttft / 0.1, "itl_p50_ratio": itl / 0.08}
    return {"requests": 4, "failed": 0, "ttft_p50_s": ttft, "itl_p50_s": itl,
            "chunks_mean": 9.0, **ratios}  # fmt: skip


def test_the_report_gives_ratios_and_the_cancel_distribution(tmp_path: Path) -> None:
    figures = {"plain": _kind(0.1, 0.08), "json_schema": _kind(0.15, 0.09),
               "named_tool": _kind(0.2, 0.1)}  # fmt: skip
    result = {
        "parameters": {"cancel_streams": 4},
        "structure_cost": {"c1": figures, "c8": figures},
        "grammar_cache": {backend: {"trials": [{"plain_ttft_s": 0.1, "first_ttft_s": 0.3,
                                                "second_ttft_s": 0.12}],
                                    "first_ttft_p50_s": 0.3, "second_ttft_p50_s": 0.12,
                                    "plain_ttft_p50_s": 0.1, "first_over_second_p50": 2.5}
                          for backend in ("guidance", "xgrammar")},
        "session_cancel": {"trials": [{"freed_s": 0.2}, {"freed_s": 0.4}],
                           "freed_p50_s": 0.3, "freed_p95_s": 0.4, "freed_max_s": 0.4,
                           "within_1s": 2, "sessions_on_both_replicas": 2,
                           "cancelled_records": 8},
        "environment": {"date": "2026-12-02"},
    }  # fmt: skip
    write(result, tmp_path)
    (md,) = tmp_path.glob("agent-api-*.md")
    text = md.read_text()
    assert "| 8 | named_tool | 4 (0 failed) | 200 | 2.00 | 100 | 1.25 | 9.0 |" in text
    assert "| xgrammar | 300 | 120 | 100 | 2.50 |" in text
    assert "p50 300 ms, p95 400 ms, max 400 ms; 2 / 2 within 1 s" in text
    assert (tmp_path / md.name.replace(".md", ".png")).stat().st_size > 0
    assert json.loads((tmp_path / md.name.replace(".md", ".json")).read_text()) == result
