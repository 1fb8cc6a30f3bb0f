"""OpenAI Responses shapes: the response object, its output items, usage, and the
stream's events (``ItemStream``).

A response echoes the request's settings (``ResponseHeader``) and holds its output as
items: a ``message`` with one ``output_text`` part when the model wrote text (or wrote
nothing and called nothing), then one ``function_call`` item per call. Status:
``completed``; ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``
when the answer hit its token limit (and ``incomplete_details.stop_reason``
``budget_exhausted`` when that limit was a budget's allowance, as chat's
``stop_reason``); ``failed`` with ``error`` when the engine failed mid-stream. Usage:
``input_tokens`` (all prompt tokens; ``input_tokens_details.cached_tokens`` those the
engine found in its prefix cache), ``output_tokens``, ``total_tokens``.

Streamed events, each with its ``sequence_number``: ``response.created``,
``response.in_progress``; per item ``response.output_item.added``, then for a message
``response.content_part.added``, ``response.output_text.delta``…, ``.output_text.done``,
``.content_part.done``, for a call ``response.function_call_arguments.delta``…,
``.function_call_arguments.done``; then ``response.output_item.done``; last
``response.completed`` (or ``response.incomplete``, or ``response.failed``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.api.openai_format import merge_calls
from app.api.responses_protocol import ResponsesRequest
from app.engine.protocol import ToolCallDelta


def sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": content if status == "completed" or text else []}  # fmt: skip


def call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    f = call["function"]
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call["id"],
            "name": f["name"], "arguments": f["arguments"]}  # fmt: skip


def output_items(rid: str, text: str, pieces: Sequence[ToolCallDelta]) -> list[dict[str, Any]]:
    """A whole answer's output: its text as a message, then its calls."""
    calls = merge_calls(pieces)
    items = [message_item(f"msg_{rid}", text)] if text or not calls else []
    return items + [call_item(f"fc_{rid}_{i}", c) for i, c in enumerate(calls)]


def incomplete(finish_reason: str | None) -> bool:
    return finish_reason == "length"


def _incomplete(stop_reason: str | None) -> dict[str, str]:
    """OpenAI's reason, and chat's ``stop_reason`` extension where a budget capped it."""
    out = {"reason": "max_output_tokens"}
    return {**out, "stop_reason": stop_reason} if stop_reason else out


@dataclass(frozen=True)
class ResponseHeader:
    """What every state of one response shows: its id, model and the request's settings."""

    id: str
    created_at: int
    model: str
    body: ResponsesRequest

    def response(
        self, status: str, output: list[dict[str, Any]], use: dict[str, Any] | None,
        *, stored: bool | None = None, error: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        b = self.body
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        text: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                                if fmt is not None else {"type": "text"}}  # fmt: skip
        if b.text is not None and b.text.verbosity is not None:
            text["verbosity"] = b.text.verbosity
        choice = b.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error,
            "incomplete_details": _incomplete(reason) if status == "incomplete" else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "model": self.model, "output": output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": b.store if stored is None else stored,
            "temperature": b.temperature if b.temperature is not None else 1.0,
            "text": text,
            "tool_choice": choice.model_dump() if choice is not None and not isinstance(
                choice, str) else (choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or []],
            "top_p": b.top_p if b.top_p is not None else 1.0,
            "truncation": "disabled", "usage": use, "user": b.user,
            "metadata": b.metadata or {},
        }  # fmt: skip


@dataclass
class ItemStream:
    """The item events of one streamed answer: a message item while text comes, a
    function_call item per call, each added and done in order; ``sequence_number``
    counts every event of the stream."""

    rid: str
    seq: int = 0
    items: list[dict[str, Any]] = field(default_factory=list)  # done, in output order
    _open: dict[str, Any] | None = None  # the item being streamed
    _calls: set[int] = field(default_factory=set)

    def event(self, kind: str, data: dict[str, Any]) -> str:
        out = sse(kind, {**data, "sequence_number": self.seq})
        self.seq += 1
        return out

    def _index(self) -> int:
        return len(self.items)

    def _start(self, item: dict[str, Any]) -> list[str]:
        out = self.close()
        self._open = item
        return [*out, self.event("response.output_item.added",
                                 {"output_index": self._index(), "item": item})]  # fmt: skip

    def close(self) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        at = {"item_id": item["id"], "output_index": self._index()}
        out: list[str] = []
        if item["type"] == "message":
            text = item["content"][0]["text"]
            done = message_item(item["id"], text)
            part = done["content"][0]
            out += [self.event("response.output_text.done",
                               {**at, "content_index": 0, "text": text, "logprobs": []}),
                    self.event("response.content_part.done",
                               {**at, "content_index": 0, "part": part})]  # fmt: skip
        else:
            done = {**item, "status": "completed"}
            out.append(self.event("response.function_call_arguments.done",
                                  {**at, "arguments": item["arguments"]}))  # fmt: skip
        out.append(self.event("response.output_item.done",
                              {"output_index": self._index(), "item": done}))  # fmt: skip
        self.items.append(done)
        return out

    def text(self, text: str) -> list[str]:
        out: list[str] = []
        if self._open is None or self._open["type"] != "message":
            out = self._start(message_item(f"msg_{self.rid}", "", "in_progress"))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            assert self._open is not None
            self._open["content"] = [part]
            out.append(self.event("response.content_part.added",
                                  {"item_id": self._open["id"], "output_index": self._index(),
                                   "content_index": 0, "part": dict(part)}))  # fmt: skip
        assert self._open is not None
        if text:
            self._open["content"][0]["text"] += text
            out.append(self.event("response.output_text.delta",
                                  {"item_id": self._open["id"], "output_index": self._index(),
                                   "content_index": 0, "delta": text, "logprobs": []}))  # fmt: skip
        return out

    def call(self, piece: ToolCallDelta) -> list[str]:
        out: list[str] = []
        if piece.index not in self._calls:
            self._calls.add(piece.index)
            call = {"id": piece.id or f"call_{self.rid}_{piece.index}",
                    "function": {"name": piece.name or "", "arguments": ""}}  # fmt: skip
            out = self._start(call_item(f"fc_{self.rid}_{piece.index}", call, "in_progress"))
        assert self._open is not None
        if piece.arguments:
            self._open["arguments"] += piece.arguments
            out.append(self.event("response.function_call_arguments.delta",
                                  {"item_id": self._open["id"], "output_index": self._index(),
                                   "delta": piece.arguments}))  # fmt: skip
        return out

    def finish(self) -> list[str]:
        """Close the open item; an answer with no item gets its empty message."""
        if not self.items and self._open is None:
            return self._empty()
        return self.close()

    def _empty(self) -> list[str]:
        return [*self.text(""), *self.close()]
