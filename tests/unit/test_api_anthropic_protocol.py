"""Anthropic Messages bodies into the chat request the pipeline serves
(app.api.anthropic_protocol): turns, tool blocks, tools, tool choice, sampling."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from app.api.anthropic_protocol import CountTokensRequest, MessagesRequest

USER = {"role": "user", "content": "Weather in Paris?"}
BRIEF = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": USER["content"]}]
TOOL = {"name": "weather", "description": "Forecast",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
CALL = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}


def _chat(**body: Any) -> dict[str, Any]:
    out = MessagesRequest.model_validate({"model": "m", "max_tokens": 16, **body}).to_chat()
    return out.model_dump(exclude_none=True)


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        ({"messages": [USER]}, [{"role": "user", "content": "Weather in Paris?"}]),
        ({"system": "Be brief.", "messages": [USER]},
         BRIEF),
        ({"system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
          "messages": [USER]},
         BRIEF),
        # an assistant's tool call, then the user's result and a follow-up
        ({"messages": [USER,
                       {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                         CALL]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                           {"type": "text", "text": "And "}, {"type": "text", "text": "Rome?"}]}]},
         [{"role": "user", "content": USER["content"]},
          {"role": "assistant", "content": "Checking.",
           "tool_calls": [{"id": "toolu_1", "type": "function",
                           "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
          {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
          {"role": "user", "content": "And Rome?"}]),
        # a failed tool says so; a result of text blocks is their text
        ({"messages": [USER, {"role": "assistant", "content": [CALL]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                            "content": [{"type": "text", "text": "timeout"}]}]}]},
         [{"role": "user", "content": USER["content"]},
          {"role": "assistant",
           "tool_calls": [{"id": "toolu_1", "type": "function",
                           "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
          {"role": "tool", "content": "Error: timeout", "tool_call_id": "toolu_1"}]),
    ],
)  # fmt: skip
def test_turns_become_chat_messages(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assert _chat(**body)["messages"] == messages


@pytest.mark.parametrize(
    ("choice", "chat_choice", "parallel"),
    [
        (None, None, None),
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "weather"},
         {"type": "function", "function": {"name": "weather"}}, None),
        ({"type": "none"}, "none", None),
    ],
)  # fmt: skip
def test_tools_and_tool_choice_become_chats(
    choice: dict[str, Any] | None, chat_choice: Any, parallel: bool | None
) -> None:
    body: dict[str, Any] = {"messages": [USER], "tools": [TOOL]}
    if choice is not None:
        body["tool_choice"] = choice
    chat = _chat(**body)
    function = {"name": "weather", "description": "Forecast", "parameters": TOOL["input_schema"]}
    assert chat["tools"] == [{"type": "function", "function": function}]
    assert chat.get("tool_choice") == chat_choice
    assert chat.get("parallel_tool_calls") == parallel


def test_sampling_and_the_user_carry_over() -> None:
    chat = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 16, "messages": [USER], "temperature": 0.2, "top_p": 0.9,
        "top_k": 5, "metadata": {"user_id": "u-1"}, "stream": True,
        "stop_sequences": ["a", "b", "c", "d", "e"],
    }).to_chat()  # fmt: skip
    s = chat.sampling()
    assert (s.temperature, s.top_p, s.top_k) == (0.2, 0.9, 5)
    assert (chat.max_tokens, chat.stream, chat.user) == (16, True, "u-1")
    assert s.stop == ()  # stop_sequences travel beside the chat body (more than four)


def test_a_token_count_needs_no_max_tokens_and_cache_control_is_accepted() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}  # fmt: skip
    chat = CountTokensRequest.model_validate(body).to_chat()
    assert chat.prompt().messages == ({"role": "user", "content": "hi"},)


def test_output_config_format_is_chats_json_schema_and_effort_is_refused() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 16, "messages": [USER],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "cache_control": {"type": "ephemeral"}, "speed": "fast", "inference_geo": "eu",
        "service_tier": "auto", "diagnostics": {"previous_message_id": "msg_1"},
    }).to_chat()  # fmt: skip
    structured = chat.sampling().structured
    assert structured is not None and structured.kind == "json_schema"
    assert json.loads(structured.schema or "") == schema
    with pytest.raises(ValidationError, match="not reasoning models"):
        MessagesRequest.model_validate({"model": "m", "max_tokens": 16, "messages": [USER],
                                        "output_config": {"effort": "high"}})  # fmt: skip
