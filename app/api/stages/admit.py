"""Stage 4, admit: the session's book (409 once the session is cancelled), the prompt
measured (``measure_prompt`` for generation: counted by the model's local tokenizer
and checked against the chosen pool's context window, budgets or not;
``measure_inputs`` for embeddings: counted and capped), then rate limits,
concurrency and the exact budget reservation (``app.gateway``), in one decision;
then, at a saturated model, its turn (``app.fairness``: its band, VTC order among
tenants, shed with 429/503 and Retry-After; the reservation is held while it waits
and released when it is shed or its client leaves). The request leaves with the token
ids the engine will see and, when a budget caps it, its allowance as ``max_tokens``
and the band it was granted, which the engine takes as its priority (the one change
``admit`` makes to it; ``app.request``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.adapters.registry import adapter_price
from app.api.errors import ApiError
from app.api.flow import Call, Calls
from app.api.prompt import OFF_LOOP_CHARS, prompt_ids
from app.api.stages.authenticate import Identity
from app.api.stages.route import Routed
from app.config import RequestLimits
from app.engine.window import output_limit
from app.fairness.bands import service_class
from app.fairness.pools import FairQueues
from app.fairness.queue import Shed
from app.gateway.gatekeeper import Gatekeeper
from app.gateway.plan import Plan, levels
from app.request import InferenceRequest
from app.sessions.book import SessionBook, SessionCancelled
from app.state.protocol import Price
from app.state.records import Priority


@dataclass(frozen=True)
class Measured:
    """What admission reserves for and checks against."""

    prompt_tokens: int  # reserved for the prompt (0 when no budget or bucket needs them)
    counted: int | None  # the local tokenizer's count, when there is one
    context_left: int  # what the window leaves for the completion
    token_ids: tuple[int, ...] | None = None  # the prompt as the engine will see it


Measure = Callable[[Routed, Plan, Gatekeeper, RequestLimits], Awaitable[Measured]]


async def admit(
    call: Call,
    routed: Routed,
    who: Identity,
    measure: Measure,
    gatekeeper: Gatekeeper,
    limits: RequestLimits,
    calls: Calls,
    sessions: SessionBook | None,
    fair: FairQueues | None = None,
) -> InferenceRequest:
    """The request as admitted; ``call`` holds its admission and is in ``calls`` (the
    replica's book of requests in flight) from here on."""
    request = routed.request
    if request.session_id is not None and sessions is not None:
        await sessions.admit(who.caller.tenant, request.session_id)
    plan = gatekeeper.plan(who.caller, who.principal)
    m = await measure(routed, plan, gatekeeper, limits)
    profile = routed.table.profile(routed.decision.model)
    call.admission = await gatekeeper.gate.admit(
        request,
        plan,
        prompt_tokens=m.prompt_tokens,
        context_left=m.context_left,
        price=adapter_price(request.adapter, profile.price() if profile else Price()),
        counted_prompt_tokens=m.counted,
    )
    calls.add(call)
    check_session(call, sessions)
    lims = [lim for _, lim in levels(who.caller, who.principal)]
    band, share = service_class(lims, request.priority, request.batch)
    await take_turn(call, routed, who, fair, m, band, share)
    # The budget's allowance is the request's max_tokens from here on; its band is the
    # engine's priority (vLLM's scheduling_policy: priority).
    counted_by = routed.table.pool_model(routed.decision.pool)
    allowance = call.admission.max_tokens
    return request.admitted(m.token_ids, counted_by, allowance, band)


async def take_turn(
    call: Call,
    routed: Routed,
    who: Identity,
    fair: FairQueues | None,
    m: Measured,
    band: Priority,
    share: float,
) -> None:
    """Wait for a slot of the chosen pool when it is saturated (``app.fairness.queue``);
    the outcome keeps the turn (``QueueNote``), shed or not."""
    pool = routed.decision.pool
    local = routed.table.local_model(pool)
    if fair is None or local is None:
        return
    queue = fair.of(pool, local.slots, local.replicas)
    if queue is None:
        return
    request = routed.request
    prompt = m.counted if m.counted is not None else request.prompt_tokens
    assert call.admission is not None
    bounds = (request.max_tokens, call.admission.max_tokens, m.context_left)
    most = min(b for b in bounds if b is not None)  # the output its KV may need
    ticket = call.ticket = queue.ticket(who.caller.tenant, band, prompt, share, most)
    try:
        await ticket.wait()
    except Shed as shed:
        call.outcome.queue = ticket.note(shed)
        raise
    call.outcome.queue = ticket.note()


def check_session(call: Call, sessions: SessionBook | None) -> None:
    """A call whose session was cancelled while it was being admitted or dispatched
    ends here (``app.sessions.book``: a cancellation read just before the call
    registered)."""
    key = call.session
    if key is not None and sessions is not None and sessions.cancelled_here(key):
        call.cancel()
    if call.cancelled:
        raise SessionCancelled(key.session_id if key is not None else "")


async def measure_prompt(
    routed: Routed, plan: Plan, gatekeeper: Gatekeeper, limits: RequestLimits
) -> Measured:
    """One rule for the context window: whenever the prompt can be counted here (a
    local tokenizer), it is checked before admission, budgets or not; without one, an
    upper bound is checked when a budget or a token bucket needs the count."""
    request, table = routed.request, routed.table
    counted_by = table.pool_model(routed.decision.pool)
    window = table.window(routed.decision)  # the chosen pool's (a class pool's own)
    tokenizer = gatekeeper.tokenizer(counted_by) if counted_by else None
    ids: tuple[int, ...] | None = None
    prompt_tokens = 0
    if tokenizer is not None and counted_by is not None:
        ids = await prompt_ids(tokenizer, request.prompt)
        prompt_tokens = len(ids)
        output_limit(prompt_tokens, request.max_tokens, window, request.sampling.min_tokens)
    elif plan.needs_prompt_tokens:  # an upstream without a local tokenizer
        prompt_tokens = request.prompt.upper_bound_tokens()
        output_limit(prompt_tokens, request.max_tokens, window, request.sampling.min_tokens)
    counted = len(ids) if ids is not None else None
    return Measured(
        prompt_tokens=prompt_tokens if plan.needs_prompt_tokens else 0,
        counted=counted,
        context_left=max(0, window - (counted if counted is not None else prompt_tokens)),
        token_ids=ids,
    )


async def measure_inputs(
    routed: Routed, plan: Plan, gatekeeper: Gatekeeper, limits: RequestLimits
) -> Measured:
    """The input tokens of an embeddings request when the model's tokenizer is local
    (capped at ``max_embedding_tokens``; off the event loop when long)."""
    model = routed.table.pool_model(routed.decision.pool)
    tokenizer = gatekeeper.tokenizer(model) if model else None
    if tokenizer is None:
        return Measured(0, None, 0)
    inputs = routed.request.prompt.inputs or ()

    def count() -> int:
        return sum(len(tokenizer.embedding_input(t)) for t in inputs)

    long = sum(len(t) for t in inputs) >= OFF_LOOP_CHARS
    counted = await asyncio.to_thread(count) if long else count()
    if counted > limits.max_embedding_tokens:
        raise ApiError(
            400,
            f"The inputs have {counted} tokens; at most {limits.max_embedding_tokens} per request.",
            param="input",
            code="too_many_tokens",
        )
    return Measured(counted if plan.needs_prompt_tokens else 0, counted, 0)
