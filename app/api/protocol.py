"""OpenAI request bodies we accept, validated with pydantic. Every documented
parameter of chat and legacy completions is known: honoured, accepted without effect
on the output, or refused with a 400 that names it and says why (``unsupported``).
Unknown, undocumented fields are rejected with a 400 naming them, as the OpenAI API
does."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.engine.protocol import SamplingOptions, StructuredOutput
from app.request import Prompt, ToolChoice

UNSUPPORTED = "unsupported_parameter"  # the error type app.api.errors maps to a 400

# Bounds that keep every number inside what engines and samplers accept (an int64 seed,
# an int32 token id or token count), so an absurd value is a 400, never an engine error.
INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def unsupported(reason: str) -> PydanticCustomError:
    """A documented OpenAI parameter this server cannot honour: 400 naming it, with
    ``reason`` (never a generic schema error, never silently ignored)."""
    return PydanticCustomError(UNSUPPORTED, reason)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
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


class FunctionCall(_Strict):
    name: FunctionName
    arguments: str = Field(max_length=1024 * 1024)


class ToolCall(_Strict):
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


class ChatMessage(_Strict):
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


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None  # OpenAI's stream padding: none is sent


StopField = str | Annotated[list[str], Field(max_length=4)] | None
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 1024
DEPRECATED_FUNCTIONS = "functions/function_call are deprecated by OpenAI: use tools"


class _SamplingFields(_Strict):
    """What chat and legacy completions share. Parameters are honoured (they reach the
    engine), accepted without effect on the output (``user``, ``metadata``,
    ``service_tier`` auto/default, ``safety_identifier``, ``prompt_cache_key``, ``store``
    false), or refused with a 400 that names them and says why (see README)."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=128)
    stop: StopField = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0, le=INT32_MAX)
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = None
    ignore_eos: bool = False

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def _logprobs(self) -> int | None:
        return None

    def _structured(self) -> StructuredOutput | None:
        return None

    def sampling(self) -> SamplingOptions:
        """The sampling parameters, with OpenAI's defaults filled in: built once here."""
        bias = sorted((int(t), b) for t, b in (self.logit_bias or {}).items())
        return SamplingOptions(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=self.stop_list(),
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            top_k=max(self.top_k or 0, 0),  # -1 and 0 both mean every token
            min_p=self.min_p or 0.0,
            min_tokens=self.min_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logit_bias=tuple(bias),
            logprobs=self._logprobs(),
            structured=self._structured(),
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, value: StopField) -> StopField:
        stops = [value] if isinstance(value, str) else (value or [])
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty strings")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop sequences are limited to {MAX_STOP_CHARS} characters")
        return value


    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is None:
            return None
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids may be biased")
        for token, value in bias.items():
            if not token.isdigit() or int(token) > INT32_MAX:
                raise ValueError(f"keys must be token ids, not {token[:32]!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"biases lie in [-100, 100]; token {token} has {value}")
        return bias

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and (
            len(metadata) > 16
            or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items())
        ):
            raise ValueError("at most 16 pairs, keys up to 64 and values up to 512 characters")
        return metadata

    @field_validator("store")
    @classmethod
    def _store(cls, store: bool | None) -> bool | None:
        if store:
            raise unsupported(
                "this server does not store completions (the ledger keeps usage, never text)"
            )
        return store

    @field_validator("service_tier")
    @classmethod
    def _tier(cls, tier: str | None) -> str | None:
        if tier not in (None, "auto", "default"):
            raise unsupported("this server has one service tier: use 'auto' or 'default'")
        return tier

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class FunctionDef(_Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
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
        }
        for f in functions
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:  # parallel_tool_calls: false
        schema["maxItems"] = 1
    return StructuredOutput("json_schema", json.dumps(schema), "tool_calls")


