"""``GET /openapi.json``: the API as served, for OpenAPI tooling and client generators.

Request bodies are Switchyard's own validation models (``app.api.protocol``,
``app.api.anthropic_protocol``, ``app.api.responses_protocol``), so the document says
exactly what is accepted; response bodies are the official ``openai`` and ``anthropic``
SDKs' types (the shapes the SDKs parse) where the server writes exactly those, our own
where it writes more (an embedding is a base64 string with ``encoding_format: base64``,
which the SDK's ``Embedding`` types as a list only), plus the one error shape
(Anthropic's on the Messages endpoints). Built once per process from the models, never
by hand.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from anthropic.types import ErrorResponse as AnthropicErrorResponse
from anthropic.types import (
    Message,
    MessageTokensCount,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_choice import Logprobs as CompletionLogprobs
from openai.types.completion_usage import CompletionUsage
from openai.types.create_embedding_response import Usage as EmbeddingUsage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseItemList,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from app.api.anthropic_protocol import CountTokensRequest, MessagesRequest
from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.api.responses_protocol import ResponsesRequest
from app.sessions.tally import Session

REF = "#/components/schemas/{model}"


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error: 4xx and 5xx, on every endpoint."""

    error: ErrorBody


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class CompletionChunkChoice(BaseModel):
    """A legacy completion's streamed choice: its finish reason is null until the
    choice ends (the SDK's ``Completion`` types it as always set)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None = None
    stop_reason: str | None = None  # vLLM's extension: ``budget_exhausted``


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed legacy completion (the usage chunk has no
    choices)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: CompletionUsage | None = None


class EmbeddingVector(BaseModel):
    """One input's vector (``app.api.openai_format.encode_embedding``)."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(
        description="`encoding_format: float`: the numbers; `base64`: the vector's "
        "little-endian float32 bytes, base64-encoded (OpenAI's format)."
    )


class EmbeddingList(BaseModel):
    """OpenAI's embeddings response; ``usage`` counts the prompt tokens."""

    object: Literal["list"]
    data: list[EmbeddingVector]
    model: str
    usage: EmbeddingUsage


REQUESTS: list[type[BaseModel]] = [
    ChatCompletionRequest, CompletionRequest, EmbeddingRequest, MessagesRequest,
    CountTokensRequest, ResponsesRequest,
]  # fmt: skip
EVENTS: list[type[BaseModel]] = [  # the Messages stream's (Anthropic's SDK types)
    RawMessageStartEvent, RawContentBlockStartEvent, RawContentBlockDeltaEvent,
    RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStopEvent,
]  # fmt: skip
RESPONSE_EVENTS: list[type[BaseModel]] = [  # the Responses stream's (OpenAI's SDK types)
    ResponseCreatedEvent, ResponseInProgressEvent, ResponseOutputItemAddedEvent,
    ResponseContentPartAddedEvent, ResponseTextDeltaEvent, ResponseTextDoneEvent,
    ResponseContentPartDoneEvent, ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent, ResponseOutputItemDoneEvent,
    ResponseCompletedEvent, ResponseIncompleteEvent, ResponseFailedEvent,
]  # fmt: skip


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


RESPONSES: list[type[BaseModel]] = [
    ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk, EmbeddingList, ModelList,
    Session, ErrorResponse, Message, MessageTokensCount, AnthropicErrorResponse, *EVENTS,
    Response, ResponseItemList, ResponseDeleted, *RESPONSE_EVENTS,
]  # fmt: skip


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _names()[model]}


@cache
def _names() -> dict[Any, str]:
    names, _ = models_json_schema(_pairs(), ref_template=REF)
    return {model: ref["$ref"] for (model, _), ref in names.items()}


