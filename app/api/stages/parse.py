"""Stage 2, parse: the body, validated (size, depth, schema; ``app.api.body``) and
checked against the request limits, and the headers a request reads, made into the
one ``InferenceRequest`` — one entry per endpoint, which returns the request and the
validated body (the endpoint's respond stage reads the body)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, get_args

from fastapi import Request

from app.api.anthropic_protocol import MessagesRequest
from app.api.body import parse_body
from app.api.errors import ApiError, response_not_found
from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.api.request_id import client_request_id
from app.api.responses_protocol import ResponsesRequest
from app.api.stages.authenticate import Identity
from app.config import GatewayArgs, RequestLimits
from app.request import Endpoint, InferenceRequest, Prompt, TraceContext
from app.responses.book import ResponseBook
from app.routing.classes import BATCH_TIERS, CLASS_HEADER
from app.state.records import Priority

SESSION_HEADER = "x-session-id"
SESSION_SLO_HEADER = "x-switchyard-session-slo-ms"
QUALITY_HEADER = "x-switchyard-quality-floor"
TRACE_HEADER = "traceparent"  # W3C trace context (app.observability.tracing)
PRIORITY_HEADER = "x-switchyard-priority"  # a band (app.fairness.bands)


@dataclass(frozen=True)
class ParseSettings:
    max_body_bytes: int
    limits: RequestLimits
    args: GatewayArgs  # the tenant's KV-cache salt (``gateway.kv_cache``)


Parsed = tuple[InferenceRequest, Any]  # the request, and the endpoint's validated body


async def parse_chat(http: Request, rid: str, who: Identity, settings: ParseSettings) -> Parsed:
    body = await parse_body(http, ChatCompletionRequest, settings.max_body_bytes)
    return _generation(http, rid, who, settings, body, body.prompt(), body.tool_mode())


async def parse_messages(http: Request, rid: str, who: Identity, settings: ParseSettings) -> Parsed:
    """Anthropic's Messages body, served as the chat request it translates to
    (``app.api.anthropic_protocol``); the respond stage reads the Messages body."""
    body = await parse_body(http, MessagesRequest, settings.max_body_bytes)
    chat = body.to_chat()
    request, _ = _generation(http, rid, who, settings, chat, chat.prompt(), chat.tool_mode(),
                             stops=tuple(body.stop_sequences or ()), api="messages")  # fmt: skip
    return request, body


@dataclass(frozen=True)
class Turn:
    """A Responses request as its respond stage reads it: the body, the chain's chat
    messages before it, the chain's session, and the tenant that stores it."""

    body: ResponsesRequest
    history: list[dict[str, Any]]
    session_id: str | None
    tenant: str


async def parse_responses(
    http: Request, rid: str, who: Identity, settings: ParseSettings, book: ResponseBook
) -> Parsed:
    """The Responses body, served as the chat request it translates to after the stored
    chain it continues (``app.responses``: the caller's tenant's, else 404). One chain is
    one session (its first response's id) unless the client sends ``x-session-id``."""
    body = await parse_body(http, ResponsesRequest, settings.max_body_bytes)
    history: list[dict[str, Any]] = []
    session = None
    if body.previous_response_id is not None:
        previous = await book.load(who.caller.tenant, body.previous_response_id)
        if previous is None:
            raise response_not_found(body.previous_response_id, "previous_response_id")
        history, session = previous.context, previous.session_id
    chat = body.to_chat(history)
    request, _ = _generation(http, rid, who, settings, chat, chat.prompt(), chat.tool_mode(),
                             api="responses")  # fmt: skip
    session = request.session_id or session or (f"resp_{rid}" if body.store else None)
    return replace(request, session_id=session), Turn(body, history, session, who.caller.tenant)


async def parse_completion(
    http: Request, rid: str, who: Identity, settings: ParseSettings
) -> Parsed:
    body = await parse_body(http, CompletionRequest, settings.max_body_bytes)
    return _generation(http, rid, who, settings, body, body.prompt_of(), None)


