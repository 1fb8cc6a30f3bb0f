"""Request plumbing: the request id and the request-body size limit.

Ray Serve's HTTP proxy already honours an incoming ``x-request-id`` (or makes one),
puts it in the request headers and echoes it on the response; the gateway reuses
that id (when it is sane) for response ids and logs rather than adding a second one.
"""

from __future__ import annotations

import re
import uuid

from starlette.requests import Request
from starlette.types import Scope

REQUEST_ID_HEADER = "x-request-id"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def incoming_request_id(scope: Scope) -> str:
    """The caller's request id when it is sane, else a fresh one."""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            if _VALID_ID.match(candidate):
                return candidate
            break
    return uuid.uuid4().hex


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"body exceeds {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing early when it is (or grows) over ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
