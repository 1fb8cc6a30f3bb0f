from __future__ import annotations

import pytest
from ray.serve.exceptions import BackPressureError

from app.dispatch.pools import fallback_reason
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)
from app.upstream.openai_upstream import UpstreamStreamError, UpstreamUnavailable


class _Wrapped(Exception):
    """Ray's wrapper of a remote exception: the original is in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("remote")
        self.cause = cause


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (UpstreamUnavailable("status_503"), "upstream_status_503"),
        (UpstreamUnavailable("connect"), "upstream_connect"),
        (EngineOverloaded("full"), "overloaded"),
        (BackPressureError(num_queued_requests=1, max_queued_requests=1), "overloaded"),
        (EngineNotReady("starting"), "unavailable"),
        (ConnectionResetError(), "connection"),
        (_Wrapped(EngineOverloaded("full")), "overloaded"),
        # the client's fault, or too late to move: never retried elsewhere
        (InvalidRequest("bad"), None),
        (ContextLengthExceeded("long"), None),
        (UpstreamStreamError("mid-stream"), None),
        (ValueError("bug"), None),
    ],
)
def test_fallback_reason(exc: BaseException, reason: str | None) -> None:
    assert fallback_reason(exc) == reason
