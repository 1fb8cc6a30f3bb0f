from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from app.api.middleware import (
    BodyTooLarge,
    client_request_id,
    incoming_request_id,
    read_body,
)

MARK = (b"x-switchyard-proxy", b"1")


@pytest.mark.parametrize(
    ("headers", "kept"),
    [
        ([MARK, (b"x-request-id", b"abc-123")], True),
        ([MARK, (b"x-request-id", b"a" * 128)], True),
        ([MARK, (b"x-request-id", b"a" * 129)], False),
        ([MARK, (b"x-request-id", b"has space")], False),
        ([MARK, (b"x-request-id", b"semi;colon")], False),
        ([(b"x-request-id", b"abc-123")], False),  # no proxy guard: never the client's id
    ],
    ids=["sane", "128", "129", "space", "semicolon", "unguarded"],
)
def test_incoming_request_id(headers: list[tuple[bytes, bytes]], kept: bool) -> None:
    rid = incoming_request_id({"headers": headers})
    sent = dict(headers)[b"x-request-id"].decode()
    assert (rid == sent) is kept
    assert len(rid) == 32 or kept


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"client-1", "client-1"), (b"bad id", None), (b"x" * 129, None), (None, None)],
)
def test_client_request_id(value: bytes | None, expected: str | None) -> None:
    headers = [] if value is None else [(b"x-client-request-id", value)]
    assert client_request_id({"headers": headers}) == expected


def test_fresh_request_ids_differ() -> None:
    assert incoming_request_id({"headers": []}) != incoming_request_id({"headers": []})


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
