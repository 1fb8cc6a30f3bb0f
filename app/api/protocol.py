"""OpenAI request bodies we accept, validated with pydantic. Every documented
parameter of chat and legacy completions is known: honoured, accepted without effect
on the output, or refused with a 400 that names it and says why (``unsupported``).
Unknown, undocumented fields are rejected with a 400 naming them, as the OpenAI API
does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.api.messages import (
    DEPRECATED_FUNCTIONS,
    INT32_MAX,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    TokenId,
    ToolDef,
    tool_constraint,
    unsupported,
)
from app.engine.protocol import SamplingOptions, StructuredOutput
from app.request import Prompt, ToolChoice
from app.schema import Strict


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None  # OpenAI's stream padding: none is sent


StopField = str | Annotated[list[str], Field(max_length=4)] | None
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 1024


class _SamplingFields(Strict):
    """What chat and legacy completions share. Parameters are honoured (they reach the
    engine; ``service_tier`` flex marks batch work for ``app.routing.classes``), accepted
    without effect on the output (``user``, ``metadata``, ``service_tier`` auto/default,
    ``safety_identifier``, ``prompt_cache_key``, ``store`` false), or refused with a 400
    that names them and says why (see README)."""

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
    # Accepted and never used: the gateway sets the salt from the tenant
    # (``gateway.kv_cache``), so a client cannot join another tenant's prefix cache.
    cache_salt: str | None = Field(default=None, max_length=1024)

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
            len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items())
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
        if tier not in (None, "auto", "default", "flex"):
            raise unsupported(
                "this server's service tiers are 'auto', 'default' and 'flex' (batch work: "
                "a model with class routing serves it on its throughput pool)"
            )
        return tier

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


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
        arguments always parse and validate); else the response format does. Both given:
        the forced call wins, as OpenAI's (the format shapes text, and a forced call has
        none; agent SDKs send both for an agent with an output type and a required tool
        choice, and the next, auto turn gets the format)."""
        mode = self.tool_mode()
        if mode is not None and mode.mode != "auto":
            assert self.tools is not None
            functions = [t.function for t in self.tools]
            return tool_constraint(mode, functions, self.parallel_tool_calls is not False)
        return self.response_format.structured() if self.response_format else None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt(self) -> Prompt:
        tools = None
        if self.tools and self.tool_choice != "none":
            tools = tuple(t.model_dump(exclude_none=True) for t in self.tools)
        return Prompt(messages=tuple(m.for_template() for m in self.messages), tools=tools)


class CompletionRequest(_SamplingFields):
    # An empty text prompt is no prompt: the engine refuses it ("The decoder prompt
    # cannot be empty"), which reached clients as a 500 for `[""]` (found by
    # benchmarks.fuzz_openapi). `_no_empty_prompt` refuses it first with one clear 400.
    prompt: str | list[TokenId] | list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=128)
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _no_empty_prompt(cls, prompt: Any) -> Any:
        if prompt == "" or prompt == [] or (isinstance(prompt, list) and "" in prompt):
            raise ValueError("an empty prompt: give text or token ids")
        return prompt

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


class EmbeddingRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, max_length=256)
    dimensions: int | None = None

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
