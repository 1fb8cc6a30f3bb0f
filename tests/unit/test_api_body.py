"""Bad input never gets a 500: every row is a body the JSON parser or the schema must
answer with a 400 naming what is wrong (or, for the controls, accept)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.requests import Request

from app.api.body import MAX_DEPTH, BodyTooLarge, _validate, read_body
from app.api.errors import ApiError
from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from tests.loop import turns_during

MSG = '[{"role": "user", "content": "hi"}]'


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat(**fields: str) -> bytes:
    body = {"model": '"m"', "messages": MSG, **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}").encode()


def completion(**fields: str) -> bytes:
    body = {"model": '"m"', **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}").encode()


BIG = "9" * 5000
ROWS = [
    # name, schema, raw body, expected code, expected param (None = accepted)
    ("deep-top", ChatCompletionRequest, f'{{"x": {nested(10_000)}}}'.encode(), "invalid_json",
     None),
    ("deep-messages", ChatCompletionRequest, chat(messages=nested(10_000)), "invalid_json", None),
    ("deep-prompt", CompletionRequest, completion(prompt=nested(10_000)), "invalid_json", None),
    ("deep-input", EmbeddingRequest, completion(input=nested(10_000)), "invalid_json", None),
    ("deep-65", ChatCompletionRequest, chat(x=nested(MAX_DEPTH)), "invalid_json", None),
    ("surrogate-content", ChatCompletionRequest,
     chat(messages='[{"role": "user", "content": "a\\ud800b"}]'), "invalid_json", None),
    ("surrogate-low", ChatCompletionRequest,
     chat(messages='[{"role": "user", "content": "\\udc00"}]'), "invalid_json", None),
    ("surrogate-prompt", CompletionRequest, completion(prompt='"\\ud800"'), "invalid_json", None),
    ("surrogate-input", EmbeddingRequest, completion(input='["\\udbff"]'), "invalid_json", None),
    ("surrogate-key", ChatCompletionRequest, chat(**{"\\ud800": "1"}), "invalid_json", None),
    ("huge-int-max-tokens", ChatCompletionRequest, chat(max_tokens=BIG), "invalid_json", None),
    ("huge-int-seed", ChatCompletionRequest, chat(seed=BIG), "invalid_json", None),
    ("seed-2^64", ChatCompletionRequest, chat(seed=str(2**64)), "invalid_value", "seed"),
    ("seed-10^30", ChatCompletionRequest, chat(seed=str(10**30)), "invalid_value", "seed"),
    ("seed-below-int64", ChatCompletionRequest, chat(seed=str(-(2**63) - 1)), "invalid_value",
     "seed"),
    ("max-tokens-2^31", ChatCompletionRequest, chat(max_tokens=str(2**31)), "invalid_value",
     "max_tokens"),
    ("max-completion-2^40", ChatCompletionRequest, chat(max_completion_tokens=str(2**40)),
     "invalid_value", "max_completion_tokens"),
    ("token-id-2^64", CompletionRequest, completion(prompt=f"[1, {2**64}]"), "invalid_value",
     "prompt"),
    ("token-id-negative", CompletionRequest, completion(prompt="[-1]"), "invalid_value", "prompt"),
    ("stop-empty", ChatCompletionRequest, chat(stop='""'), "invalid_value", "stop"),
    ("stop-empty-in-list", ChatCompletionRequest, chat(stop='["a", ""]'), "invalid_value", "stop"),
    ("stop-huge", CompletionRequest, completion(prompt='"x"', stop=json.dumps("s" * 1025)),
     "invalid_value", "stop"),
    ("not-an-object", ChatCompletionRequest, b"[1, 2]", "invalid_json", None),
    ("not-json", ChatCompletionRequest, b"{nope", "invalid_json", None),
    ("not-utf8", ChatCompletionRequest, b'{"model": "\xff"}', "invalid_json", None),
]
ACCEPTED = [
    ("emoji-pair", ChatCompletionRequest,
     chat(messages='[{"role": "user", "content": "\\ud83d\\ude00"}]')),
    ("seed-int64-max", ChatCompletionRequest, chat(seed=str(2**63 - 1))),
    ("seed-negative", ChatCompletionRequest, chat(seed="-5")),
    ("token-id-int32-max", CompletionRequest, completion(prompt=f"[{2**31 - 1}]")),
    ("stop-normal", ChatCompletionRequest, chat(stop='["\\n", "END"]')),
    ("escaped-backslash-u", ChatCompletionRequest,
     chat(messages='[{"role": "user", "content": "\\\\ud800 is text"}]')),
]


@pytest.mark.parametrize(
    ("schema", "raw", "code", "param"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_bad_bodies_are_400(schema: type, raw: bytes, code: str, param: str | None) -> None:
    with pytest.raises(ApiError) as info:
        _validate(raw, schema)
    assert info.value.status == 400
    assert info.value.code == code
    assert info.value.param == param


@pytest.mark.parametrize(("schema", "raw"), [r[1:] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED])
def test_good_bodies_pass(schema: type, raw: bytes) -> None:
    assert isinstance(_validate(raw, schema), schema)


def test_nesting_at_the_limit_parses() -> None:
    data = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    raw = json.dumps(data)[:-1] + ', "metadata_probe": ' + nested(MAX_DEPTH - 1) + "}"
    with pytest.raises(ApiError) as info:  # under the limit: the schema, not the parser, refuses
        _validate(raw.encode(), ChatCompletionRequest)
    assert info.value.code == "invalid_value" and info.value.param == "metadata_probe"


async def test_a_large_body_is_parsed_off_the_event_loop() -> None:
    """While one tenant's 100,000-message body is parsed and validated, the loop keeps
    turning (other requests, /health): a ticker advances during the parse."""
    from starlette.requests import Request

    from app.api.body import parse_body

    messages = [{"role": "user", "content": f"message {i}"} for i in range(100_000)]
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    parsed, during = await turns_during(parse_body(request, ChatCompletionRequest, len(raw) + 1))
    assert len(parsed.messages) == 100_000
    assert during > 10  # on the loop the ticker could not have run at all


def _request(chunks: list[bytes], headers: dict[str, str]) -> Request:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope, receive)


async def test_read_body_within_limit() -> None:
    assert await read_body(_request([b"ab", b"cd"], {}), limit=4) == b"abcd"


async def test_declared_length_over_limit_is_refused_before_reading() -> None:
    with pytest.raises(BodyTooLarge):
        await read_body(_request([b"x"], {"content-length": "999"}), limit=10)


async def test_streamed_body_over_limit_is_refused() -> None:
    with pytest.raises(BodyTooLarge):
        await read_body(_request([b"x" * 6, b"y" * 6], {}), limit=10)
