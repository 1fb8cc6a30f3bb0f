"""The endpoints as thin slices over the pipeline (``app.api.pipeline``): each names
its parse, how its prompt is measured for admission, its dispatch and its respond —
as vLLM's ``entrypoints/openai`` slices name their serving classes. A new API (the
Responses API, the Messages API) is one more slice."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import Response

from app.api.errors import Dialect
from app.api.flow import Call, Calls
from app.api.stages.admit import Measure, measure_inputs, measure_prompt
from app.api.stages.authenticate import Identity
from app.api.stages.dispatch import dispatch_embeddings, dispatch_generation
from app.api.stages.parse import (
    Parsed,
    ParseSettings,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_messages,
    parse_responses,
)
from app.api.stages.respond import respond_embeddings, respond_generation
from app.api.stages.respond_anthropic import respond_messages
from app.api.stages.respond_responses import respond_responses
from app.api.stages.route import Routed
from app.dispatch.fallback import Answer
from app.dispatch.pools import Pools
from app.observability.metrics import GatewayMetrics
from app.request import Endpoint as Kind
from app.request import InferenceRequest
from app.responses.book import ResponseBook

A = TypeVar("A")  # what the endpoint's dispatch answers with


@dataclass(frozen=True)
class Endpoint(Generic[A]):
    name: Kind
    parse: Callable[[Request, str, Identity, ParseSettings], Awaitable[Parsed]]
    measure: Measure
    dispatch: Callable[[Call, Routed, InferenceRequest, Pools, GatewayMetrics], Awaitable[A]]
    respond: Callable[[Call, Any, Routed, InferenceRequest, A, Calls], Awaitable[Response]]
    error_param: str  # the body field an error about the prompt names
    adapters: bool = True  # a LoRA adapter may answer
    local_only: bool = False  # served by local pools only
    dialect: Dialect = "openai"  # the shape of its errors


CHAT = Endpoint("chat", parse_chat, measure_prompt, dispatch_generation, respond_generation,
                "messages")  # fmt: skip
COMPLETION = Endpoint("completion", parse_completion, measure_prompt, dispatch_generation,
                      respond_generation, "prompt")  # fmt: skip
EMBEDDINGS = Endpoint("embeddings", parse_embeddings, measure_inputs, dispatch_embeddings,
                      respond_embeddings, "input", adapters=False, local_only=True)  # fmt: skip
MESSAGES = Endpoint("messages", parse_messages, measure_prompt, dispatch_generation,
                    respond_messages, "messages", dialect="anthropic")  # fmt: skip


def responses(book: ResponseBook) -> Endpoint[Answer]:
    """The Responses slice, over the ingress's stored responses (``app.responses``)."""
    parse, respond = partial(parse_responses, book=book), partial(respond_responses, book=book)
    return Endpoint("responses", parse, measure_prompt, dispatch_generation, respond, "input")
