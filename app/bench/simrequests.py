"""Request bodies and error responses of the simulated server (:mod:`app.bench.simserver`).

Bodies are the API's own request models (:mod:`app.api.protocol`) with unknown fields
ignored, as in vLLM. Every failure is an :class:`HttpError`, answered in OpenAI's error
shape ``{"error": {"message", "type", "param", "code"}}``:

* 400 ``invalid_json``: the body is not JSON, or not a JSON object;
* 400 ``invalid_value``: a field fails validation (``param`` names the first one);
* 404 ``model_not_found``: the body names a model the server does not serve;
* 400 ``context_length_exceeded``: the prompt fills the context, or leaves no room for
  the requested ``max_tokens`` (:func:`check_context_length`);
* engine errors (:func:`engine_error`): a full queue is 429 ``rate_limit_exceeded``, a
  context or invalid request 400, an engine not ready 503, anything else 500.

A 429 or 503 carries ``Retry-After: 1``.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    InvalidRequest,
)

__all__ = ["ChatBody", "CompletionBody", "EmbeddingBody", "HttpError"]
__all__ += ["check_context_length", "engine_error", "parse_body"]

B = TypeVar("B", bound=BaseModel)


class ChatBody(ChatCompletionRequest):
    model_config = ConfigDict(extra="ignore")


class CompletionBody(CompletionRequest):
    model_config = ConfigDict(extra="ignore")


class EmbeddingBody(EmbeddingRequest):
    model_config = ConfigDict(extra="ignore")


class HttpError(Exception):
    """A failure answered in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, code: str, type_: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type_, "param": param, "code": code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body, status_code=self.status, headers=headers)


def engine_error(exc: EngineError) -> HttpError:
    if isinstance(exc, EngineOverloaded):
        return HttpError(429, str(exc), "rate_limit_exceeded", "requests")
    if isinstance(exc, ContextLengthExceeded):
        return HttpError(400, str(exc), "context_length_exceeded")
    if isinstance(exc, InvalidRequest):
        return HttpError(400, str(exc), "invalid_value")
    if isinstance(exc, EngineNotReady):
        return HttpError(503, str(exc), "not_ready", "server_error")
    return HttpError(500, str(exc), "internal_error", "server_error")


async def parse_body(request: Request, schema: type[B], model: str) -> B:
    """The request's JSON body as ``schema``, which must name ``model``."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"Invalid JSON body: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise HttpError(400, "The request body must be a JSON object.", "invalid_json")
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = str(error["loc"][0]) if error["loc"] else None
        message = f"Invalid value for `{param}`: {error['msg']}"
        raise HttpError(400, message, "invalid_value", param=param) from None
    if getattr(body, "model", None) != model:
        message = f"The model `{getattr(body, 'model', '')}` does not exist."
        raise HttpError(404, message, "model_not_found", param="model")
    return body


def check_context_length(prompt_tokens: int, asked: int | None, limit: int) -> None:
    """Raise 400 ``context_length_exceeded`` unless ``prompt_tokens`` plus the requested
    ``max_tokens`` (``asked``; None: whatever is left) fit in ``limit`` with room for
    at least one generated token."""
    if prompt_tokens >= limit or prompt_tokens + (asked or 0) > limit:
        message = (
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {prompt_tokens + (asked or 0)} tokens ({prompt_tokens} in the prompt, "
            f"{asked or 0} in the completion)."
        )
        raise HttpError(400, message, "context_length_exceeded")
