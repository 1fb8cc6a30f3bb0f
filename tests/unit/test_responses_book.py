"""The stored responses (app/responses/book.py): what is kept, what is too large, and a
store out of reach (a read fails with StoreUnavailable; a write is left undone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ResponsesConfig
from app.responses.book import ResponseBook, StoredResponse
from app.state.protocol import StoreUnavailable
from app.state.sqlite_store import SqliteStore


def stored(rid: str = "resp_1", text: str = "hi") -> StoredResponse:
    return StoredResponse(id=rid, session_id=rid, body={"id": rid}, input_items=[],
                          context=[{"role": "user", "content": text}])  # fmt: skip


async def test_a_response_is_kept_per_tenant_and_a_larger_one_is_not(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    book = ResponseBook(store, ResponsesConfig(max_bytes=1024), timeout_s=1.0)
    assert await book.save("acme", stored())
    assert await book.load("acme", "resp_1") == stored()
    assert await book.load("globex", "resp_1") is None
    assert not await book.save("acme", stored("resp_2", "x" * 1024))
    assert await book.load("acme", "resp_2") is None
    assert await book.delete("acme", "resp_1") and await book.load("acme", "resp_1") is None
    await store.close()


async def test_an_unreadable_record_reads_as_absent(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.put_response("acme", "resp_1", '{"id": "resp_1"}', 60)
    book = ResponseBook(store, ResponsesConfig(), timeout_s=1.0)
    assert await book.load("acme", "resp_1") is None
    await store.close()


class Down:
    async def get_response(self, tenant: str, response_id: str) -> str | None:
        raise StoreUnavailable("down")

    async def put_response(self, tenant: str, response_id: str, data: str, ttl_s: float) -> None:
        raise StoreUnavailable("down")


async def test_a_store_out_of_reach_fails_the_read_and_skips_the_write() -> None:
    book = ResponseBook(Down(), ResponsesConfig(), timeout_s=1.0)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await book.load("acme", "resp_1")
    assert not await book.save("acme", stored())
