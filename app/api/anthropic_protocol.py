"""Anthropic Messages request bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``),
validated with pydantic and translated into the chat request the rest of the pipeline
serves (``to_chat``). As for chat, every documented parameter is honoured, accepted
without effect, or refused with a 400 naming it; unknown fields are refused.

The translation: ``system`` becomes a system message; a user turn's ``tool_result``
blocks become tool messages (in block order, text between them a user message); an
assistant turn's ``tool_use`` blocks become its ``tool_calls``; ``tools`` become function
tools with ``input_schema`` as their parameters; ``tool_choice`` auto / any / tool /
none become chat's auto / required / named / none, and ``disable_parallel_tool_use``
``parallel_tool_calls: false``. ``cache_control`` is accepted without effect: the
engines' prefix cache reuses every repeated prefix on its own (reported as
``cache_read_input_tokens``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.api.messages import INT32_MAX, FunctionName, unsupported
from app.api.protocol import MAX_STOP_CHARS, ChatCompletionRequest
from app.schema import Strict


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(Strict):
    """A call the assistant made, sent back as history."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        body = self.content if isinstance(self.content, str) else "".join(
            b.text for b in self.content
        )  # fmt: skip
        return f"Error: {body}" if self.is_error else body


class OtherBlock(BaseModel):
    """Documented blocks the served models cannot read: a 400 naming them."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "image", "document", "search_result", "thinking", "redacted_thinking",
        "server_tool_use", "web_search_tool_result", "container_upload",
    ]  # fmt: skip

    @model_validator(mode="after")
    def _refuse(self) -> OtherBlock:
        if self.type in ("thinking", "redacted_thinking"):
            raise unsupported("the models served here are not thinking models")
        if self.type in ("server_tool_use", "web_search_tool_result", "container_upload"):
            raise unsupported("this server runs no server tools")
        raise unsupported(f"`{self.type}` blocks need a multimodal model; the models "
                          "served here read text only")  # fmt: skip


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | OtherBlock, Field(discriminator="type")
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(min_length=1)]

    @field_validator("content", mode="before")
    @classmethod
    def _not_empty(cls, content: Any) -> Any:
        if content == []:  # else the union reports its string branch: a puzzling message
            raise ValueError("a turn's content is a string or at least one content block")
        return content

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> Message:
        if isinstance(self.content, str):
            return self
        kinds = {b.type for b in self.content}
        if self.role == "user" and "tool_use" in kinds:
            raise ValueError("tool_use blocks belong to assistant turns")
        if self.role == "assistant" and "tool_result" in kinds:
            raise ValueError("tool_result blocks belong to user turns")
        return self

    def for_chat(self) -> list[dict[str, Any]]:
        """This turn as chat messages (module docstring)."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "assistant":
            text = "".join(b.text for b in self.content if isinstance(b, TextBlock))
            calls = [
                {"id": b.id, "type": "function",
                 "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                for b in self.content if isinstance(b, ToolUseBlock)
            ]  # fmt: skip
            out: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                out["tool_calls"] = calls
            return [out]
        turns: list[dict[str, Any]] = []
        for b in self.content:
            if isinstance(b, ToolResultBlock):
                turns.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
            elif isinstance(b, TextBlock):
                if turns and turns[-1]["role"] == "user":
                    turns[-1]["content"] += b.text
                else:
                    turns.append({"role": "user", "content": b.text})
        return turns


class Tool(Strict):
    """A client tool. Server tools (``type`` other than ``custom``) are refused."""

    name: FunctionName
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None

    @field_validator("input_schema")
    @classmethod
    def _an_object(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if schema.get("type", "object") != "object":
            raise ValueError("a tool's input_schema describes an object")
        return schema

    def for_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ServerTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> ServerTool:
        raise unsupported(f"`{self.type}` is a server tool; this server runs client tools "
                          "only (no type, or type custom)")  # fmt: skip


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is given with type tool, and only then")
        return self

    def for_chat(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Metadata(Strict):
    user_id: str | None = Field(default=None, max_length=256)


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None

    @field_validator("effort")
    @classmethod
    def _effort(cls, value: str | None) -> str | None:
        if value is not None:
            raise unsupported("the models served here are not reasoning models")
        return value


class Diagnostics(Strict):
    previous_message_id: str | None = Field(default=None, max_length=256)


def _tool(value: Any) -> Any:
    """A client tool, or a server tool (refused by name)."""
    if isinstance(value, dict) and value.get("type") not in (None, "custom"):
        return ServerTool.model_validate(value)
    return value


class _Conversation(Strict):
    """What a message request and a token count share."""

    model: str = Field(min_length=1, max_length=256)
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None

    @field_validator("messages")
    @classmethod
    def _ends_with_the_user(cls, messages: list[Message]) -> list[Message]:
        if messages[-1].role == "assistant":
            raise unsupported("a final assistant turn (a prefill to continue) is not "
                              "continued here: end with a user turn")  # fmt: skip
        return messages

    @field_validator("tools", mode="before")
    @classmethod
    def _server_tools(cls, tools: Any) -> Any:
        return [_tool(t) for t in tools] if isinstance(tools, list) else tools

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "disabled":
            raise unsupported("the models served here are not thinking models")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _mcp(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise unsupported("this server connects to no MCP servers")
        return value

    @model_validator(mode="after")
    def _choice_fits_the_tools(self) -> _Conversation:
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        c = self.tool_choice
        if c is not None and c.type == "tool" and c.name not in names:
            raise ValueError(f"tool_choice names {c.name!r}, not among tools {names}")
        if c is not None and c.type == "any" and not names:
            raise ValueError("tool_choice any needs tools")
        return self

    def chat_body(self) -> dict[str, Any]:
        """The chat request body this conversation is (module docstring)."""
        messages: list[dict[str, Any]] = []
        if self.system:
            text = self.system if isinstance(self.system, str) else "".join(
                b.text for b in self.system
            )  # fmt: skip
            messages.append({"role": "system", "content": text})
        for m in self.messages:
            messages += m.for_chat()
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.tools:
            body["tools"] = [t.for_chat() for t in self.tools]
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice.for_chat()
                if self.tool_choice.disable_parallel_tool_use:
                    body["parallel_tool_calls"] = False
        return body


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``."""

    def to_chat(self) -> ChatCompletionRequest:
        return ChatCompletionRequest.model_validate(self.chat_body())


class MessagesRequest(_Conversation):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1, le=INT32_MAX)
    stop_sequences: Annotated[list[str], Field(max_length=16)] | None = None
    stream: bool = False
    # sampling: older SDKs type these, the current one sends them as extra_body
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None
    # accepted, no effect on the output
    service_tier: Literal["auto", "standard_only"] | None = None
    speed: Literal["standard", "fast"] | None = None
    cache_control: CacheControl | None = None
    inference_geo: str | None = Field(default=None, max_length=64)
    diagnostics: Diagnostics | None = None
    user_profile_id: str | None = Field(default=None, max_length=256)
    workspace_id: str | None = Field(default=None, max_length=256)
    # refused
    container: str | dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, stops: list[str] | None) -> list[str] | None:
        if any(s == "" or len(s) > MAX_STOP_CHARS for s in stops or []):
            raise ValueError(f"stop sequences are 1 to {MAX_STOP_CHARS} characters")
        return stops

    @field_validator("container")
    @classmethod
    def _container(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is not None:
            raise unsupported("this server runs no code-execution containers")
        return value

    @field_validator("context_management")
    @classmethod
    def _context(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise unsupported("this server edits no context: send the turns to keep")
        return value

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request served for this one; its stop strings are ``stop_sequences``
        (``ParseSettings`` passes them to the sampler, beyond chat's four)."""
        body = self.chat_body()
        body["max_tokens"] = self.max_tokens
        body["stream"] = self.stream
        # Anthropic's default temperature is 1.0, as chat's
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.metadata is not None and self.metadata.user_id is not None:
            body["user"] = self.metadata.user_id
        out = self.output_config.format if self.output_config is not None else None
        if out is not None:  # structured output, as chat's json_schema response format
            schema = {"name": "output", "schema": out.schema_}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        return ChatCompletionRequest.model_validate(body)
