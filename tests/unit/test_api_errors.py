from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import pytest
from pydantic import ValidationError
from ray.serve.exceptions import BackPressureError

from app.api.errors import (
    ApiError,
    LastResort,
    error_class,
    from_validation_error,
    map_exception,
    model_not_found,
    origin,
)
from app.api.protocol import ChatCompletionRequest
from app.dispatch.pools import AttemptsExhausted
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)
from app.routing.table import NoRouteFits, WrongEndpoint
from tests.log_helpers import errors, json_lines


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
        # the route decision's refusals
        (WrongEndpoint("e", "e", "embed", "chat"), 400, "model_not_supported_for_endpoint",
         "model"),
        (NoRouteFits("auto", {"m": "context: too long"}), 400, "no_route_fits", "model"),
    ],
)  # fmt: skip
def test_map_exception(exc: BaseException, status: int, code: str, param: str | None) -> None:
    err = map_exception(exc, "rid-1", prompt_param="prompt")
    assert (err.status, err.code, err.param) == (status, code, param)
    if status == 503:
        assert err.headers["Retry-After"].isdigit()


@pytest.mark.parametrize(
    ("status", "retry_after_s", "want_status", "want_type", "want_retry"),
    [
        (503, None, 503, "server_error", "1"),  # Ray's default: the gateway's Retry-After
        (429, 2.5, 429, "rate_limit_error", "3"),  # a pool's `backpressure` (ceil)
        (503, 5.0, 503, "server_error", "5"),
    ],
)
def test_a_full_pool_queue_answers_with_its_backpressure_config(
    status: int, retry_after_s: float | None, want_status: int, want_type: str, want_retry: str
) -> None:
    exc = BackPressureError(3, 2, status_code=status, retry_after_s=retry_after_s)
    err = map_exception(_RayStyleWrapper(exc), "rid-2")
    assert (err.status, err.type, err.code) == (want_status, want_type, "overloaded")
    assert err.headers["Retry-After"] == want_retry


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


def _boom() -> None:
    raise KeyError("password=hunter2")


BOOM_LINE = inspect.getsourcelines(_boom)[1] + 1


class _RemoteError(Exception):
    """Like Ray's ``RayTaskError.as_instanceof_cause()``: the cause came over the wire
    (no frames of its own) and the remote traceback is text."""

    def __init__(self, cause: BaseException, traceback_str: str) -> None:
        super().__init__("remote")
        self.cause = cause
        self.traceback_str = traceback_str


REMOTE_TB = """Traceback (most recent call last):
  File "/srv/.venv/lib/python3.11/site-packages/ray/serve/_private/replica.py", line 10, in call
    return await method(*args)
  File "/srv/app/serving/llm_server.py", line 362, in embed
    return await self._engine.embed(inputs)
ValueError: bad
"""


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_error_class_and_origin() -> None:
    try:
        _boom()
    except KeyError as exc:
        assert error_class(exc) == "KeyError"
        assert origin(exc) == f"{__name__}:_boom:{BOOM_LINE}"
    remote = _raised(_RemoteError(ValueError("bad"), REMOTE_TB))
    assert error_class(remote) == "ValueError"
    assert origin(remote) == "/srv/app/serving/llm_server.py:embed:362"
    assert error_class(EngineOverloaded("x")) == "app.engine.protocol.EngineOverloaded"
    assert origin(RuntimeError("never raised")) == "unknown"


def test_an_internal_error_is_logged_once_with_its_class_and_place() -> None:
    with json_lines() as lines:
        try:
            _boom()
        except KeyError as exc:
            err = map_exception(AttemptsExhausted(exc, ["a:connection"]), "rid-7")
    assert err.status == 500 and "hunter2" not in json.dumps(err.body())
    (line,) = errors(lines)
    assert line["request_id"] == "rid-7" and line["error"] == "KeyError"
    assert line["where"] == f"{__name__}:_boom:{BOOM_LINE}"
    assert "hunter2" in line["exc"]  # the log keeps the detail the client does not get


def test_mapped_refusals_log_no_error() -> None:
    with json_lines() as lines:
        map_exception(EngineOverloaded("full"), "r")
        map_exception(WrongEndpoint("e", "e", "embed", "chat"), "r")
    assert errors(lines) == []


# ---- LastResort: what escapes a handler ------------------------------------------------


Sent = list[dict[str, Any]]


async def _drive(app: Any, rid: bytes = b"rid-55") -> tuple[Sent, BaseException | None]:
    sent: Sent = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings",
             "headers": [(b"x-switchyard-proxy", b"1"), (b"x-request-id", rid)]}  # fmt: skip
    try:
        await LastResort(app)(scope, receive, send)
    except Exception as exc:
        return sent, exc
    return sent, None


async def test_an_exception_that_escaped_a_handler_is_a_logged_json_500() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        _boom()

    with json_lines() as lines:
        sent, raised = await _drive(app)
    assert raised is None
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 500
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == "internal_error" and "rid-55" in body["error"]["message"]
    assert "hunter2" not in sent[1]["body"].decode()
    (line,) = errors(lines)
    assert (line["request_id"], line["error"]) == ("rid-55", "KeyError")
    assert line["where"] == f"{__name__}:_boom:{BOOM_LINE}"


async def test_after_the_response_began_it_is_logged_and_re_raised() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        _boom()

    with json_lines() as lines:
        sent, raised = await _drive(app)
    assert isinstance(raised, KeyError)
    assert [m["type"] for m in sent] == ["http.response.start"]  # nothing sent after
    assert len(errors(lines)) == 1


async def test_a_mapped_exception_keeps_its_status_and_a_cancel_passes() -> None:
    async def refused(scope: Any, receive: Any, send: Any) -> None:
        raise EngineOverloaded("full")

    sent, _ = await _drive(refused)
    assert sent[0]["status"] == 503

    async def cancelled(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await _drive(cancelled)
