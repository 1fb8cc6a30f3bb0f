"""The simulated server's error mapping and context check (app.bench.simrequests); the
HTTP-level error shapes are tested in test_bench_simserver."""

from __future__ import annotations

import json

import pytest

from app.bench.simrequests import HttpError, check_context_length, engine_error
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)


@pytest.mark.parametrize(
    ("exc", "status", "code", "retry"),
    [
        (EngineOverloaded("full"), 429, "rate_limit_exceeded", True),
        (ContextLengthExceeded("long"), 400, "context_length_exceeded", False),
        (InvalidRequest("bad"), 400, "invalid_value", False),
        (EngineNotReady("starting"), 503, "not_ready", True),
        (EngineError("boom"), 500, "internal_error", False),
    ],
)
def test_engine_errors_map_to_openai_statuses(
    exc: EngineError, status: int, code: str, retry: bool
) -> None:
    error = engine_error(exc)
    assert (error.status, error.body["error"]["code"]) == (status, code)
    assert error.body["error"]["message"] == str(exc)
    response = error.response()
    assert response.status_code == status
    assert json.loads(bytes(response.body)) == error.body
    assert (response.headers.get("retry-after") == "1") is retry


@pytest.mark.parametrize(
    ("prompt", "asked", "fits"),
    [(90, 10, True), (90, 11, False), (99, None, True), (100, None, False), (100, 0, False)],
)
def test_context_length_leaves_room_for_the_completion(
    prompt: int, asked: int | None, fits: bool
) -> None:
    if fits:
        check_context_length(prompt, asked, 100)
        return
    with pytest.raises(HttpError) as info:
        check_context_length(prompt, asked, 100)
    assert info.value.status == 400
    assert info.value.body["error"]["code"] == "context_length_exceeded"
    assert f"requested {prompt + (asked or 0)} tokens ({prompt} in the prompt" in str(info.value)
