from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from app.api.errors import from_validation_error
from app.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    EmbeddingRequest,
    ToolDef,
)
from app.engine.protocol import SamplingOptions, StructuredOutput
from app.request import Prompt, ToolChoice

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 7}, 7),
        ({"max_tokens": 5, "max_completion_tokens": 7}, 7),
        ({}, None),
    ],
)
def test_chat_max_tokens(fields: dict[str, Any], expected: int | None) -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **fields})
    assert req.requested_max_tokens() == expected


def test_completion_default_max_tokens_is_sixteen() -> None:
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "x"}).requested_max_tokens() == 16
    )


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("abc", Prompt(text="abc")),
        ([1, 2, 3], Prompt(token_ids=(1, 2, 3))),
        (["only"], Prompt(text="only")),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: Prompt) -> None:
    parsed = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert parsed.prompt_of() == expected


@pytest.mark.parametrize("prompt", ["", [], [""], ["a", ""]])
def test_an_empty_prompt_is_refused_naming_the_prompt(prompt: Any) -> None:
    """The engine refuses an empty prompt ("The decoder prompt cannot be empty"): `[""]`
    reached clients as a 500 before (benchmarks.fuzz_openapi found it)."""
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    (error,) = info.value.errors()
    assert error["loc"] == ("prompt",) and "empty prompt" in error["msg"]


def test_several_prompts_are_refused() -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})


@pytest.mark.parametrize(
    ("stop", "expected"), [(None, ()), ("x", ("x",)), (["a", "b"], ("a", "b"))]
)
def test_stop_list(stop: Any, expected: tuple[str, ...]) -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, "stop": stop})
    assert req.stop_list() == expected


@pytest.mark.parametrize(
    "bad",
    [
        {"n": 0},
        {"n": 129},
        {"temperature": -0.1},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stream_options": {"include_usage": True}},  # only with stream=true
        {"logit_bias_typo": {}},
    ],
)
def test_invalid_chat_fields(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **bad})


def test_content_parts_are_joined() -> None:
    msg = ChatMessage.model_validate(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert msg.text() == "ab"
    assert ChatMessage(role="assistant", content=None).text() == ""


def test_embedding_inputs() -> None:
    assert EmbeddingRequest.model_validate({"model": "m", "input": "x"}).inputs() == ["x"]
    assert EmbeddingRequest.model_validate({"model": "m", "input": ["x", "y"]}).inputs() == [
        "x",
        "y",
    ]
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"model": "m", "input": "x", "encoding_format": "int8"})


# ---- the OpenAI parameter set: honoured, accepted without effect, refused ----------------


def _chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"presence_penalty": 0}, {}),  # the neutral value is accepted, not refused
        ({"presence_penalty": 1.5, "frequency_penalty": -0.5},
         {"presence_penalty": 1.5, "frequency_penalty": -0.5}),
        ({"repetition_penalty": 1.3, "top_k": 5, "min_p": 0.1, "min_tokens": 3},
         {"repetition_penalty": 1.3, "top_k": 5, "min_p": 0.1, "min_tokens": 3}),
        ({"top_k": -1}, {"top_k": 0}),  # vLLM's "every token", both spellings
        ({"stop_token_ids": [7, 2]}, {"stop_token_ids": (7, 2)}),
        ({"logit_bias": {"50": 100, "3": -100.0}},
         {"logit_bias": ((3, -100.0), (50, 100.0))}),
        ({"seed": 5, "temperature": 0}, {"seed": 5, "temperature": 0.0}),
        ({"logprobs": True}, {"logprobs": 0}),
        ({"logprobs": True, "top_logprobs": 4}, {"logprobs": 4}),
        ({"logprobs": False}, {"logprobs": None}),
        ({"response_format": {"type": "text"}}, {"structured": None}),
        ({"response_format": {"type": "json_object"}},
         {"structured": StructuredOutput("json_object")}),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "p", "strict": True, "schema": {"type": "object"}}}},
         {"structured": StructuredOutput("json_schema", '{"type": "object"}', "p")}),
        # accepted, no effect on the output
        ({"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
          "safety_identifier": "s", "prompt_cache_key": "c", "parallel_tool_calls": True,
          "tool_choice": "none", "modalities": ["text"], "n": 3,
          "stream": True, "stream_options": {"include_usage": True,
                                             "include_obfuscation": False}}, {}),
    ],
)  # fmt: skip
def test_chat_parameters_reach_the_sampling_options(
    fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert _chat(**fields).sampling() == replace(SamplingOptions(), **expected)


def test_legacy_completion_logprobs_is_the_top_count() -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 3})
    assert req.sampling().logprobs == 3
    plain = CompletionRequest.model_validate({"model": "m", "prompt": "x", "best_of": 1})
    assert plain.sampling().logprobs is None


