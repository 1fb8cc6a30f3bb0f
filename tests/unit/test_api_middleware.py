from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from app.api.middleware import BodyTooLarge, incoming_request_id, read_body


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (b"abc-123", True),
        (b"a" * 128, True),
        (b"a" * 129, False),
        (b"has space", False),
        (b"semi;colon", False),
    ],
)
def test_incoming_request_id(header: bytes, kept: bool) -> None:
    rid = incoming_request_id({"headers": [(b"x-request-id", header)]})
    assert (rid == header.decode()) is kept
    assert len(rid) >= 16 or kept


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
