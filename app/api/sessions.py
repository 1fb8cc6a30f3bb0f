"""``GET /v1/sessions/{id}`` and ``POST /v1/sessions/{id}/cancel``: a caller's own agent
sessions (``app.sessions``).

A session belongs to the caller's tenant: another tenant's session id names a session
the caller does not have, so it gets 404 ``session_not_found`` (its existence is not
revealed). Cancelling answers at once; the calls in flight end on every replica as the
cancel reaches them (``app.sessions.book``).
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.api.errors import map_exception, rejection_reason, session_not_found
from app.api.request_id import incoming_request_id
from app.gateway.gatekeeper import Gatekeeper
from app.observability.metrics import GatewayMetrics
from app.sessions.book import SessionBook

log = logging.getLogger(__name__)


class SessionRoutes:
    def __init__(self, gatekeeper: Gatekeeper, book: SessionBook, metrics: GatewayMetrics) -> None:
        self._gatekeeper = gatekeeper
        self._book = book
        self._metrics = metrics

    async def show(self, request: Request, session_id: str) -> Response:
        try:
            caller, _ = await self._gatekeeper.identify(request.headers)
            found = await self._book.tally(caller.tenant, session_id)
            if found is None:
                raise session_not_found(session_id)
            return JSONResponse(found.to_json())
        except Exception as exc:
            return self._error(exc, request)

    async def cancel(self, request: Request, session_id: str) -> Response:
        try:
            caller, _ = await self._gatekeeper.identify(request.headers)
            if not await self._book.cancel(caller.tenant, session_id):
                raise session_not_found(session_id)
            log.info("session cancelled by tenant %s", caller.tenant)
            found = await self._book.tally(caller.tenant, session_id)
            assert found is not None
            return JSONResponse(found.to_json())
        except Exception as exc:
            return self._error(exc, request)

    def _error(self, exc: Exception, request: Request) -> Response:
        reason = rejection_reason(exc)
        if reason is not None:
            self._metrics.rejections.labels(reason).inc()
        return map_exception(exc, incoming_request_id(request.scope)).response()
