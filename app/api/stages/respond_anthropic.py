"""Stage 6, respond, for the Anthropic Messages endpoint: the answer as one message or
as Anthropic's event stream (``message_start``, ``content_block_start`` / ``delta`` /
``stop`` per block, ``message_delta`` with the stop reason and usage, ``message_stop``;
an ``error`` event when the engine fails mid-stream), the request ended once
(``Calls.end``) whichever way it ends, as ``respond_generation`` does for chat."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from app.api import anthropic_format as fmt
from app.api.flow import Call, Calls, ended_by
from app.api.stages.respond import collect, deltas, failure_status, never_streamed
from app.api.stages.route import Routed
from app.api.streaming import SettledStream
from app.dispatch.fallback import Answer
from app.request import InferenceRequest, Outcome
from app.state.records import LedgerStatus


def _usage(o: Outcome) -> dict[str, int]:
    return fmt.usage(o.prompt_tokens, o.completion_tokens, o.cached_tokens)


async def respond_messages(
    call: Call, body: Any, routed: Routed, request: InferenceRequest, answer: Answer,
    calls: Calls,
) -> Response:  # fmt: skip
    assert call.admission is not None
    answered_by = request.adapter.id if request.adapter is not None else routed.decision.model
    header = fmt.MessageHeader(f"msg_{call.rid}", answered_by)
    headers = {**call.admission.headers(), **call.route_header()}
    if request.stream:
        return SettledStream(
            _events(header, answer, call, calls),
            on_close=lambda: never_streamed(call, calls),
            media_type="text/event-stream",
            headers=headers,
        )
    err = await collect(answer, call, calls)
    if err is not None:
        return err.response("anthropic")
    o = call.outcome
    c = o.choice(0)
    message = header.message(
        fmt.content(c.text, c.tool_calls), fmt.stop_reason(c.finish_reason, c.stop_sequence),
        c.stop_sequence, _usage(o),
    )  # fmt: skip
    return JSONResponse(message, headers=headers)


async def _events(
    header: fmt.MessageHeader, answer: Answer, call: Call, calls: Calls
) -> AsyncIterator[str]:
    call.streaming = True
    o, stream = call.outcome, answer.stream
    status: tuple[LedgerStatus, int] = ("client_closed", 499)
    blocks = fmt.BlockStream()
    try:
        started = False
        async for delta in deltas(answer.first, stream, 1):
            o.add(delta)
            if not started:  # the first delta carries the prompt's token counts
                start = header.message([], None, None, {**_usage(o), "output_tokens": 0})
                yield fmt.event("message_start", {"message": start})
                started = True
            for piece in blocks.text(delta.text) if delta.text else []:
                yield piece
            for tool_piece in delta.tool_calls:
                for piece in blocks.call(tool_piece):
                    yield piece
        for piece in blocks.close():
            yield piece
        c = o.choice(0)
        stop = {"stop_reason": fmt.stop_reason(c.finish_reason, c.stop_sequence),
                "stop_sequence": c.stop_sequence}  # fmt: skip
        yield fmt.event("message_delta", {"delta": stop, "usage": _usage(o)})
        yield fmt.event("message_stop", {})
        status = ("ok", 200)
    except Exception as exc:
        err = ended_by(call, exc)
        status = (failure_status(call), err.status)
        yield err.sse("anthropic")
    finally:
        if status[1] == 499:  # the client went away: stop the engine's work
            stream.cancel()
        calls.end(call, *status)
