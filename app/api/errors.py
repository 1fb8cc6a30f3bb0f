"""The one error mapper: every failure leaves the API as
``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status (on the
Anthropic Messages endpoint, the same error in Anthropic's shape: ``Dialect``).

Internal errors never reach the client with their text; each is logged once, at
ERROR, with the request id, the exception class (``error``) and where it was raised
(``where``: ``module:function:line`` of the innermost frame), and answered with a
generic 500 that names the request id. ``LastResort`` (an ASGI middleware on the
ingress app) sends anything that escaped a handler through the same mapper, so no
path answers a bare, unlogged 500.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.admin.service import AdminError, Conflict, NotFound
from app.api.anthropic_format import error_body, event
from app.api.messages import UNSUPPORTED
from app.api.request_id import incoming_request_id
from app.dispatch.pools import AttemptsExhausted
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)
from app.fairness.queue import Shed
from app.gateway.admission import Refused
from app.gateway.auth import AuthError
from app.routing.table import NoRouteFits, WrongEndpoint
from app.sessions.book import SessionCancelled
from app.state.protocol import StoreUnavailable
from app.upstream.openai_upstream import UpstreamStreamError, UpstreamUnavailable

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
Dialect = Literal["openai", "anthropic"]  # the error shape of the API called


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, dialect: Dialect = "openai") -> JSONResponse:
        """The error in the shape of the API the client called (``dialect``)."""
        body = self.body() if dialect == "openai" else error_body(self.status, self.message)
        return JSONResponse(body, status_code=self.status, headers=self.headers)

    def sse(self, dialect: Dialect = "openai") -> str:
        """The same error as a server-sent event, for failures after streaming began."""
        if dialect == "anthropic":
            return event("error", {"error": error_body(self.status, self.message)["error"]})
        return f"data: {json.dumps(self.body())}\n\n"


class ModelNotFound(Exception):
    """Raised by the routing layer for a model id it does not serve."""


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist.",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def _param_of(loc: tuple[int | str, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body",)]
    # pydantic appends the union member's type name to the location; drop those.
    parts = [p for p in parts if not p.startswith(("str", "list[", "function-", "constrained"))]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


def from_validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    # A refused parameter wins over the other branches of a union that failed with it
    # (an image part fails the `str` branch of `content` too).
    first = next((e for e in errors if e["type"] == UNSUPPORTED), errors[0])
    param = _param_of(tuple(first["loc"]))
    if first["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first["type"] == UNSUPPORTED:  # a documented parameter this server cannot honour
        message = f"`{param}`: {first['msg']}"
        return ApiError(400, message, param=param, code="unsupported_parameter")
    else:
        msg = str(first["msg"]).removeprefix("Value error, ")
        message = f"Invalid value for `{param}`: {msg}" if param else f"Invalid request: {msg}"
    return ApiError(400, message, param=param, code="invalid_value")


def invalid_json(detail: str) -> ApiError:
    return ApiError(
        400,
        f"We could not parse the JSON body of your request. ({detail})",
        code="invalid_json",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large"
    )


def overloaded(message: str = "The server is overloaded; retry later.") -> ApiError:
    return ApiError(
        503,
        message,
        type="server_error",
        code="overloaded",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def backpressure(exc: BackPressureError) -> ApiError:
    """A pool's queue was full: its ``backpressure`` status (503, or 429 for a pool that
    says so) and Retry-After (Ray's ``BackpressureConfig``; default the gateway's)."""
    status = 429 if getattr(exc, "_status_code", 503) == 429 else 503
    retry = getattr(exc, "_retry_after_s", None)
    return ApiError(
        status,
        "The model's queue is full; retry later.",
        type="server_error" if status == 503 else "rate_limit_error",
        code="overloaded",
        headers={"Retry-After": str(math.ceil(retry) if retry is not None else RETRY_AFTER_S)},
    )


def shed(exc: Shed) -> ApiError:
    """The fair queue shed the request (``app.fairness.queue``): 429 over_share, 503
    pool_full or queue_timeout, with its estimate of when a slot frees up."""
    return ApiError(
        exc.status,
        f"{exc} (band {exc.band})",
        type="rate_limit_error" if exc.status == 429 else "server_error",
        code=exc.reason,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "This gateway replica is shutting down; retry the request.",
        type="server_error",
        code="shutting_down",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def session_cancelled(exc: SessionCancelled) -> ApiError:
    """409: a call of a cancelled session (refused, or ended by the cancel)."""
    message = f"Session `{exc.session_id}` was cancelled"
    if exc.until is not None:
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exc.until))
        message += f" (its calls are refused until {until})"
    message += "; use a new `x-session-id` for new work."
    return ApiError(409, message, param="x-session-id", code="session_cancelled")


def session_not_found(session_id: str) -> ApiError:
    """404 for a session the caller's tenant does not have (another tenant's included:
    its existence is not revealed)."""
    return ApiError(
        404, f"No session `{session_id}`.", param="session_id", code="session_not_found"
    )


def response_not_found(response_id: str, param: str = "response_id") -> ApiError:
    """404 for a response the caller's tenant has not stored (another tenant's included,
    an expired or deleted one)."""
    what = "Previous response" if param == "previous_response_id" else "Response"
    return ApiError(404, f"{what} with id '{response_id}' not found.", param=param,
                    code="response_not_found" if param == "response_id"
                    else "previous_response_not_found")  # fmt: skip


def internal_error(request_id: str) -> ApiError:
    return ApiError(
        500,
        f"The server had an error while processing your request (request id {request_id}).",
        type="server_error",
        code="internal_error",
    )


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "Invalid or missing credentials. Pass an API key or token as "
        "`Authorization: Bearer <credential>`.",
        code="invalid_api_key",
    )


def forbidden() -> ApiError:
    return ApiError(
        403,
        "The credential is not allowed to use this service.",
        type="permission_error",
        code="forbidden",
    )


def refused(exc: Refused) -> ApiError:
    """429 in OpenAI's shape: ``type`` says which limit (requests, tokens,
    insufficient_quota); a concurrency refusal counts as a requests limit."""
    budget = exc.reason == "budget"
    kind = {"budget": "insufficient_quota", "concurrency": "requests"}.get(exc.reason, exc.reason)
    return ApiError(
        429,
        exc.message(),
        type=kind,
        code="insufficient_quota" if budget else "rate_limit_exceeded",
        headers=exc.headers,
    )


def upstream_failed(message: str = "The upstream model server failed; retry later.") -> ApiError:
    return ApiError(
        502,
        message,
        type="server_error",
        code="upstream_error",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _cause(exc: BaseException) -> BaseException:
    """Ray wraps remote exceptions; the wrapper is usually also an instance of the
    cause, but when it is not, look at ``cause``."""
    inner = getattr(exc, "cause", None)
    return inner if isinstance(inner, BaseException) else exc


def invalid_parameter(exc: RequestValidationError) -> ApiError:
    """A query, path or header parameter FastAPI refused: 400 naming it."""
    first = exc.errors()[0]
    where = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "header")]
    param = ".".join(where) or None
    return ApiError(
        400, f"Invalid value for `{param}`: {first.get('msg')}", param=param, code="invalid_value"
    )


def http_error(exc: HTTPException, path: str) -> ApiError:
    """Starlette's own 404 (no route) and 405 (method), in our shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"No route for {path}.", 405: "Method not allowed."}.get(
        exc.status_code, str(exc.detail)
    )
    return ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {}))