async def parse_embeddings(
    http: Request, rid: str, who: Identity, settings: ParseSettings
) -> Parsed:
    body = await parse_body(http, EmbeddingRequest, settings.max_body_bytes)
    inputs = body.inputs()
    most = settings.limits.max_embedding_inputs
    if len(inputs) > most:
        raise ApiError(
            400, f"At most {most} inputs per request.", param="input", code="too_many_inputs"
        )
    request = InferenceRequest(
        id=rid,
        endpoint="embeddings",
        model=body.model,
        prompt=Prompt(inputs=tuple(inputs)),
        max_tokens=0,
        caller=who.caller,
        session_id=http.headers.get(SESSION_HEADER),
        client_request_id=client_request_id(http.scope),
    )
    return request, body


def _generation(
    http: Request,
    rid: str,
    who: Identity,
    settings: ParseSettings,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: Prompt,
    tool_choice: Any,
    stops: tuple[str, ...] = (),
    api: Endpoint | None = None,
) -> Parsed:
    """``stops``: stop strings beyond the body's own (Anthropic's ``stop_sequences``);
    ``api``: the API called, where it is not the body's own (Anthropic's Messages)."""
    chat = isinstance(body, ChatCompletionRequest)
    sampling = body.sampling()
    if stops:
        sampling = replace(sampling, stop=sampling.stop + stops)
    param = "input" if api == "responses" else "messages" if chat else "prompt"
    _check_limits(prompt, param, settings.limits)
    headers = http.headers
    request = InferenceRequest(
        id=rid,
        endpoint=api or ("chat" if chat else "completion"),
        model=body.model,
        prompt=prompt,
        max_tokens=body.requested_max_tokens(),
        n=body.n,
        sampling=sampling,
        stream=body.stream,
        batch=_batch(body.service_tier, headers.get(CLASS_HEADER)),
        priority=_priority(headers.get(PRIORITY_HEADER)),
        include_usage=body.include_usage,
        caller=who.caller,
        session_id=headers.get(SESSION_HEADER),
        session_slo_ms=_session_slo(headers.get(SESSION_SLO_HEADER)),
        client_request_id=client_request_id(http.scope),
        quality_floor=_quality_floor(headers.get(QUALITY_HEADER)),
        tool_choice=tool_choice,
        user=body.user,
        cache_salt=settings.args.kv_cache.salt(who.caller.tenant),
        trace=TraceContext.parse(headers.get(TRACE_HEADER)) or TraceContext.new(),
    )
    return request, body


def _check_limits(prompt: Prompt, param: str, limits: RequestLimits) -> None:
    text = prompt.view
    messages = prompt.messages
    if messages is not None and len(messages) > limits.max_messages:
        raise ApiError(
            400,
            f"At most {limits.max_messages} messages per request.",
            param=param,
            code="too_many_messages",
        )
    if len(text) > limits.max_prompt_bytes or len(text.encode()) > limits.max_prompt_bytes:
        raise ApiError(
            400,
            f"The prompt exceeds {limits.max_prompt_bytes} bytes.",
            param=param,
            code="prompt_too_large",
        )


def _quality_floor(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        floor = float(value)
    except ValueError:
        floor = -1.0
    if not 0.0 <= floor <= 1.0:
        raise ApiError(
            400, f"`{QUALITY_HEADER}` must be a number from 0 to 1.", param=QUALITY_HEADER
        )
    return floor


def _priority(value: str | None) -> Priority | None:
    if value is None:
        return None
    bands = get_args(Priority)
    if value not in bands:
        raise ApiError(
            400, f"`{PRIORITY_HEADER}` must be one of {', '.join(bands)}.", param=PRIORITY_HEADER
        )
    return value  # type: ignore[return-value]


def _session_slo(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        slo = float(value)
    except ValueError:
        slo = -1.0
    if not 0.0 < slo < float("inf"):
        raise ApiError(
            400,
            f"`{SESSION_SLO_HEADER}` must be a positive number of milliseconds.",
            param=SESSION_SLO_HEADER,
        )
    return slo


def _batch(service_tier: str | None, class_header: str | None) -> bool:
    """Whether the client marked the request as batch work (``app.routing.classes``)."""
    if class_header is not None and class_header != "throughput":
        raise ApiError(
            400,
            f"`{CLASS_HEADER}` accepts 'throughput' (batch work); the other classes follow "
            "from the request itself.",
            param=CLASS_HEADER,
        )
    return class_header == "throughput" or service_tier in BATCH_TIERS
