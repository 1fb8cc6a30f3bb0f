"""Responses shapes (app/api/responses_format.py): output items from a whole answer, and
the item events of a streamed one in order, with one sequence number per event."""

from __future__ import annotations

import json
from typing import Any

from app.api.responses_format import ItemStream, output_items, usage
from app.engine.protocol import ToolCallDelta


def _events(chunks: list[str]) -> list[dict[str, Any]]:
    return [json.loads(c.split("data: ", 1)[1]) for c in chunks]


def test_a_whole_answer_is_its_message_then_its_calls() -> None:
    pieces = [ToolCallDelta(0, "call_a", "f", '{"x"'), ToolCallDelta(0, None, None, ": 1}"),
              ToolCallDelta(1, "call_b", "g", "{}")]  # fmt: skip
    items = output_items("r", "", pieces)
    assert [(i["type"], i.get("call_id"), i.get("arguments")) for i in items] == [
        ("function_call", "call_a", '{"x": 1}'), ("function_call", "call_b", "{}")]  # fmt: skip
    (message,) = output_items("r", "hello", [])
    assert message["content"][0]["text"] == "hello"
    (empty,) = output_items("r", "", [])  # no text and no call: an empty message
    assert empty["type"] == "message" and empty["content"][0]["text"] == ""


def test_usage_counts_cached_tokens_within_the_input() -> None:
    assert usage(10, 3, 4) == {
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 13}  # fmt: skip


def test_text_then_a_call_stream_as_two_items_in_order() -> None:
    s = ItemStream("r")
    chunks = [*s.text("Hi"), *s.text(" there"), *s.call(ToolCallDelta(0, "call_a", "f", "{")),
              *s.call(ToolCallDelta(0, None, None, "}")), *s.finish()]  # fmt: skip
    events = _events(chunks)
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(12))
    assert [e.get("output_index") for e in events if "output_index" in e] == [0] * 7 + [1] * 5
    assert events[4]["text"] == "Hi there" and events[10]["arguments"] == "{}"
    assert [i["type"] for i in s.items] == ["message", "function_call"]
    assert s.items[1] == {"id": "fc_r_0", "type": "function_call", "status": "completed",
                          "call_id": "call_a", "name": "f", "arguments": "{}"}  # fmt: skip


def test_an_answer_with_nothing_streams_one_empty_message() -> None:
    s = ItemStream("r")
    types = [e["type"] for e in _events(s.finish())]
    assert types == ["response.output_item.added", "response.content_part.added",
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done"]  # fmt: skip
    assert s.items[0]["content"][0]["text"] == ""