def _pairs() -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Request bodies as the server validates them, responses as they are written."""
    return [(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in RESPONSES]


def _errors(*statuses: int, shape: type[BaseModel] = ErrorResponse) -> dict[str, Any]:
    what = {400: "invalid request (the param is named)", 401: "no or bad credentials",
            403: "not allowed", 404: "unknown model", 408: "body too slow",
            409: "the call's session was cancelled (`session_cancelled`)",
            413: "body too large", 429: "rate limit or budget", 499: "client closed",
            500: "internal error: the message names the request id, under which the "
                 "server logged it",
            502: "the upstream model server failed",
            503: "overloaded, not ready or shutting down"}  # fmt: skip
    return {
        str(s): {
            "description": what[s],
            "content": {"application/json": {"schema": _ref(shape)}},
        }
        for s in statuses
    }


def _generation(request: type[BaseModel], answer: type[BaseModel], chunk: type[BaseModel]) -> Any:
    return {
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {
                "description": "the answer; with stream: true, server-sent events of chunks "
                "ending with `data: [DONE]` (an error after the stream began is an event "
                "of the error shape, then `data: [DONE]`)",
                "content": {"application/json": {"schema": _ref(answer)},
                            "text/event-stream": {"schema": {
                                "anyOf": [_ref(chunk), _ref(ErrorResponse)]}}},
            },
            **_errors(400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503),
        },
        "security": [{"bearer": []}],
    }  # fmt: skip


def _messages() -> Any:
    events = [_ref(e) for e in EVENTS] + [_ref(AnthropicErrorResponse)]
    return {
        "summary": "Anthropic Messages (tools, token counts; Anthropic's errors)",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref(MessagesRequest)}}},
        "responses": {
            "200": {
                "description": "the message; with stream: true, Anthropic's named "
                "server-sent events (`event: message_start` ... `event: message_stop`; an "
                "error after the stream began is `event: error`)",
                "content": {"application/json": {"schema": _ref(Message)},
                            "text/event-stream": {"schema": {"anyOf": events}}},
            },
            **_errors(400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503,
                      shape=AnthropicErrorResponse),
        },
        "security": [{"bearer": []}, {"x-api-key": []}],
    }  # fmt: skip


def _responses() -> Any:
    events = [_ref(e) for e in RESPONSE_EVENTS]
    return {
        "summary": "OpenAI Responses (function tools, structured outputs, stored chains "
                   "with previous_response_id)",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref(ResponsesRequest)}}},
        "responses": {
            "200": {
                "description": "the response; with stream: true, the Responses named "
                "server-sent events (`event: response.created` ... `event: "
                "response.completed`, `response.incomplete`, or `response.failed` when the "
                "engine fails after the stream began)",
                "content": {"application/json": {"schema": _ref(Response)},
                            "text/event-stream": {"schema": {"anyOf": events}}},
            },
            **_errors(400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503),
        },
        "security": [{"bearer": []}],
    }  # fmt: skip


def _stored(summary: str, answer: type[BaseModel], query: bool = False) -> Any:
    params = [{"name": "response_id", "in": "path", "required": True,
               "schema": {"type": "string"}}]  # fmt: skip
    if query:
        params += [
            {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
            {"name": "limit", "in": "query",
             "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
            {"name": "after", "in": "query", "schema": {"type": "string"}},
        ]  # fmt: skip
    return {
        "summary": summary,
        "parameters": params,
        "responses": {"200": {"description": "ok", "content": {
            "application/json": {"schema": _ref(answer)}}},
            **_errors(400, 401, 403, 404, 500, 503)},
        "security": [{"bearer": []}],
    }  # fmt: skip


def _session(summary: str) -> Any:
    return {
        "summary": summary,
        "parameters": [{"name": "session_id", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "responses": {"200": {"description": "the session", "content": {
            "application/json": {"schema": _ref(Session)}}},
            **_errors(401, 403, 404, 500, 503)},
        "security": [{"bearer": []}],
    }  # fmt: skip


@cache
def openapi_document() -> dict[str, Any]:
    _, top = models_json_schema(_pairs(), ref_template=REF)
    components = top.get("$defs", {})
    plain = {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}
    paths: dict[str, Any] = {
        "/v1/chat/completions": {"post": {
            "summary": "Chat completion (tools, structured outputs, logprobs, n)",
            **_generation(ChatCompletionRequest, ChatCompletion, ChatCompletionChunk)}},
        "/v1/completions": {"post": {
            "summary": "Legacy completion",
            **_generation(CompletionRequest, Completion, CompletionChunk)}},
        "/v1/embeddings": {"post": {
            "summary": "Embeddings (float or base64)",
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": _ref(EmbeddingRequest)}}},
            "responses": {"200": {"description": "the vectors", "content": {
                "application/json": {"schema": _ref(EmbeddingList)}}},
                **_errors(400, 401, 403, 404, 408, 409, 413, 429, 500, 502, 503)},
            "security": [{"bearer": []}]}},
        "/v1/responses": {"post": _responses()},
        "/v1/responses/{response_id}": {
            "get": _stored("A stored response of the caller's tenant", Response),
            "delete": _stored("Delete a stored response", ResponseDeleted)},
        "/v1/responses/{response_id}/input_items": {
            "get": _stored("A stored response's input items", ResponseItemList, query=True)},
        "/v1/messages": {"post": _messages()},
        "/v1/messages/count_tokens": {"post": {
            "summary": "Anthropic token count of a Messages request (free)",
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": _ref(CountTokensRequest)}}},
            "responses": {"200": {"description": "the prompt's tokens", "content": {
                "application/json": {"schema": _ref(MessageTokensCount)}}},
                **_errors(400, 401, 403, 404, 413, 500, 503, shape=AnthropicErrorResponse)},
            "security": [{"bearer": []}, {"x-api-key": []}]}},
        "/v1/models": {"get": {
            "summary": "The served models",
            "responses": {"200": {"description": "the models", "content": {
                "application/json": {"schema": _ref(ModelList)}}},
                **_errors(401, 403, 500, 503)},
            "security": [{"bearer": []}]}},
        "/v1/sessions/{session_id}": {"get": _session("The caller's agent session")},
        "/v1/sessions/{session_id}/cancel": {
            "post": _session("Cancel every call of the session, on every replica")},
        "/health": {"get": {"summary": "Liveness", "responses": {"200": plain}}},
        "/ready": {"get": {"summary": "Readiness of the default model",
                           "responses": {"200": plain, **_errors(503)}}},
        "/metrics": {"get": {"summary": "Prometheus text format", "responses": {
            "200": {"description": "metrics", "content": {"text/plain": {"schema": {
                "type": "string"}}}}, **_errors(401)}}},
    }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchyard", "version": "1",
                 "description": "OpenAI-compatible API over a pool of vLLM engines."},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "x-api-key": {"type": "apiKey", "in": "header",
                                              "name": "x-api-key"}},
        },
    }  # fmt: skip
