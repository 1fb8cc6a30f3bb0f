"""Anthropic Messages shapes (app.api.anthropic_format): stop reasons, usage with cached
tokens apart, content blocks, and the stream's block events."""

from __future__ import annotations

import json

import pytest

from app.api import anthropic_format as fmt
from app.engine.protocol import ToolCallDelta


@pytest.mark.parametrize(
    ("finish", "sequence", "reason"),
    [("stop", None, "end_turn"), ("stop", "END", "stop_sequence"), ("length", None, "max_tokens"),
     ("tool_calls", None, "tool_use"), (None, None, "end_turn")],
)  # fmt: skip
def test_stop_reasons(finish: str | None, sequence: str | None, reason: str) -> None:
    assert fmt.stop_reason(finish, sequence) == reason


def test_usage_counts_cache_reads_apart_from_input() -> None:
    assert fmt.usage(100, 7, 64) == {"input_tokens": 36, "output_tokens": 7,
                                     "cache_creation_input_tokens": 0,
                                     "cache_read_input_tokens": 64}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
     (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
     (503, "overloaded_error"), (504, "api_error")],
)  # fmt: skip
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    assert fmt.error_body(status, "no") == {"type": "error",
                                            "error": {"type": kind, "message": "no"}}  # fmt: skip


def test_a_whole_answer_is_its_text_then_its_calls() -> None:
    pieces = [ToolCallDelta(0, "call_a", "weather", '{"ci'), ToolCallDelta(0, arguments='ty": 1}'),
              ToolCallDelta(1, "call_b", "clock", "{}")]  # fmt: skip
    assert fmt.content("", pieces) == [
        {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": 1}},
        {"type": "tool_use", "id": "call_b", "name": "clock", "input": {}},
    ]
    assert fmt.content("hi", []) == [{"type": "text", "text": "hi"}]


def _events(lines: list[str]) -> list[dict[str, object]]:
    out = []
    for e in lines:
        name, data = e.split("\n")[:2]
        body = json.loads(data[len("data: ") :])
        assert name == f"event: {body['type']}"
        out.append(body)
    return out


def test_blocks_open_and_close_in_order_with_tool_arguments_as_json_deltas() -> None:
    s = fmt.BlockStream()
    lines = [*s.text("Let me "), *s.text("check."),
             *s.call(ToolCallDelta(0, "call_a", "weather")),
             *s.call(ToolCallDelta(0, arguments='{"city"')),
             *s.call(ToolCallDelta(0, arguments=": 1}")), *s.close()]  # fmt: skip
    got = [(e["type"], e.get("index")) for e in _events(lines)]
    assert got == [("content_block_start", 0), ("content_block_delta", 0),
                   ("content_block_delta", 0), ("content_block_stop", 0),
                   ("content_block_start", 1), ("content_block_delta", 1),
                   ("content_block_delta", 1), ("content_block_stop", 1)]  # fmt: skip
    events = _events(lines)
    assert events[4]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "weather",
                                          "input": {}}  # fmt: skip
    assert "".join(e["delta"]["partial_json"] for e in events[5:7]) == '{"city": 1}'  # type: ignore[index]
    assert s.close() == []  # closed once
