"""The pieces of OpenAI request bodies: messages and their content parts, tool
definitions and calls, response formats, and the constraint a required or named tool
choice puts on the output. A documented parameter this server cannot honour is refused
with ``unsupported`` (a 400 naming it and saying why)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from app.engine.protocol import StructuredOutput
from app.request import ToolChoice
from app.schema import Strict

UNSUPPORTED = "unsupported_parameter"  # the error type app.api.errors maps to a 400

# Bounds that keep every number inside what engines and samplers accept (an int64 seed,
# an int32 token id or token count), so an absurd value is a 400, never an engine error.
INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


def unsupported(reason: str) -> PydanticCustomError:
    """A documented OpenAI parameter this server cannot honour: 400 naming it, with
    ``reason`` (never a generic schema error, never silently ignored)."""
    return PydanticCustomError(UNSUPPORTED, reason)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class RefusalPart(Strict):
    """An assistant message's refusal, sent back as history: rendered as its text."""

    type: Literal["refusal"]
    refusal: str


class MediaPart(BaseModel):
    """An image, audio or file part: documented, but the served models read text only."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_audio", "file"]

    @model_validator(mode="after")
    def _text_only(self) -> MediaPart:
        raise unsupported(
            f"`{self.type}` content parts need a multimodal model; the models served here "
            "read text only"
        )


ContentPart = Annotated[TextPart | RefusalPart | MediaPart, Field(discriminator="type")]


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FunctionCall(Strict):
    name: FunctionName
    arguments: str = Field(max_length=1024 * 1024)


class ToolCall(Strict):
    """A call an assistant message made, sent back as history."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall

    def for_template(self) -> dict[str, Any]:
        """Chat templates expect the arguments as an object (vLLM passes them so)."""
        try:
            arguments: Any = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": arguments}}  # fmt: skip


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    refusal: str | None = None  # an assistant message's, sent back as history
    tool_calls: Annotated[list[ToolCall], Field(max_length=128)] | None = None
    tool_call_id: str | None = Field(default=None, max_length=256)
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None

    @field_validator("function_call")
    @classmethod
    def _deprecated_functions(cls, value: Any) -> Any:
        if value is not None:
            raise unsupported(DEPRECATED_FUNCTIONS)
        return value

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: Any) -> Any:
        if value is not None:
            raise unsupported("the models served here have no audio output")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            p.text if isinstance(p, TextPart) else p.refusal
            for p in self.content
            if isinstance(p, TextPart | RefusalPart)  # media parts never validate
        )


DEPRECATED_FUNCTIONS = "functions/function_call are deprecated by OpenAI: use tools"


class FunctionDef(Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: FunctionName


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError("json_schema is only allowed with type json_schema")
        return self

    def structured(self) -> StructuredOutput | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutput("json_object")
        assert self.json_schema is not None
        schema = self.json_schema.schema_ or {"type": "object"}
        return StructuredOutput("json_schema", json.dumps(schema), self.json_schema.name)


def _parameters(f: FunctionDef) -> dict[str, Any]:
    return f.parameters or {"type": "object", "properties": {}}


def tool_constraint(
    mode: ToolChoice, functions: list[FunctionDef], parallel: bool = True
) -> StructuredOutput:
    """The output schema of a constrained tool choice: a named function's parameters,
    or (``required``) a non-empty array of ``{"name", "parameters"}`` calls of the
    tools (vLLM's shape for required tool calls); ``parallel`` False allows one."""
    if mode.mode == "named":
        f = next(f for f in functions if f.name == mode.name)
        return StructuredOutput("json_schema", json.dumps(_parameters(f)), f.name)
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [f.name]},
                           "parameters": _parameters(f)},
            "required": ["name", "parameters"],
            "additionalProperties": False,  # a call is its name and arguments, no more
        }
        for f in functions
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:  # parallel_tool_calls: false
        schema["maxItems"] = 1
    return StructuredOutput("json_schema", json.dumps(schema), "tool_calls")
