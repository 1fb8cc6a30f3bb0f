"""Tool calls out of generated text, at the replica (where the model's tokenizer is).

Rule: the request's ``ToolChoice`` decides how the engine's text becomes ``tool_calls``
(OpenAI's streamed shape: per call an ``index``, the first piece with ``id`` and
``name``, then ``arguments`` text):

* ``named``: the output was constrained to the function's parameters schema
  (structured outputs), so every text delta is an arguments delta of call 0; the
  finish reason stays ``stop`` (as OpenAI's for a named choice).
* ``required``: constrained to a JSON array of ``{"name", "parameters"}`` items; the
  array is parsed when the output ends and each item becomes one call, sent whole;
  finish ``tool_calls``.
* ``auto``: the model's own syntax, parsed while it streams by the vLLM tool parser
  the model's config names (``tool_parser``: hermes, llama3_json, pythonic …); text
  outside calls stays content; finish ``tool_calls`` when a call was made.

Call ids are ``call_`` plus 24 random hex characters. Token counts are the engine's:
tool-call tokens are billed like any other.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from app.engine.protocol import GenerationDelta, InvalidRequest, ToolCallDelta
from app.request import Prompt, ToolChoice


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


async def named_calls(
    deltas: AsyncIterator[GenerationDelta], name: str
) -> AsyncIterator[GenerationDelta]:
    first = True
    async for d in deltas:
        call: tuple[ToolCallDelta, ...] = ()
        if d.text or first:
            call = (ToolCallDelta(0, call_id(), name, d.text) if first
                    else ToolCallDelta(0, arguments=d.text),)  # fmt: skip
            first = False
        yield replace(d, text="", tool_calls=call)


def parse_required(text: str) -> tuple[ToolCallDelta, ...]:
    """The calls of a ``required`` answer: a JSON array of {"name", "parameters"}."""
    try:
        items = json.loads(text)
    except ValueError:
        return ()  # cut short (max_tokens): no complete call to report
    if not isinstance(items, list):
        return ()
    return tuple(
        ToolCallDelta(i, call_id(), str(item["name"]), json.dumps(item.get("parameters", {})))
        for i, item in enumerate(items)
        if isinstance(item, dict) and "name" in item
    )


async def required_calls(deltas: AsyncIterator[GenerationDelta]) -> AsyncIterator[GenerationDelta]:
    text: list[str] = []
    async for d in deltas:
        text.append(d.text)
        if d.finish_reason is None:
            yield replace(d, text="")
            continue
        calls = parse_required("".join(text))
        finish = "tool_calls" if calls and d.finish_reason == "stop" else d.finish_reason
        yield replace(d, text="", tool_calls=calls, finish_reason=finish)


class ParsedCalls:
    """``auto``: vLLM's tool parser over the running text, one delta at a time."""

    def __init__(self, parser_name: str, tokenizer: Any, prompt: Prompt) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as VllmChatRequest,
        )
        from vllm.tool_parsers import ToolParserManager

        tools: Any = list(prompt.tools or ())
        self._request = VllmChatRequest(  # type: ignore[call-arg]
            model="switchyard",
            messages=[{"role": "user", "content": ""}],
            tools=tools,
            tool_choice="auto",
        )
        parsed: Any = self._request.tools
        self._parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer, parsed)
        self._tokenizer = tokenizer

    def _ids(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False)) if text else []

    async def run(self, deltas: AsyncIterator[GenerationDelta]) -> AsyncIterator[GenerationDelta]:
        previous, previous_ids = "", list[int]()
        called = False
        async for d in deltas:
            current = previous + d.text
            delta_ids = self._ids(d.text)
            message = self._parser.extract_tool_calls_streaming(
                previous, current, d.text, previous_ids, previous_ids + delta_ids, delta_ids,
                self._request,
            )  # fmt: skip
            previous, previous_ids = current, previous_ids + delta_ids
            calls = tuple(_delta_call(c) for c in (message.tool_calls if message else ()))
            called = called or bool(calls)
            finish = d.finish_reason
            if finish == "stop" and called:
                finish = "tool_calls"
            content = (message.content or "") if message is not None else ""
            yield replace(d, text=content, tool_calls=calls, finish_reason=finish)


def _delta_call(c: Any) -> ToolCallDelta:
    f = c.function
    return ToolCallDelta(
        index=c.index,
        id=c.id,
        name=f.name if f is not None else None,
        arguments=(f.arguments or "") if f is not None else "",
    )


def shape_tool_calls(
    deltas: AsyncIterator[GenerationDelta],
    choice: ToolChoice | None,
    prompt: Prompt,
    parser: str | None,
    tokenizer: Any,
    served_name: str,
) -> AsyncIterator[GenerationDelta]:
    """The engine's deltas with tool calls taken out of the text (module docstring)."""
    if choice is None:
        return deltas
    if choice.mode == "named":
        assert choice.name is not None
        return named_calls(deltas, choice.name)
    if choice.mode == "required":
        return required_calls(deltas)
    if parser is None or tokenizer is None:
        raise InvalidRequest(
            f"model {served_name} has no tool_parser configured, so it cannot choose tools "
            "itself: use tool_choice 'required' or a named function",
            "tool_choice",
        )
    return ParsedCalls(parser, tokenizer, prompt).run(deltas)
