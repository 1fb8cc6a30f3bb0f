from __future__ import annotations

import pytest

from app.api.request_id import client_request_id, incoming_request_id

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
