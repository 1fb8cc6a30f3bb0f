"""The stored responses of the Responses API, kept by the gateway in the state store
(SQLite on one node, Redis across ingress replicas), so ``previous_response_id`` works
whichever replica answers.

Rule: a response is stored under its caller's tenant (another tenant's id reads as
absent: 404) as one ``StoredResponse``: the response object as served, this turn's input
items (``GET /v1/responses/{id}/input_items``), the chain's chat messages through this
answer (the next turn's history: one read, however long the chain) and the chain's
session. Parameters (``gateway.responses``): ``ttl_s``, how long it is kept;
``max_bytes``, the largest stored form — a larger one is served and not stored. A store
that cannot be reached within ``timeout_s`` fails the read (the request gets the store's
503) and leaves a write undone (the response says ``store: false``); the ledger record
is written either way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import ValidationError

from app.config import ResponsesConfig
from app.schema import Strict
from app.state.protocol import StateStore, StoreUnavailable

log = logging.getLogger(__name__)


class StoredResponse(Strict):
    id: str
    session_id: str  # the chain's (its first response's id, or the client's x-session-id)
    body: dict[str, Any]  # the response object as served
    input_items: list[dict[str, Any]]  # this turn's input, each item with its id
    context: list[dict[str, Any]]  # the chain's chat messages through this answer


class ResponseBook:
    def __init__(self, store: StateStore, config: ResponsesConfig, timeout_s: float) -> None:
        self._store = store
        self._config = config
        self._timeout_s = timeout_s

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's stored response (StoreUnavailable when the store is out of reach)."""
        data = await self._bounded(self._store.get_response(tenant, response_id))
        if data is None:
            return None
        try:
            return StoredResponse.model_validate_json(data)
        except ValidationError:  # written by another version: treated as absent
            log.warning("a stored response could not be read; treated as absent")
            return None

    async def save(self, tenant: str, stored: StoredResponse) -> bool:
        """Store it; False when it is over ``max_bytes`` or the store is out of reach."""
        data = stored.model_dump_json()
        size = len(data.encode())
        if size > self._config.max_bytes:
            log.info("response not stored: %d bytes over gateway.responses.max_bytes", size)
            return False
        try:
            await self._bounded(
                self._store.put_response(tenant, stored.id, data, self._config.ttl_s)
            )
        except StoreUnavailable as exc:
            log.warning("response not stored: %s", exc)
            return False
        return True

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self._bounded(self._store.delete_response(tenant, response_id)))

    async def _bounded(self, awaitable: Any) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self._timeout_s)
        except TimeoutError as exc:
            raise StoreUnavailable(f"state store: no answer within {self._timeout_s} s") from exc
