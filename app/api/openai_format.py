"""OpenAI response and stream-chunk shapes for chat and legacy completions, and the
embeddings list."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from app.engine.protocol import TokenLogprob, ToolCallDelta

Kind = Literal["chat", "completion"]
DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="surrogatepass"))


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: one entry per token, its top alternatives sorted."""
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": _token_bytes(t.token),
                "top_logprobs": [
                    {"token": tok, "logprob": lp, "bytes": _token_bytes(tok)} for tok, lp in t.top
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A legacy completion choice's ``logprobs``; ``offset`` is where the first token
    starts in the choice's text (a stream's earlier chunks)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
        "text_offset": offsets,
    }


def merge_calls(pieces: Sequence[ToolCallDelta]) -> list[dict[str, Any]]:
    """Whole calls from their streamed pieces (a non-streamed response's
    ``message.tool_calls``)."""
    calls: dict[int, dict[str, Any]] = {}
    for p in pieces:
        call = calls.setdefault(
            p.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if p.id:
            call["id"] = p.id
        if p.name:
            call["function"]["name"] = p.name
        call["function"]["arguments"] += p.arguments
    return [calls[i] for i in sorted(calls)]


def delta_calls(pieces: Sequence[ToolCallDelta]) -> list[dict[str, Any]]:
    """Streamed ``delta.tool_calls``: only what each piece carries."""
    out = []
    for p in pieces:
        call: dict[str, Any] = {"index": p.index}
        function: dict[str, Any] = {"arguments": p.arguments}
        if p.id is not None:
            call["id"], call["type"] = p.id, "function"
        if p.name is not None:
            function["name"] = p.name
        call["function"] = function
        out.append(call)
    return out


@dataclass(frozen=True)
class ResponseHeader:
    kind: Kind
    id: str
    created: int
    model: str

    def _base(self, stream: bool) -> dict[str, Any]:
        obj = {
            ("chat", False): "chat.completion",
            ("chat", True): "chat.completion.chunk",
            ("completion", False): "text_completion",
            ("completion", True): "text_completion",
        }[(self.kind, stream)]
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, tokens: Sequence[TokenLogprob] | None, offset: int = 0) -> Any:
        """The ``logprobs`` of a choice (None when the request asked for none)."""
        if tokens is None:
            return None
        return chat_logprobs(tokens) if self.kind == "chat" else completion_logprobs(tokens, offset)

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        *,
        role: bool = False,
        stop_reason: str | None = None,
        logprobs: Sequence[TokenLogprob] | None = None,
        offset: int = 0,
        tool_calls: Sequence[ToolCallDelta] = (),
        index: int = 0,
    ) -> dict[str, Any]:
        """One streamed chunk of choice ``index`` carrying ``text`` (or only a finish
        reason)."""
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = delta_calls(tool_calls)
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice["logprobs"] = self.logprobs(logprobs, offset)
        choice["finish_reason"] = finish_reason
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason  # vLLM's extension field
        return {**self._base(True), "choices": [choice]}

    @cached_property
    def _text_frame(self) -> tuple[str, str]:
        """The SSE event of a text-only chunk of choice 0, split around its text: built
        once per response, so a streamed token costs one ``json.dumps`` of its text."""
        head = json.dumps(self._base(True), separators=(",", ":"))[:-1]
        if self.kind == "chat":
            return (
                f'data: {head},"choices":[{{"index":0,"delta":{{"content":',
                '},"logprobs":null,"finish_reason":null}]}\n\n',
            )
        return (
            f'data: {head},"choices":[{{"index":0,"text":',
            ',"logprobs":null,"finish_reason":null}]}\n\n',
        )

    def text_event(self, text: str) -> str:
        """``sse(self.chunk(text))``, byte for byte, for the common chunk: text only,
        choice 0, no logprobs, no finish reason."""
        head, tail = self._text_frame
        return head + json.dumps(text) + tail

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._base(True), "choices": [], "usage": usage.as_dict()}

    def choice(
        self,
        text: str,
        finish_reason: str,
        *,
        index: int = 0,
        stop_reason: str | None = None,
        logprobs: Sequence[TokenLogprob] | None = None,
        tool_calls: Sequence[ToolCallDelta] = (),
    ) -> dict[str, Any]:
        """One whole choice of a non-streamed response."""
        lp = self.logprobs(logprobs)
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["content"] = text or None
                message["tool_calls"] = merge_calls(tool_calls)
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": lp,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        return choice

    def response_of(self, choices: Sequence[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        return {**self._base(False), "choices": list(choices), "usage": usage.as_dict()}

    def response(
        self,
        text: str,
        finish_reason: str,
        usage: Usage,
        *,
        stop_reason: str | None = None,
        logprobs: Sequence[TokenLogprob] | None = None,
        tool_calls: Sequence[ToolCallDelta] = (),
    ) -> dict[str, Any]:
        """A response of one choice."""
        choice = self.choice(text, finish_reason, stop_reason=stop_reason, logprobs=logprobs,
                             tool_calls=tool_calls)  # fmt: skip
        return self.response_of([choice], usage)


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    """``float``: the list itself; ``base64``: little-endian float32 bytes, as OpenAI."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embedding_list(
    vectors: Sequence[list[float]], model: str, tokens: int, encoding_format: str
) -> dict[str, Any]:
    """The body of an embeddings response (``EmbeddingList`` in ``/openapi.json``)."""
    data = [
        {"object": "embedding", "index": i, "embedding": encode_embedding(v, encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