def map_exception(exc: BaseException, request_id: str, prompt_param: str = "messages") -> ApiError:
    """Translate any exception raised while serving a request — an OpenAI endpoint, the
    admin API, a route FastAPI refused — into an ``ApiError``: the one mapper."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, AdminError):
        if isinstance(exc, NotFound):
            return ApiError(404, str(exc), code="not_found")
        if isinstance(exc, Conflict):
            return ApiError(409, str(exc), code="conflict")
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, RequestValidationError):
        return invalid_parameter(exc)
    if isinstance(exc, AuthError):
        log.info(
            "request %s: authentication refused (%s)",
            request_id,
            exc.reason,
            extra={"request_id": request_id},
        )
        return unauthorized() if exc.status == 401 else forbidden()
    if isinstance(exc, Refused):
        return refused(exc)
    if isinstance(exc, Shed):
        return shed(exc)
    if isinstance(exc, WrongEndpoint):
        return ApiError(400, str(exc), param="model", code="model_not_supported_for_endpoint")
    if isinstance(exc, NoRouteFits):
        return ApiError(400, str(exc), param="model", code="no_route_fits")
    if isinstance(exc, SessionCancelled):
        return session_cancelled(exc)
    if isinstance(exc, StoreUnavailable):
        log.error("request %s: %s", request_id, exc, extra={"request_id": request_id})
        return overloaded("The state store is unavailable; retry later.")
    if isinstance(exc, AttemptsExhausted):
        log.warning("request %s: %s", request_id, exc, extra={"request_id": request_id})
        return map_exception(exc.last, request_id, prompt_param)
    if isinstance(exc, UpstreamUnavailable | UpstreamStreamError):
        log.warning(
            "request %s: upstream failed: %r", request_id, exc, extra={"request_id": request_id}
        )
        return upstream_failed()
    for candidate in (exc, _cause(exc)):
        if isinstance(candidate, ApiError):
            return candidate
        if isinstance(candidate, ValidationError):
            return from_validation_error(candidate)
        if isinstance(candidate, ContextLengthExceeded):
            return ApiError(
                400, str(candidate.args[0]), param=prompt_param, code="context_length_exceeded"
            )
        if isinstance(candidate, InvalidRequest):
            message, param = str(candidate.args[0]), candidate.param
            return ApiError(400, message, param=param, code="invalid_value")
        if isinstance(candidate, BackPressureError):
            return backpressure(candidate)
        if isinstance(candidate, EngineOverloaded):
            return overloaded()
        if isinstance(candidate, EngineNotReady | DeploymentUnavailableError):
            return overloaded("The model is not ready yet; retry later.")
        if isinstance(candidate, RayActorError):  # the replica died before answering
            return overloaded("The model replica became unavailable; retry later.")
        if isinstance(candidate, TimeoutError):  # no first token within the dispatch deadline
            return overloaded("No model replica started answering in time; retry later.")
    error, where = error_class(exc), origin(exc)
    log.error(
        "request %s failed: %s at %s",
        request_id,
        error,
        where,
        exc_info=exc,
        extra={"request_id": request_id, "error": error, "where": where},
    )
    return internal_error(request_id)


def error_class(exc: BaseException) -> str:
    """The exception's class as the log names it: builtins bare, others qualified;
    a Ray wrapper of a remote exception names its cause's class."""
    cause = _cause(exc)
    cls = type(cause)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


