"""Stage 6, respond: the answer in the endpoint's shape, and the request ended once
(``Calls.end``: metrics, live latency, the ledger record) whichever way it ends —
complete, an engine error mid-stream, or the client gone. ``respond_generation``
writes chat and completions as one JSON body or as SSE (the common token from the
response's template, ``openai_format``); ``respond_embeddings`` the embedding list.
When a budget capped the completion, the choice that ran out says
``stop_reason: "budget_exhausted"``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from app.api.errors import ApiError
from app.api.flow import Call, Calls, ended_by
from app.api.openai_format import DONE, ResponseHeader, Usage, embedding_list, sse
from app.api.stages.dispatch import Vectors
from app.api.stages.route import Routed
from app.api.streaming import SettledStream
from app.dispatch.fallback import Answer
from app.dispatch.pools import PoolStream
from app.engine.protocol import GenerationDelta
from app.request import InferenceRequest, Outcome
from app.state.records import LedgerStatus

BUDGET_STOP = "budget_exhausted"
PREFIX = {"chat": "chatcmpl", "completion": "cmpl"}


async def respond_generation(
    call: Call, body: Any, routed: Routed, request: InferenceRequest, answer: Answer,
    calls: Calls,
) -> Response:  # fmt: skip
    assert call.admission is not None
    kind = request.endpoint
    assert kind == "chat" or kind == "completion"
    answered_by = request.adapter.id if request.adapter is not None else routed.decision.model
    header = ResponseHeader(kind, f"{PREFIX[kind]}-{call.rid}", int(time.time()), answered_by)
    headers = {**call.admission.headers(), **call.route_header()}
    if request.stream:
        events = _events(header, answer, call, calls, include_usage=request.include_usage)
        return SettledStream(
            events,
            on_close=lambda: never_streamed(call, calls),
            media_type="text/event-stream",
            headers=headers,
        )
    return await _collect(header, answer, call, calls, headers)


async def respond_embeddings(
    call: Call, body: Any, routed: Routed, request: InferenceRequest, answer: Vectors,
    calls: Calls,
) -> Response:  # fmt: skip
    assert call.admission is not None
    # Rendered before the request ends: a body JSON cannot carry (a NaN in a vector) is
    # this request's logged 500 (the pipeline maps it), not a bare one from the framework.
    body = embedding_list(
        answer.vectors, routed.decision.model, answer.prompt_tokens, body.encoding_format
    )
    response = JSONResponse(body, headers={**call.admission.headers(), **call.route_header()})
    calls.end(call, "ok", 200)
    return response


def _stop_reason(call: Call, finish_reason: str | None) -> str | None:
    a = call.admission
    if a is not None and a.capped and finish_reason == "length":
        return BUDGET_STOP
    return None


def never_streamed(call: Call, calls: Calls) -> None:
    """The client left after admission, before the response generator ran."""
    if call.stream is not None:
        call.stream.cancel()
    calls.end(call, "client_closed", 499)


async def deltas(
    first: GenerationDelta, stream: PoolStream, n: int
) -> AsyncIterator[GenerationDelta]:
    """The deltas until each of the ``n`` choices has its finish reason."""
    delta, finished = first, 0
    while True:
        yield delta
        finished += delta.finish_reason is not None
        if finished >= n:
            return
        delta = await stream.__anext__()


def failure_status(call: Call) -> LedgerStatus:
    return "cancelled" if call.cancelled else "error"


def _usage(o: Outcome) -> Usage:
    return Usage(o.prompt_tokens, o.completion_tokens, o.cached_tokens)


def _asked_logprobs(call: Call) -> bool:
    return call.request is not None and call.request.sampling.logprobs is not None


async def collect(answer: Answer, call: Call, calls: Calls) -> ApiError | None:
    """Read the whole answer into the outcome and end the request: None when it
    completed, else the error it ended with (a client that leaves: re-raised)."""
    o, stream = call.outcome, answer.stream
    n = call.request.n if call.request is not None else 1
    try:
        async for delta in deltas(answer.first, stream, n):
            o.add(delta)
    except asyncio.CancelledError:
        stream.cancel()
        calls.end(call, "client_closed", 499)
        raise
    except Exception as exc:
        err = ended_by(call, exc)
        calls.end(call, failure_status(call), err.status)
        return err
    calls.end(call, "ok", 200)
    return None


async def _collect(
    header: ResponseHeader, answer: Answer, call: Call, calls: Calls, headers: dict[str, str]
) -> Response:
    err = await collect(answer, call, calls)
    if err is not None:
        return err.response()
    o = call.outcome
    n = call.request.n if call.request is not None else 1
    asked = _asked_logprobs(call)
    choices = [
        header.choice(
            c.text,
            c.finish_reason or "stop",
            index=i,
            stop_reason=_stop_reason(call, c.finish_reason),
            logprobs=c.logprobs if asked else None,
            tool_calls=c.tool_calls,
        )
        for i, c in ((i, o.choice(i)) for i in range(n))
    ]
    body = header.response_of(choices, _usage(o))
    return JSONResponse(body, headers=headers)


async def _events(
    header: ResponseHeader, answer: Answer, call: Call, calls: Calls, *, include_usage: bool
) -> AsyncIterator[str]:
    call.streaming = True
    o, stream = call.outcome, answer.stream
    n = call.request.n if call.request is not None else 1
    status: tuple[LedgerStatus, int] = ("client_closed", 499)
    try:
        if header.kind == "chat":
            for i in range(n):
                yield sse(header.chunk("", role=True, index=i))
        asked = _asked_logprobs(call)
        offsets = [0] * n  # characters streamed so far per choice (text_offset)
        async for delta in deltas(answer.first, stream, n):
            o.add(delta)
            if (
                delta.text
                and delta.finish_reason is None
                and not delta.index
                and not delta.tool_calls
                and not asked
            ):  # the common token: its event from the response's template
                offsets[0] += len(delta.text)
                yield header.text_event(delta.text)
            elif delta.text or delta.tool_calls or delta.finish_reason is not None:
                finish = delta.finish_reason
                chunk = header.chunk(
                    delta.text or None,
                    finish,
                    stop_reason=_stop_reason(call, finish) if finish else None,
                    logprobs=delta.logprobs if asked else None,
                    offset=offsets[delta.index],
                    tool_calls=delta.tool_calls,
                    index=delta.index,
                )
                offsets[delta.index] += len(delta.text)
                yield sse(chunk)
        if include_usage:
            yield sse(header.usage_chunk(_usage(o)))
        yield DONE
        status = ("ok", 200)
    except Exception as exc:
        err = ended_by(call, exc)
        status = (failure_status(call), err.status)
        yield err.sse()
        yield DONE
    finally:
        if status[1] == 499:  # the client went away: stop the engine's work
            stream.cancel()
        calls.end(call, *status)
