"""OpenAI Responses request bodies (``POST /v1/responses``), validated with pydantic and
translated into the chat request the rest of the pipeline serves (``to_chat``). As for
chat, every documented parameter is honoured, accepted without effect, or refused with
a 400 naming it; unknown fields are refused.

The translation: ``instructions`` become a system message (never carried over from a
previous response, as OpenAI's); the stored chain of ``previous_response_id`` comes next
(its chat messages, ``app.responses``), then this request's ``input``: a string is one
user message; message items keep their role (``developer`` is ``system``) and text;
``function_call`` items become the preceding assistant message's ``tool_calls`` (a new
assistant message when none precedes); ``function_call_output`` items become tool
messages. Function ``tools`` become chat's function tools, ``tool_choice`` and
``parallel_tool_calls`` chat's, ``text.format`` chat's ``response_format`` (the same
structured-output path; a required or named tool choice wins over it, as in chat),
``max_output_tokens`` chat's ``max_tokens``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.api.messages import INT32_MAX, FunctionName, unsupported
from app.api.protocol import ChatCompletionRequest
from app.schema import Strict

ItemId = Annotated[str, Field(min_length=1, max_length=256)]


class InputText(Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # an output_text's, sent back
    logprobs: list[dict[str, Any]] | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class MediaInput(BaseModel):
    """Documented parts the served models cannot read: a 400 naming them."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_image", "input_file", "input_audio"]

    @model_validator(mode="after")
    def _refuse(self) -> MediaInput:
        raise unsupported(f"`{self.type}` parts need a multimodal model; the models served "
                          "here read text only")  # fmt: skip


Part = Annotated[InputText | Refusal | MediaInput, Field(discriminator="type")]


class MessageItem(Strict):
    """A message: the caller's input, or an earlier answer sent back as history."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, InputText) else p.refusal
                       for p in self.content if isinstance(p, InputText | Refusal))  # fmt: skip


class FunctionCallItem(Strict):
    """A call the model made, sent back as history."""

    type: Literal["function_call"]
    call_id: ItemId
    name: FunctionName
    arguments: str = Field(max_length=1024 * 1024)
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionOutputItem(Strict):
    """The caller's result of a call."""

    type: Literal["function_call_output"]
    call_id: ItemId
    output: str | list[InputText]
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(
            p.text for p in self.output
        )  # fmt: skip


class OtherItem(BaseModel):
    """Documented items this server cannot take: a 400 naming them."""

    model_config = ConfigDict(extra="allow")
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> OtherItem:
        if self.type == "item_reference":
            raise unsupported("item references are not resolved here: send the item, or "
                              "continue from its response with previous_response_id")  # fmt: skip
        if self.type == "reasoning":
            raise unsupported("the models served here are not reasoning models")
        raise unsupported(f"`{self.type}` items belong to tools this server does not run; "
                          "it takes messages, function_call and function_call_output")  # fmt: skip


def parse_item(value: Any) -> Any:
    """An item by its type (a message may leave ``type`` out)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("type", "message")
    if kind == "message":
        return MessageItem.model_validate(value)
    if kind == "function_call":
        return FunctionCallItem.model_validate(value)
    if kind == "function_call_output":
        return FunctionOutputItem.model_validate(value)
    return OtherItem.model_validate(value)


Item = MessageItem | FunctionCallItem | FunctionOutputItem


class FunctionTool(Strict):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def for_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        for field in ("description", "parameters", "strict"):
            if getattr(self, field) is not None:
                function[field] = getattr(self, field)
        return {"type": "function", "function": function}


class BuiltInTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> BuiltInTool:
        raise unsupported(f"`{self.type}` is a built-in tool; this server runs function "
                          "tools only (type function)")  # fmt: skip


def _tool(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") != "function":
        return BuiltInTool.model_validate(value)
    return value


class NamedFunction(Strict):
    type: Literal["function"]
    name: FunctionName


class Format(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> Format:
        if (self.type == "json_schema") != (self.schema_ is not None):
            raise ValueError("schema is given with type json_schema, and only then")
        if self.type == "json_schema" and self.name is None:
            raise ValueError("type json_schema needs a name")
        return self

    def for_chat(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        spec: dict[str, Any] = {"name": self.name, "schema": self.schema_}
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(Strict):
    format: Format | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class StreamOptions(Strict):
    include_obfuscation: bool | None = None  # accepted: no obfuscation is added


class Reasoning(Strict):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None

    @model_validator(mode="after")
    def _none(self) -> Reasoning:
        if self.effort not in (None, "none") or self.summary or self.generate_summary:
            raise unsupported("the models served here are not reasoning models")
        return self


REFUSED = {  # field -> why any value but null (or false, or empty) is refused
    "background": "background responses are not run here: call without background",
    "conversation": "conversations are not kept here: chain responses with "
    "previous_response_id",
    "prompt": "stored prompt templates are not kept here: send instructions and input",
    "top_logprobs": "log probabilities are served by /v1/chat/completions (logprobs)",
    "max_tool_calls": "this server runs no built-in tools to cap",
    "context_management": "this server compacts no context: send the turns to keep",
}


class ResponsesRequest(Strict):
    """``POST /v1/responses``."""

    model: str = Field(min_length=1, max_length=256)
    input: str | Annotated[list[Item], Field(max_length=4096)]
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]],
                        Field(max_length=16)] | None = None  # fmt: skip
    truncation: Literal["disabled", "auto"] | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    include: list[str] | None = None
    reasoning: Reasoning | None = None
    # accepted, no effect on the output
    user: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # refused unless empty
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    context_management: list[dict[str, Any]] | None = None

    @field_validator(*REFUSED)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, False, [], {}):
            raise unsupported(REFUSED[info.field_name or ""])
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("input is a string or at least one item")
            return [parse_item(v) for v in value]
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _built_in(cls, tools: Any) -> Any:
        return [_tool(t) for t in tools] if isinstance(tools, list) else tools

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, value: str | None) -> str | None:
        if value == "auto":
            raise unsupported("context is not truncated here: a request over the model's "
                              "context window fails (truncation disabled)")  # fmt: skip
        return value

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise unsupported(f"nothing can be included here ({', '.join(value)}): the "
                              "answer holds text and function calls only")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _choice_fits_the_tools(self) -> ResponsesRequest:
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        c = self.tool_choice
        if isinstance(c, NamedFunction) and c.name not in names:
            raise ValueError(f"tool_choice names {c.name!r}, not among tools {names}")
        if c == "required" and not names:
            raise ValueError("tool_choice required needs tools")
        return self

    def items(self) -> list[Item]:
        """This request's input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def to_chat(self, history: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat request served for this one, after ``history`` (the chat messages of
        the previous response's chain)."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += history + chat_messages(self.items())
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "stream": self.stream}  # fmt: skip
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p", "user", "service_tier", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.tools:
            body["tools"] = [t.for_chat() for t in self.tools]
            c = self.tool_choice
            if c is not None:
                body["tool_choice"] = c if isinstance(c, str) else {
                    "type": "function", "function": {"name": c.name}}  # fmt: skip
        if self.text is not None and self.text.format is not None:
            body["response_format"] = self.text.format.for_chat()
        return ChatCompletionRequest.model_validate(body)


def chat_messages(items: list[Item]) -> list[dict[str, Any]]:
    """Items as chat messages (module docstring)."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return out