_REMOTE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def origin(exc: BaseException) -> str:
    """Where ``exc`` was raised: ``module:function:line`` of the innermost frame of its
    traceback. A remote exception (Ray's ``RayTaskError``: the cause lost its frames
    on the way) is placed by the last frame of the remote traceback Ray kept, as
    ``path:function:line``; ``unknown`` when there is neither."""
    cause = _cause(exc)
    remote = getattr(exc, "traceback_str", None)
    if cause.__traceback__ is None and isinstance(remote, str):
        frames = _REMOTE_FRAME.findall(remote)
        if frames:
            path, line, function = frames[-1]
            return f"{path}:{function}:{line}"
    tb = cause.__traceback__ or exc.__traceback__
    return _frame_origin(tb) if tb is not None else "unknown"


def _frame_origin(tb: TracebackType) -> str:
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    module = frame.f_globals.get("__name__", frame.f_code.co_filename)
    return f"{module}:{frame.f_code.co_name}:{tb.tb_lineno}"


class LastResort:
    """ASGI middleware: an exception that escaped every handler (a bug outside the
    flows' own mapping) is answered through ``map_exception`` — logged once with the
    request id, class and place, the client told only the request id — instead of
    the framework's bare text 500. After the response began nothing can be sent in
    its place: it is logged and re-raised (the server closes the connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            err = map_exception(exc, incoming_request_id(scope))
            if started:
                raise
            await err.response()(scope, receive, send)


def rejection_reason(exc: BaseException) -> str | None:
    """The ``switchyard_rejections`` reason for a layer-1 refusal, else None."""
    if isinstance(exc, AuthError):
        return "auth" if exc.status == 401 else "forbidden"
    if isinstance(exc, Refused):
        return {"requests": "rate", "tokens": "rate"}.get(exc.reason, exc.reason)
    if isinstance(exc, StoreUnavailable):
        return "store"
    if isinstance(exc, SessionCancelled):
        return "session_cancelled"
    return None
