"""The evaluation runner: every item of the chosen sets through the public chat API of
one model (``POST /v1/chat/completions``: a local pool or an upstream one, whatever the
routes file says), greedy (temperature 0), not streamed, at most ``concurrency`` at once,
each graded as it returns (``graders.grade``).

A request is the item's messages (its set's system prompt, then the prompt) with the
set's ``max_tokens``; a JSON item adds ``response_format: json_schema`` (strict) with its
schema, a tool item its tools and ``tool_choice``. An answer of 429 or 503 is retried
after its Retry-After (at most ``MAX_RETRY_AFTER_S``), up to ``RETRIES`` times; any other
error, a transport failure or a 200 that is not a chat completion is the item's answer
(failure class ``error``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.eval.graders import Answer, ToolCall, Verdict, grade
from app.eval.sets import EvalSet, Item

RETRIES = 3
MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True)
class Result:
    layer: str
    item: str
    kind: str
    verdict: Verdict
    answer: Answer
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


def request_body(eval_set: EvalSet, item: Item, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": eval_set.messages(item),
        "max_tokens": eval_set.max_tokens,
        "temperature": 0,
    }
    if item.json_schema is not None:
        schema = eval_set.schemas[item.json_schema]
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": item.json_schema, "schema": schema, "strict": True},
        }
    if item.tools:
        body["tools"] = [
            {"type": "function", "function": {"name": name, **eval_set.tools[name].model_dump()}}
            for name in item.tools
        ]
        body["tool_choice"] = item.tool_choice
    return body


def parse_answer(payload: dict[str, Any]) -> tuple[Answer, int, int]:
    """The first choice of a chat completion, and its usage."""
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(c["function"]["name"], c["function"].get("arguments") or "")
        for c in message.get("tool_calls") or ()
    )
    usage = payload.get("usage") or {}
    answer = Answer(message.get("content") or "", calls, choice.get("finish_reason"))
    return answer, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def retry_after_s(value: str | None) -> float:
    """Seconds to wait: the header's seconds, within [0, MAX_RETRY_AFTER_S]; 1 when it
    is absent or not a number (an HTTP date)."""
    try:
        wait = float(value) if value else 1.0
    except ValueError:
        wait = 1.0
    return min(MAX_RETRY_AFTER_S, max(0.0, wait))


def _error(response: httpx.Response) -> str:
    try:
        err = response.json()["error"]
        return f"{response.status_code} {err.get('code') or err.get('type')}: {err['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.text[:200]}"


async def ask(
    client: httpx.AsyncClient,
    eval_set: EvalSet,
    item: Item,
    model: str,
    headers: dict[str, str] | None = None,
) -> tuple[Answer, int, int]:
    body = request_body(eval_set, item, model)
    for attempt in range(RETRIES + 1):
        try:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            return Answer(error=f"transport: {type(exc).__name__}"), 0, 0
        if response.status_code in (429, 503) and attempt < RETRIES:
            await asyncio.sleep(retry_after_s(response.headers.get("retry-after")))
            continue
        if response.status_code != 200:
            return Answer(error=_error(response)), 0, 0
        try:
            return parse_answer(response.json())
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return Answer(error=f"not a chat completion: {type(exc).__name__}"), 0, 0
    raise AssertionError("unreachable")


async def run(
    client: httpx.AsyncClient,
    sets: Sequence[EvalSet],
    model: str,
    concurrency: int = 4,
    limit: int | None = None,
    progress: Callable[[Result], None] | None = None,
    id_prefix: str | None = None,
) -> list[Result]:
    """Every item (the first ``limit`` of each set), graded, in the sets' order. With
    ``id_prefix`` each request carries ``x-client-request-id: <prefix>.<set>.<item>``, so
    its ledger record can be found (``client_request_id``)."""
    gate = asyncio.Semaphore(concurrency)
    work = [(s, i) for s in sets for i in (s.items[:limit] if limit else s.items)]

    async def one(eval_set: EvalSet, item: Item) -> Result:
        async with gate:
            started = time.monotonic()
            headers = None
            if id_prefix is not None:
                headers = {"x-client-request-id": f"{id_prefix}.{eval_set.set}.{item.id}"}
            answer, prompt, completion = await ask(client, eval_set, item, model, headers)
            result = Result(
                eval_set.set,
                item.id,
                item.kind,
                grade(eval_set, item, answer),
                answer,
                time.monotonic() - started,
                prompt,
                completion,
            )
        if progress is not None:
            progress(result)
        return result

    return list(await asyncio.gather(*(one(s, i) for s, i in work)))
