"""The request id: one key per request, from the proxy guard or made here.

The proxy guard (``app.api.proxy_guard``, inside Ray Serve's HTTP proxy) gives every
request a fresh gateway id in ``x-request-id``, which Ray echoes on the response; the
ingress uses that id as the one key of the response id, logs, engine request ids and
the ledger record. Without the guard the ingress makes its own id (and warns once):
a client's id is never trusted to be unique.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.types import Scope

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
CLIENT_REQUEST_ID_HEADER = "x-client-request-id"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_warned = False


def incoming_request_id(scope: Scope) -> str:
    """The gateway id the proxy guard set, else a fresh one."""
    global _warned
    guarded = False
    rid: str | None = None
    for name, value in scope.get("headers", []):
        if name == b"x-switchyard-proxy":
            guarded = True
        elif name == b"x-request-id" and rid is None:
            candidate = value.decode("latin-1")
            rid = candidate if _VALID_ID.match(candidate) else None
    if guarded and rid is not None:
        return rid
    if not _warned:
        _warned = True
        log.warning(
            "the proxy guard is not installed (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH="
            "app.api.proxy_guard:middlewares): request ids are made by the ingress"
        )
    return uuid.uuid4().hex


def client_request_id(scope: Scope) -> str | None:
    """The client's own request id, when the proxy guard kept it (a sane token)."""
    for name, value in scope.get("headers", []):
        if name == b"x-client-request-id":
            candidate = value.decode("latin-1")
            return candidate if _VALID_ID.match(candidate) else None
    return None
