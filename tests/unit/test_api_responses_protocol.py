"""Responses bodies into chat requests (app/api/responses_protocol.py): items as chat
messages, the settings chat honours, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.api.responses_protocol import ResponsesRequest

CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}
ROWS: list[tuple[str, Any, list[dict[str, Any]]]] = [
    # name, input, the chat messages it becomes
    ("a string", "hi", [{"role": "user", "content": "hi"}]),
    ("developer is system", [{"role": "developer", "content": "terse"}],
     [{"role": "system", "content": "terse"}]),
    ("text parts join", [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}],
     [{"role": "user", "content": "ab"}]),
    ("a call joins the answer before it", [
        {"role": "assistant", "content": [{"type": "output_text", "text": "let me see",
                                           "annotations": []}]}, CALL],
     [{"role": "assistant", "content": "let me see", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
    ("two calls, one message", [CALL, {**CALL, "call_id": "c2"}],
     [{"role": "assistant", "content": "", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
         {"id": "c2", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
    ("an output is a tool message", [CALL, {"type": "function_call_output", "call_id": "c1",
                                            "output": [{"type": "input_text", "text": "42"}]}],
     [{"role": "assistant", "content": "", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "content": "42", "tool_call_id": "c1"}]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "given", "messages"), ROWS, ids=[r[0] for r in ROWS])
def test_input_items_become_chat_messages(
    name: str, given: Any, messages: list[dict[str, Any]]
) -> None:
    chat = ResponsesRequest.model_validate({"model": "m", "input": given}).to_chat([])
    assert [m.for_template() for m in chat.messages] == messages


def test_instructions_come_first_then_the_history_then_the_input() -> None:
    body = ResponsesRequest.model_validate({"model": "m", "input": "now", "instructions": "sys"})
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    chat = body.to_chat(history)
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "sys"), ("user", "before"), ("assistant", "ok"), ("user", "now")]  # fmt: skip


def test_the_settings_reach_chat() -> None:
    body = ResponsesRequest.model_validate({
        "model": "m", "input": "x", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "parallel_tool_calls": False, "service_tier": "flex", "user": "u",
        "tools": [{"type": "function", "name": "f", "description": "d", "strict": True}],
        "text": {"format": {"type": "json_schema", "name": "out", "strict": True,
                            "schema": {"type": "object"}}, "verbosity": "low"},
    })  # fmt: skip
    chat = body.to_chat([])
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (7, 0.5, 0.9)
    assert (chat.parallel_tool_calls, chat.service_tier, chat.user) == (False, "flex", "u")
    assert chat.tools is not None and chat.tools[0].function.description == "d"
    named = {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}],
             "tool_choice": {"type": "function", "name": "f"}}  # fmt: skip
    choice = ResponsesRequest.model_validate(named).to_chat([]).tool_choice
    assert choice is not None and not isinstance(choice, str) and choice.function.name == "f"
    # a forced call has no text to shape: the tool constraint wins over the format
    shaped = {**named, "text": {"format": {"type": "json_object"}}}
    out = ResponsesRequest.model_validate(shaped).to_chat([]).sampling().structured
    assert out is not None and (out.kind, out.name) == ("json_schema", "f")
    fmt = chat.response_format
    assert fmt is not None and fmt.json_schema is not None
    assert (fmt.type, fmt.json_schema.name, fmt.json_schema.schema_) == (
        "json_schema", "out", {"type": "object"})  # fmt: skip


REFUSED: list[dict[str, Any]] = [
    {"conversation": "conv_1"}, {"prompt": {"id": "p"}}, {"top_logprobs": 2},
    {"max_tool_calls": 3}, {"context_management": [{"type": "compaction"}]},
    {"tool_choice": "required"},
]  # fmt: skip


@pytest.mark.parametrize("extra", REFUSED)
def test_what_cannot_be_honoured_is_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", "input": "x", **extra})


def test_empty_refusable_values_are_accepted() -> None:
    body = ResponsesRequest.model_validate({
        "model": "m", "input": "x", "background": False, "include": [], "truncation": "disabled",
        "reasoning": {"effort": None}, "stream_options": {"include_obfuscation": False},
        "prompt_cache_key": "k", "safety_identifier": "s", "prompt_cache_retention": "24h",
    })  # fmt: skip
    assert body.store is True
