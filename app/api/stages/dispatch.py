"""Stage 5, dispatch: the request to the chosen pool and its fallbacks
(``app.dispatch``: bounded attempts, the first-token deadline, P/D legs), one entry
per kind of answer. ``dispatch_generation`` returns the ``Answer`` — the stream, its
first delta and its provenance (pool, attempts, the replica router's choice, how the
P/D legs ran) — and counts what the answer says (adapter loads, P/D legs, replica
decisions); ``dispatch_embeddings`` returns the vectors. A cancel of the handler (the
client left, the session was cancelled, the replica stops) reaches the running
attempt through the task, not through a handle handed up."""

from __future__ import annotations

from dataclasses import dataclass

from app.api.flow import Call
from app.api.stages.route import Routed
from app.dispatch.fallback import Answer, dispatch, dispatch_embed
from app.dispatch.pools import Pools
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest


@dataclass(frozen=True)
class Vectors:
    vectors: list[list[float]]
    prompt_tokens: int


async def dispatch_generation(
    call: Call,
    routed: Routed,
    request: InferenceRequest,
    pools: Pools,
    metrics: GatewayMetrics,
) -> Answer:
    # the gateway's prompt count, as admission reserved it: an upstream's first delta
    # carries it
    assert call.admission is not None
    prompt_tokens = call.admission.request.prompt_tokens
    answer = await dispatch(
        pools, routed.table, routed.decision, request, call.outcome, metrics, prompt_tokens
    )
    call.answered_by(answer)
    load = answer.first.load
    if call.ticket is not None:
        call.ticket.first_token()
        if load is not None and answer.pool == routed.decision.pool:
            call.ticket.observe(answer.replica.replica if answer.replica else answer.pool, load)
    if request.adapter is not None:
        metrics.adapter_request(call.label, answer.first.adapter_load_s)
    pd = answer.pd
    if pd is not None:
        if pd.served == "remote" and pd.prefill_s is not None:
            call.outcome.handoff = (pd.prefill_s, pd.handoff_s)
        prefill_s = pd.prefill_s if pd.fallback is None else None
        metrics.pd_request(call.label, pd.served, pd.reason, prefill_s, pd.handoff_s)
    r = answer.replica
    if r is not None:
        seconds = sum(r.timings_ns.values()) / 1e9
        metrics.replica_decision(
            call.label, r.scorer, seconds, r.index_blocks, r.matched_blocks, r.prompt_blocks
        )
    return answer


async def dispatch_embeddings(
    call: Call,
    routed: Routed,
    request: InferenceRequest,
    pools: Pools,
    metrics: GatewayMetrics,
) -> Vectors:
    vectors, tokens = await dispatch_embed(
        pools, routed.table, routed.decision, request, call.outcome, metrics
    )
    call.answered = True
    call.outcome.prompt_tokens = tokens
    return Vectors(vectors, tokens)
