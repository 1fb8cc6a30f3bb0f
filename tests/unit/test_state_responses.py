"""The stored-response part of the StateStore contract (app/state/protocol.py), on both
backends: per tenant, replaced by a second write, deleted once, gone after its TTL."""

from __future__ import annotations

import asyncio

from app.state.protocol import StateStore
from tests.unit import test_state_contract as contract

store = contract.store  # the contract's fixtures: both backends


async def test_a_response_is_read_back_only_by_its_tenant(store: StateStore) -> None:
    await store.put_response("acme", "resp_1", '{"n": 1}', 60)
    assert await store.get_response("acme", "resp_1") == '{"n": 1}'
    assert await store.get_response("globex", "resp_1") is None
    assert await store.get_response("acme", "resp_2") is None
    await store.put_response("acme", "resp_1", '{"n": 2}', 60)  # a write replaces
    assert await store.get_response("acme", "resp_1") == '{"n": 2}'


async def test_a_response_is_deleted_once_and_only_by_its_tenant(store: StateStore) -> None:
    await store.put_response("acme", "resp_1", "{}", 60)
    assert not await store.delete_response("globex", "resp_1")
    assert await store.delete_response("acme", "resp_1")
    assert not await store.delete_response("acme", "resp_1")
    assert await store.get_response("acme", "resp_1") is None


async def test_a_response_expires_after_its_ttl(store: StateStore) -> None:
    await store.put_response("acme", "short", "{}", 1)
    await store.put_response("acme", "long", "{}", 60)
    await asyncio.sleep(1.2)
    assert await store.get_response("acme", "short") is None
    assert not await store.delete_response("acme", "short")
    assert await store.get_response("acme", "long") == "{}"
