"""OpenAI request bodies we accept, validated with pydantic (unknown fields are
rejected with a 400 naming them, as the OpenAI API does)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.engine.protocol import SamplingOptions
from app.request import Prompt

# Bounds that keep every number inside what engines and samplers accept (an int64 seed,
# an int32 token id or token count), so an absurd value is a 400, never an engine error.
INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


StopField = str | Annotated[list[str], Field(max_length=4)] | None
MAX_STOP_CHARS = 1024


class _SamplingFields(_Strict):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: Literal[1] = 1
    stop: StopField = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    ignore_eos: bool = False

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self) -> SamplingOptions:
        """The sampling parameters, with OpenAI's defaults filled in: built once here."""
        return SamplingOptions(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=self.stop_list(),
            ignore_eos=self.ignore_eos,
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

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt(self) -> Prompt:
        return Prompt(messages=tuple({"role": m.role, "content": m.text()} for m in self.messages))


class CompletionRequest(_SamplingFields):
    prompt: str | list[TokenId] | list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        several = isinstance(self.prompt, list) and len(self.prompt) > 1
        if several and not all(isinstance(p, int) for p in self.prompt):
            raise ValueError("only one prompt per request is supported")
        return self

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