REFUSED = [
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"function_call": "auto"}, "function_call"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"web_search_options": {}}, "web_search_options"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat", {"verbosity": "low"}, "verbosity"),
    ("chat", {"store": True}, "store"),
    ("chat", {"service_tier": "priority"}, "service_tier"),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "messages[0].content[0].image_url"),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]},
     "messages[0].content[0].input_audio"),
    ("chat", {"messages": [{"role": "assistant", "content": None,
                            "function_call": {"name": "f", "arguments": "{}"}}]},
     "messages[0].function_call"),
    ("completion", {"echo": True}, "echo"),
    ("completion", {"best_of": 3}, "best_of"),
    ("completion", {"suffix": "end"}, "suffix"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "fields", "param"), REFUSED)
def test_documented_parameters_that_cannot_be_honoured_are_400_naming_them(
    kind: str, fields: dict[str, Any], param: str
) -> None:
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    base = {"model": "m", "messages": MSG} if kind == "chat" else {"model": "m", "prompt": "x"}
    with pytest.raises(ValidationError) as info:
        schema.model_validate({**base, **fields})
    err = from_validation_error(info.value)
    assert (err.status, err.param, err.code) == (400, param, "unsupported_parameter")
    assert err.message.startswith(f"`{param}`: ") and len(err.message) > len(param) + 20


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad name"}}},
         "response_format.json_schema.name"),
        ({"some_undocumented_field": 1}, "some_undocumented_field"),
    ],
)
def test_bad_values_are_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as info:
        _chat(**fields)
    err = from_validation_error(info.value)
    assert (err.status, err.param) == (400, param)


# ---- tools ---------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "time"}}


@pytest.mark.parametrize(
    ("fields", "mode"),
    [
        ({}, None),
        ({"tools": [WEATHER]}, ToolChoice("auto")),  # OpenAI's default with tools
        ({"tools": [WEATHER], "tool_choice": "none"}, None),
        ({"tools": [WEATHER], "tool_choice": "auto"}, ToolChoice("auto")),
        ({"tools": [WEATHER], "tool_choice": "required"}, ToolChoice("required")),
        ({"tools": [WEATHER, TIME],
          "tool_choice": {"type": "function", "function": {"name": "time"}}},
         ToolChoice("named", "time")),
    ],
)  # fmt: skip
def test_tool_choice_modes(fields: dict[str, Any], mode: ToolChoice | None) -> None:
    req = _chat(**fields)
    assert req.tool_mode() == mode
    tools = req.prompt().tools
    assert tools == (None if mode is None else tuple(
        ToolDef.model_validate(t).model_dump(exclude_none=True) for t in fields["tools"]))


def test_a_named_tool_choice_constrains_the_output_to_its_parameters() -> None:
    req = _chat(tools=[WEATHER, TIME],
                tool_choice={"type": "function", "function": {"name": "weather"}})  # fmt: skip
    structured = req.sampling().structured
    assert structured is not None and structured.name == "weather"
    assert json.loads(structured.schema or "") == WEATHER["function"]["parameters"]


def test_required_tool_choice_constrains_to_an_array_of_calls() -> None:
    structured = _chat(tools=[WEATHER, TIME], tool_choice="required").sampling().structured
    assert structured is not None
    schema = json.loads(structured.schema or "")
    jsonschema.validate([{"name": "time", "parameters": {}}], schema)
    jsonschema.validate([{"name": "weather", "parameters": {"city": "Oslo"}},
                         {"name": "time", "parameters": {}}], schema)  # fmt: skip
    for bad in ([], [{"name": "other", "parameters": {}}], [{"name": "weather", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = _chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    single = json.loads(one.sampling().structured.schema or "")  # type: ignore[union-attr]
    jsonschema.validate([{"name": "time", "parameters": {}}], single)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "time", "parameters": {}}] * 2, single)


def test_tool_history_reaches_the_template_with_object_arguments() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "4C"}]},
    ]  # fmt: skip
    prompt = _chat(messages=messages, tools=[WEATHER]).prompt()
    assert prompt.messages is not None
    assert prompt.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert prompt.messages[2] == {"role": "tool", "content": "4C", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools[0].function.name"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(ValidationError) as info:
        _chat(**fields)
    err = from_validation_error(info.value)
    assert (err.status, err.param) == (400, param)


def test_a_forced_call_wins_over_the_response_format() -> None:
    """As OpenAI's: the format shapes text, and a forced call writes none."""
    fields = {"tools": [WEATHER], "response_format": {"type": "json_object"}}
    forced = _chat(**fields, tool_choice="required").sampling().structured
    assert forced is not None and forced.kind == "json_schema"
    assert "weather" in (forced.schema or "")
    auto = _chat(**fields, tool_choice="auto").sampling().structured
    assert auto is not None and auto.kind == "json_object"
