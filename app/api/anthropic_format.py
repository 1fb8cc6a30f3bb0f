"""Anthropic Messages response shapes: the message, the stream's events and the error
body (``{"type": "error", "error": {"type", "message"}}``, its type from the status).

Stop reasons from the engine's finish reasons: ``stop`` is ``end_turn`` (or
``stop_sequence`` with the sequence that matched), ``length`` is ``max_tokens`` (also
where a budget capped the answer: Anthropic has no reason of its own for that),
``tool_calls`` is ``tool_use``. Usage: ``input_tokens`` are the prompt tokens the
engine did not find in its prefix cache, ``cache_read_input_tokens`` those it did
(Anthropic counts them apart), ``cache_creation_input_tokens`` 0 (no cache is written
on request).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.api.openai_format import merge_calls
from app.engine.protocol import ToolCallDelta

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(kind: str, data: dict[str, Any]) -> str:
    """One server-sent event, named as Anthropic names it."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": max(0, prompt_tokens - cached_tokens),
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:  # an unconstrained ("auto") call the model left unparsable
        return {"_raw": arguments}


def content(text: str, calls: Sequence[ToolCallDelta]) -> list[dict[str, Any]]:
    """A whole answer's content blocks: its text, then its tool calls."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
    for c in merge_calls(calls):
        blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                       "input": _input(c["function"]["arguments"])})  # fmt: skip
    return blocks


@dataclass(frozen=True)
class MessageHeader:
    id: str
    model: str

    def message(
        self, blocks: list[dict[str, Any]], stop: str | None, sequence: str | None,
        use: dict[str, int],
    ) -> dict[str, Any]:  # fmt: skip
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": blocks, "stop_reason": stop, "stop_sequence": sequence,
                "usage": use}  # fmt: skip


@dataclass
class BlockStream:
    """The content-block events of one streamed answer: a text block while text comes,
    a tool_use block per call (its arguments as ``input_json_delta``), each started and
    stopped in order."""

    index: int = -1
    open: str | None = None  # "text", or the open tool call's index as "call:<i>"
    _calls: dict[int, int] = field(default_factory=dict)  # call index → block index

    def _start(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.open = kind
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def text(self, text: str) -> list[str]:
        out = [] if self.open == "text" else self._start("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return [*out, event("content_block_delta", {"index": self.index, "delta": delta})]

    def call(self, piece: ToolCallDelta) -> list[str]:
        out: list[str] = []
        if piece.index not in self._calls:
            block = {"type": "tool_use", "id": piece.id or f"toolu_{piece.index}",
                     "name": piece.name or "", "input": {}}  # fmt: skip
            out = self._start(f"call:{piece.index}", block)
            self._calls[piece.index] = self.index
        if piece.arguments:
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            at = self._calls[piece.index]
            out.append(event("content_block_delta", {"index": at, "delta": delta}))
        return out
