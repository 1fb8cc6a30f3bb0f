"""The runner's requests and answers (app.eval.runner): what each kind of item sends,
how an answer is read, 429/503 retried after Retry-After, other errors kept as the
item's answer. The HTTP side is httpx's MockTransport; the runner against a real
gateway is tests/integration/test_eval.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.eval.runner import request_body, retry_after_s, run
from app.eval.sets import load

SERVICE = load("service")


def by_id(item_id: str) -> Any:
    return next(i for i in SERVICE.items if i.id == item_id)


def test_what_each_kind_sends() -> None:
    json_item = request_body(SERVICE, by_id("sv-001"), "m")
    assert json_item["response_format"]["type"] == "json_schema"
    assert json_item["response_format"]["json_schema"]["schema"] == SERVICE.schemas["person"]
    assert (json_item["temperature"], json_item["max_tokens"]) == (0, SERVICE.max_tokens)
    assert [m["role"] for m in json_item["messages"]] == ["system", "user"]
    tool = request_body(SERVICE, by_id("sv-022"), "m")
    assert tool["tool_choice"] == "required"
    assert [t["function"]["name"] for t in tool["tools"]] == ["get_weather"]
    assert tool["tools"][0]["function"]["parameters"]["required"] == ["city"]
    plain = request_body(load("general"), load("general").items[0], "m")
    assert "tools" not in plain and "response_format" not in plain
    assert plain["messages"] == [{"role": "user", "content": "What is the capital of France?"}]


def completion(content: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": "c1", "type": "function", "function": c} for c in calls]
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3},
    }


async def test_answers_are_graded_and_429_is_retried_after_its_retry_after() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = body["messages"][-1]["content"]
        seen.append(prompt)
        if "Alice" in prompt and seen.count(prompt) == 1:
            return httpx.Response(
                429,
                headers={"retry-after": "0"},
                json={"error": {"message": "slow down", "code": "rate"}},
            )
        if "Alice" in prompt:
            return httpx.Response(200, json=completion('{"name": "Alice", "age": 30}'))
        if "Paris right now" in prompt:
            call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            return httpx.Response(200, json=completion(None, [call]))
        return httpx.Response(
            400,
            json={
                "error": {
                    "message": "bad",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
        )

    done: list[str] = []
    async with httpx.AsyncClient(base_url="http://t", transport=httpx.MockTransport(handler)) as c:
        sub = SERVICE.model_copy(
            update={"items": [by_id("sv-001"), by_id("sv-018"), by_id("sv-035")]}
        )
        results = await run(c, [sub], "m", concurrency=2, progress=lambda r: done.append(r.item))
    assert [r.item for r in results] == ["sv-001", "sv-018", "sv-035"]
    assert sorted(done) == ["sv-001", "sv-018", "sv-035"]
    alice, weather, poem = results
    assert alice.verdict.ok and (alice.prompt_tokens, alice.completion_tokens) == (11, 3)
    assert weather.verdict.ok and weather.answer.tool_calls[0].name == "get_weather"
    assert (poem.verdict.failure, poem.answer.error) == ("error", "400 invalid_request_error: bad")
    assert seen.count(by_id("sv-001").prompt) == 2  # the 429, then the answer


async def test_a_transport_failure_is_the_items_answer_and_limit_cuts_each_set() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with httpx.AsyncClient(base_url="http://t", transport=httpx.MockTransport(handler)) as c:
        results = await run(c, [load("general"), load("korean")], "m", limit=2)
    assert [r.item for r in results] == ["gk-001", "gk-002", "ko-001", "ko-002"]
    assert {(r.verdict.failure, r.answer.error) for r in results} == {
        ("error", "transport: ConnectError")
    }


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, 1.0), ("", 1.0), ("0", 0.0), ("2.5", 2.5), ("999", 30.0), ("-3", 0.0),
     ("Wed, 21 Oct 2026 07:28:00 GMT", 1.0)],
)  # fmt: skip
def test_retry_after(header: str | None, seconds: float) -> None:
    assert retry_after_s(header) == seconds


async def test_a_200_that_is_not_a_chat_completion_is_an_error_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": []})

    async with httpx.AsyncClient(base_url="http://t", transport=httpx.MockTransport(handler)) as c:
        (result,) = await run(c, [load("general")], "m", limit=1)
    assert (result.verdict.failure, result.answer.error) == (
        "error",
        "not a chat completion: KeyError",
    )


@pytest.mark.parametrize(
    ("prefix", "want"),
    [(None, [None, None]), ("arm-a", ["arm-a.general.gk-001", "arm-a.general.gk-002"])],
)
async def test_an_id_prefix_names_each_request_for_the_ledger(
    prefix: str | None, want: list[str | None]
) -> None:
    ids: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ids.append(request.headers.get("x-client-request-id"))
        return httpx.Response(200, json=completion("Paris"))

    async with httpx.AsyncClient(base_url="http://t", transport=httpx.MockTransport(handler)) as c:
        await run(c, [load("general")], "m", concurrency=1, limit=2, id_prefix=prefix)
    assert ids == want
