"""The stored responses of ``RedisStore`` (the rules are in ``app.state.protocol``): one
string per response, ``ns:{T}:response:<id>`` (the tenant's hash tag), written with
``SET EX`` so Redis expires it."""

from __future__ import annotations

import math
from typing import Any


class RedisResponses:
    """Mixed into ``RedisStore``, which provides the connection and key helpers."""

    _redis: Any

    def _tk(self, tenant: str, *parts: str) -> str:
        raise NotImplementedError

    async def _call(self, what: str, awaitable: Any) -> Any:
        raise NotImplementedError

    async def put_response(self, tenant: str, response_id: str, data: str, ttl_s: float) -> None:
        key = self._tk(tenant, "response", response_id)
        await self._call("put response", self._redis.set(key, data, ex=max(1, math.ceil(ttl_s))))

    async def get_response(self, tenant: str, response_id: str) -> str | None:
        key = self._tk(tenant, "response", response_id)
        data = await self._call("get response", self._redis.get(key))
        return None if data is None else str(data)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        key = self._tk(tenant, "response", response_id)
        return bool(await self._call("delete response", self._redis.delete(key)))
