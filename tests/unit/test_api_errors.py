from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from ray.serve.exceptions import BackPressureError

from app.api.errors import (
    ApiError,
    from_validation_error,
    map_exception,
    model_not_found,
)
from app.api.protocol import ChatCompletionRequest
from app.dispatch.pools import AttemptsExhausted
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)


class _RayStyleWrapper(Exception):
    """Like Ray's RayTaskError when it cannot subclass the cause: the cause is kept."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("wrapped")
        self.cause = cause


@pytest.mark.parametrize(
    ("exc", "status", "code", "param"),
    [
        (ContextLengthExceeded("too long"), 400, "context_length_exceeded", "prompt"),
        (InvalidRequest("no"), 400, "invalid_value", None),
        (EngineOverloaded("full"), 503, "overloaded", None),
        (BackPressureError(num_queued_requests=3, max_queued_requests=2), 503, "overloaded", None),
        (EngineNotReady("starting"), 503, "overloaded", None),
        (_RayStyleWrapper(EngineOverloaded("full")), 503, "overloaded", None),
        (_RayStyleWrapper(ContextLengthExceeded("x")), 400, "context_length_exceeded", "prompt"),
        # queued past the dispatch deadline (found by `switchyard bench` at 128 users)
        (TimeoutError(), 503, "overloaded", None),
        (AttemptsExhausted(TimeoutError(), ["simulated-llm:timeout"]), 503, "overloaded", None),
        (RuntimeError("secret internal detail"), 500, "internal_error", None),
    ],
)
def test_map_exception(exc: BaseException, status: int, code: str, param: str | None) -> None:
    err = map_exception(exc, "rid-1", prompt_param="prompt")
    assert (err.status, err.code, err.param) == (status, code, param)
    if status == 503:
        assert err.headers["Retry-After"].isdigit()


def test_internal_error_hides_the_exception_text() -> None:
    err = map_exception(RuntimeError("password=hunter2 at /srv/app.py:12"), "rid-9")
    text = json.dumps(err.body())
    assert "hunter2" not in text and "app.py" not in text
    assert "rid-9" in text
    assert err.type == "server_error"


def test_api_error_passes_through_unchanged() -> None:
    original = model_not_found("m")
    assert map_exception(original, "r") is original


def test_body_has_the_four_fields() -> None:
    body = ApiError(400, "bad", param="x", code="y").body()
    assert body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": "y"}
    }


def test_sse_error_event_is_one_data_line() -> None:
    event = ApiError(500, "boom", type="server_error").sse()
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[6:])["error"]["message"] == "boom"


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"model": "m"}, "messages", "Field required"),
        ({"model": "m", "messages": [], "extra_thing": 1}, "messages", None),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "zzz": 1},
            "zzz",
            "Unrecognized",
        ),
        ({"model": "m", "messages": [{"role": "bad", "content": "x"}]}, "messages[0].role", None),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p", None),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": 3}, "stop", None),
    ],
)
def test_validation_error_names_the_param(
    body: dict[str, object], param: str, needle: str | None
) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    err = from_validation_error(info.value)
    assert err.status == 400
    assert err.param == param
    if needle:
        assert needle in err.message


@pytest.mark.parametrize(
    ("reason", "type_", "code"),
    [
        ("requests", "requests", "rate_limit_exceeded"),
        ("tokens", "tokens", "rate_limit_exceeded"),
        ("concurrency", "requests", "rate_limit_exceeded"),
        ("budget", "insufficient_quota", "insufficient_quota"),
    ],
)
def test_layer1_refusals_are_429_in_openai_shape(reason: str, type_: str, code: str) -> None:
    from app.gateway.admission import Refused

    headers = {"Retry-After": "2", "x-ratelimit-remaining-requests": "0"}
    err = map_exception(Refused(reason, 2.0, headers), "rid")
    assert (err.status, err.type, err.code) == (429, type_, code)
    assert err.headers == headers