def _refuse_when_set(reason: str) -> Any:
    def check(value: Any) -> Any:
        if value is not None:
            raise unsupported(reason)
        return value

    return check


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None

    _functions = field_validator("functions", "function_call")(
        _refuse_when_set(DEPRECATED_FUNCTIONS)
    )
    _audio = field_validator("audio")(
        _refuse_when_set("the models served here have no audio output")
    )
    _prediction = field_validator("prediction")(
        _refuse_when_set("predicted outputs are not supported by these engines")
    )
    _search = field_validator("web_search_options")(
        _refuse_when_set("this server has no web search")
    )
    _reasoning = field_validator("reasoning_effort")(
        _refuse_when_set("the models served here are not reasoning models")
    )
    _verbosity = field_validator("verbosity")(
        _refuse_when_set("the models served here take no verbosity setting")
    )

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_needs_tools(
        cls, choice: str | NamedToolChoice | None, info: ValidationInfo
    ) -> str | NamedToolChoice | None:
        tools = info.data.get("tools") or []
        names = [t.function.name for t in tools]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"no tool named {choice.function.name!r} among tools {names}")
        if choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs tools")
        return choice

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[ToolDef] | None) -> list[ToolDef] | None:
        names = [t.function.name for t in tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tool function names must be unique")
        return tools

    def tool_mode(self) -> ToolChoice | None:
        """How the answer may call tools (None: plain text). OpenAI's default with
        tools is ``auto``."""
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return ToolChoice("named", self.tool_choice.function.name)
        return ToolChoice("required" if self.tool_choice == "required" else "auto")

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, modalities: list[str] | None) -> list[str] | None:
        if modalities is not None and any(m != "text" for m in modalities):
            raise unsupported("the models served here produce text only")
        return modalities

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    def _logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def _structured(self) -> StructuredOutput | None:
        """Tool choice ``required`` or a named function constrains the output (so the
        arguments always parse and validate); else the response format does."""
        mode = self.tool_mode()
        if mode is not None and mode.mode != "auto":
            assert self.tools is not None
            functions = [t.function for t in self.tools]
            return tool_constraint(mode, functions, self.parallel_tool_calls is not False)
        return self.response_format.structured() if self.response_format else None

    @model_validator(mode="after")
    def _one_constraint(self) -> ChatCompletionRequest:
        mode = self.tool_mode()
        constrained = self.response_format is not None and self.response_format.type != "text"
        if constrained and mode is not None and mode.mode != "auto":
            raise ValueError("response_format and a required or named tool_choice both "
                             "constrain the output: give one")  # fmt: skip
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt(self) -> Prompt:
        tools = None
        if self.tools and self.tool_choice != "none":
            tools = tuple(t.model_dump(exclude_none=True) for t in self.tools)
        return Prompt(messages=tuple(m.for_template() for m in self.messages), tools=tools)


class CompletionRequest(_SamplingFields):
    prompt: str | list[TokenId] | list[str] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=128)
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _echo(cls, echo: bool) -> bool:
        if echo:
            raise unsupported("echo is not supported yet: the prompt is what you sent")
        return echo

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        if best_of not in (None, info.data.get("n", 1)):
            raise unsupported("best_of other than n is not supported by these engines (vLLM V1)")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise unsupported("insertion (a suffix) is not supported by the models served here")
        return suffix

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        several = isinstance(self.prompt, list) and len(self.prompt) > 1
        if several and not all(isinstance(p, int) for p in self.prompt):
            raise ValueError("only one prompt per request is supported")
        return self

    def _logprobs(self) -> int | None:
        return self.logprobs

    def prompt_of(self) -> Prompt:
        """The one prompt: text, or the client's token ids."""
        if isinstance(self.prompt, str):
            return Prompt(text=self.prompt)
        if all(isinstance(p, int) for p in self.prompt):
            return Prompt(token_ids=tuple(int(p) for p in self.prompt))
        return Prompt(text=str(self.prompt[0]))

    def requested_max_tokens(self) -> int | None:
        # OpenAI's legacy completions default is 16 tokens.
        return self.max_tokens if self.max_tokens is not None else 16


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, max_length=256)
    dimensions: int | None = None

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
