"""Stage 6, respond, for the Responses endpoint: the answer as one response object or as
the Responses event stream (``app.api.responses_format``), stored for the chain when the
request asked (``store``, the default; ``app.responses``), and the request ended once
(``Calls.end``) whichever way it ends, as ``respond_generation`` does for chat.

Order at the end: the request is ended first (its ledger record), then the response is
stored, then the client gets it (the ``response.completed`` event) — so a client that
continues the chain at once finds the response stored. A response that could not be
stored says ``store: false``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from app.api import responses_format as fmt
from app.api.flow import Call, Calls, ended_by
from app.api.responses_protocol import chat_messages, parse_item
from app.api.stages.parse import Turn
from app.api.stages.respond import (
    BUDGET_STOP,
    collect,
    deltas,
    failure_status,
    never_streamed,
)
from app.api.stages.route import Routed
from app.api.streaming import SettledStream
from app.dispatch.fallback import Answer
from app.request import InferenceRequest, Outcome
from app.responses.book import ResponseBook, StoredResponse
from app.state.records import LedgerStatus


def _usage(o: Outcome) -> dict[str, Any]:
    return fmt.usage(o.prompt_tokens, o.completion_tokens, o.cached_tokens)


def _status(call: Call) -> tuple[str, str | None]:
    """The response's status, and ``budget_exhausted`` where its token limit was a
    budget's allowance (as chat's ``stop_reason``)."""
    if not fmt.incomplete(call.outcome.choice(0).finish_reason):
        return "completed", None
    capped = call.admission is not None and call.admission.capped
    return "incomplete", BUDGET_STOP if capped else None


async def respond_responses(
    call: Call, turn: Turn, routed: Routed, request: InferenceRequest, answer: Answer,
    calls: Calls, *, book: ResponseBook,
) -> Response:  # fmt: skip
    assert call.admission is not None
    answered_by = request.adapter.id if request.adapter is not None else routed.decision.model
    header = fmt.ResponseHeader(f"resp_{call.rid}", int(time.time()), answered_by, turn.body)
    headers = {**call.admission.headers(), **call.route_header()}
    if request.stream:
        return SettledStream(
            _events(header, turn, answer, call, calls, book),
            on_close=lambda: never_streamed(call, calls),
            media_type="text/event-stream",
            headers=headers,
        )
    err = await collect(answer, call, calls)
    if err is not None:
        return err.response()
    c = call.outcome.choice(0)
    output = fmt.output_items(call.rid, c.text, c.tool_calls)
    stored = await _store(header, turn, output, _status(call), _usage(call.outcome), book)
    return JSONResponse(stored, headers=headers)


async def _store(
    header: fmt.ResponseHeader, turn: Turn, output: list[dict[str, Any]],
    status: tuple[str, str | None], use: dict[str, Any], book: ResponseBook,
) -> dict[str, Any]:  # fmt: skip
    """The response object, stored when the request asked: ``store`` says whether it was."""
    body = header.response(status[0], output, use, stored=False, reason=status[1])
    if not turn.body.store:
        return body
    items = turn.body.items()
    inputs = [_with_id(i.model_dump(exclude_none=True), f"{header.id}_in{n}")
              for n, i in enumerate(items)]  # fmt: skip
    context = turn.history + chat_messages(items + [parse_item(o) for o in output])
    body["store"] = True
    stored = StoredResponse(id=header.id, session_id=turn.session_id or header.id, body=body,
                            input_items=inputs, context=context)  # fmt: skip
    body["store"] = await book.save(turn.tenant, stored)
    return body


def _with_id(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """An input item as ``input_items`` lists it: typed, with an id, text as parts."""
    item = {"id": item_id, **item}
    if item.get("type", "message") == "message":
        item["type"] = "message"
        if isinstance(item["content"], str):
            item["content"] = [{"type": "input_text", "text": item["content"]}]
        item.setdefault("status", "completed")
    return item


async def _events(
    header: fmt.ResponseHeader, turn: Turn, answer: Answer, call: Call, calls: Calls,
    book: ResponseBook,
) -> AsyncIterator[str]:  # fmt: skip
    call.streaming = True
    o, stream = call.outcome, answer.stream
    status: tuple[LedgerStatus, int] = ("client_closed", 499)
    items = fmt.ItemStream(call.rid)
    ended = False
    try:
        start = header.response("in_progress", [], None)
        yield items.event("response.created", {"response": start})
        yield items.event("response.in_progress", {"response": start})
        async for delta in deltas(answer.first, stream, 1):
            o.add(delta)
            for piece in items.text(delta.text) if delta.text else []:
                yield piece
            for tool_piece in delta.tool_calls:
                for piece in items.call(tool_piece):
                    yield piece
        for piece in items.finish():
            yield piece
        status = ("ok", 200)
        calls.end(call, *status)
        ended = True
        done = _status(call)
        body = await _store(header, turn, items.items, done, _usage(o), book)
        yield items.event(f"response.{done[0]}", {"response": body})
    except Exception as exc:
        if ended:
            raise
        err = ended_by(call, exc)
        status = (failure_status(call), err.status)
        error = {"code": err.code or err.type, "message": err.message}
        failed = header.response("failed", items.items, _usage(o), stored=False, error=error)
        yield items.event("response.failed", {"response": failed})
    finally:
        if not ended:
            if status[1] == 499:  # the client went away: stop the engine's work
                stream.cancel()
            calls.end(call, *status)
