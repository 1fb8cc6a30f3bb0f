"""``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and
``DELETE /v1/responses/{id}``: a caller's own stored responses (``app.responses``).

A response belongs to the caller's tenant: another tenant's id names a response the
caller does not have, so it gets 404 ``response_not_found`` (its existence is not
revealed), as does an expired or deleted one. ``input_items`` pages as OpenAI's does:
``order`` (``desc``, the default, or ``asc``), ``limit`` (1 to 100, default 20) and
``after`` (an item id).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.api.errors import ApiError, map_exception, rejection_reason, response_not_found
from app.api.request_id import incoming_request_id
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.responses.book import ResponseBook, StoredResponse


class ResponseRoutes:
    def __init__(self, gatekeeper: Gatekeeper, book: ResponseBook, metrics: GatewayMetrics) -> None:
        self._gatekeeper = gatekeeper
        self._book = book
        self._metrics = metrics

    async def _load(self, request: Request, response_id: str) -> tuple[str, StoredResponse]:
        caller, _ = await self._gatekeeper.identify(request.headers)
        found = await self._book.load(caller.tenant, response_id)
        if found is None:
            raise response_not_found(response_id)
        return caller.tenant, found

    async def show(self, request: Request, response_id: str) -> Response:
        try:
            _, found = await self._load(request, response_id)
            return JSONResponse(found.body)
        except Exception as exc:
            return self._error(exc, request)

    async def input_items(self, request: Request, response_id: str) -> Response:
        try:
            page = _Page.of(request.query_params)
            _, found = await self._load(request, response_id)
            return JSONResponse(page.of_items(found.input_items))
        except Exception as exc:
            return self._error(exc, request)

    async def delete(self, request: Request, response_id: str) -> Response:
        try:
            caller, _ = await self._gatekeeper.identify(request.headers)
            if not await self._book.delete(caller.tenant, response_id):
                raise response_not_found(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        except Exception as exc:
            return self._error(exc, request)

    def _error(self, exc: Exception, request: Request) -> Response:
        reason = rejection_reason(exc)
        if reason is not None:
            self._metrics.rejections.labels(reason).inc()
        return map_exception(exc, incoming_request_id(request.scope)).response()


class _Page:
    def __init__(self, order: str, limit: int, after: str | None) -> None:
        self.order, self.limit, self.after = order, limit, after

    @classmethod
    def of(cls, query: Any) -> _Page:
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "`order` is asc or desc.", param="order")
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise ApiError(400, "`limit` is a whole number from 1 to 100.", param="limit")
        return cls(order, limit, query.get("after"))

    def of_items(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        ordered = items if self.order == "asc" else items[::-1]
        if self.after is not None:
            ids = [i.get("id") for i in ordered]
            if self.after not in ids:
                raise ApiError(400, f"No input item `{self.after}` in this response.",
                               param="after")  # fmt: skip
            ordered = ordered[ids.index(self.after) + 1 :]
        data = ordered[: self.limit]
        return {"object": "list", "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(ordered) > self.limit}  # fmt: skip
