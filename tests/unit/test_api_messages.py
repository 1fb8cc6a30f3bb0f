"""Messages, content parts, tool definitions and the tool-choice constraint
(app/api/messages.py), on their own."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from app.api.messages import ChatMessage, FunctionDef, tool_constraint
from app.request import ToolChoice


@pytest.mark.parametrize(
    ("arguments", "rendered"),
    [('{"city": "Oslo"}', {"city": "Oslo"}), ("not json", "not json")],
)
def test_tool_calls_reach_the_template_as_objects_when_they_parse(
    arguments: str, rendered: Any
) -> None:
    message = ChatMessage.model_validate({
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "weather", "arguments": arguments}}],
    })  # fmt: skip
    out = message.for_template()
    assert out["content"] == "" and out["tool_calls"][0]["function"]["arguments"] == rendered


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}},
        {"type": "file", "file": {"file_id": "f"}},
    ],
)
def test_media_parts_are_refused_as_unsupported(part: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        ChatMessage.model_validate({"role": "user", "content": [part]})
    assert any(e["type"] == "unsupported_parameter" for e in info.value.errors())


def test_refusal_parts_are_rendered_as_text() -> None:
    message = ChatMessage.model_validate({"role": "assistant", "content": [
        {"type": "text", "text": "I "}, {"type": "refusal", "refusal": "cannot."}]})  # fmt: skip
    assert message.text() == "I cannot."


F = FunctionDef(name="f", parameters={"type": "object", "properties": {"x": {"type": "integer"}},
                                      "required": ["x"]})  # fmt: skip
G = FunctionDef(name="g")


@pytest.mark.parametrize(
    ("mode", "parallel", "good", "bad"),
    [
        (ToolChoice("named", "f"), True, {"x": 1}, {"x": "one"}),
        (ToolChoice("named", "g"), True, {}, []),
        (ToolChoice("required"), True,
         [{"name": "g", "parameters": {}}, {"name": "f", "parameters": {"x": 2}}],
         [{"name": "f", "parameters": {}}]),
        (ToolChoice("required"), True, [{"name": "g", "parameters": {}}],
         [{"name": "g", "parameters": {}, "response": {}}]),  # nothing beside the call
        (ToolChoice("required"), False, [{"name": "g", "parameters": {}}],
         [{"name": "g", "parameters": {}}, {"name": "g", "parameters": {}}]),
    ],
)  # fmt: skip
def test_the_constraint_admits_exactly_valid_calls(
    mode: ToolChoice, parallel: bool, good: Any, bad: Any
) -> None:
    constraint = tool_constraint(mode, [F, G], parallel)
    schema = json.loads(constraint.schema or "")
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
