"""``POST /v1/messages/count_tokens`` (Anthropic): the prompt tokens a Messages request
would have — its system prompt, turns and tools rendered through the model's chat
template and counted by the model's own tokenizer at the gateway. Free: nothing is
generated, so nothing is admitted or billed; the caller must still authenticate, and
a model whose tokenizer is not local (an upstream) gets a 400 rather than a guess."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.api.anthropic_protocol import CountTokensRequest
from app.api.body import parse_body
from app.api.errors import ApiError, map_exception, model_not_found
from app.api.prompt import prompt_ids
from app.api.request_id import incoming_request_id
from app.gateway.gatekeeper import Gatekeeper
from app.routing.snapshot import RouteSnapshot
from app.routing.table import RouteRequest


async def count_tokens(
    http: Request, gatekeeper: Gatekeeper, routes: RouteSnapshot, max_body_bytes: int
) -> Response:
    try:
        caller, _ = await gatekeeper.identify(http.headers)
        body = await parse_body(http, CountTokensRequest, max_body_bytes)
        chat = body.to_chat()
        decision = await routes.decide(
            RouteRequest(model=body.model, tenant=caller.tenant, endpoint="chat")
        )
        if decision is None:
            raise model_not_found(body.model)
        model = routes.table.pool_model(decision.pool)
        tokenizer = gatekeeper.tokenizer(model) if model else None
        if tokenizer is None:
            raise ApiError(400, f"`{body.model}` is served upstream, where its tokenizer is; "
                           "tokens are counted here only for local models.", param="model",
                           code="unsupported_parameter")  # fmt: skip
        ids = await prompt_ids(tokenizer, chat.prompt())
    except Exception as exc:
        return map_exception(exc, incoming_request_id(http.scope)).response("anthropic")
    return JSONResponse({"input_tokens": len(ids)})
