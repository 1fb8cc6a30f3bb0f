"""Stage 3, route: the model and the pool that answer (``app.routing``: the route
snapshot, no hop), and the LoRA adapter a model name or a route names
(``app.adapters``). A model of another task (``WrongEndpoint``) and a policy alias
with nothing that fits (``NoRouteFits``) are 400s here, an unknown model a 404 —
before any tokenizing or admission. The request gets its adapter here (the one change
``route`` makes to it; ``app.request``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from app.adapters.registry import AdapterRegistry
from app.api.errors import ApiError, model_not_found
from app.request import InferenceRequest
from app.routing.snapshot import RouteSnapshot
from app.routing.table import Acceptance, LiveLatency, RouteDecision, RouteTable, no_acceptance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routed:
    request: InferenceRequest  # with its adapter, when one answers
    decision: RouteDecision
    table: RouteTable  # the snapshot the decision was made on


async def route(
    request: InferenceRequest,
    routes: RouteSnapshot,
    adapters: AdapterRegistry | None,
    live: LiveLatency,
    *,
    acceptance: Acceptance = no_acceptance,
    local_only: bool = False,
) -> Routed:
    """``live``: a pool's recent latency (latency-aware policies); ``acceptance``: a
    speculative pool's measured draft acceptance (its health rule); ``local_only``: the
    endpoint is served by local pools only (embeddings)."""
    decision = await routes.decide(request, live=live, acceptance=acceptance)
    tenant = request.tenant
    if decision is None and adapters is not None:
        # not a model or alias: a LoRA adapter (base:adapter) the caller may use?
        adapter = await adapters.resolve(request.model, tenant)
        if adapter is not None:
            request = request.with_adapter(adapter)
            decision = await routes.decide(
                replace(request, model=adapter.base), live=live, acceptance=acceptance
            )
    elif decision is not None and decision.adapter is not None:
        request, decision = await _routed_adapter(request, decision, adapters)
    if decision is None:
        raise model_not_found(request.model)
    table = routes.table  # after decide: it may have refreshed the snapshot
    if local_only and table.deployment(decision.pool) is None:
        raise ApiError(400, f"`{request.model}` is not served by a local pool.", param="model")
    return Routed(request, decision, table)


async def _routed_adapter(
    request: InferenceRequest, decision: RouteDecision, adapters: AdapterRegistry | None
) -> tuple[InferenceRequest, RouteDecision]:
    """The adapter the routes chose (an alias to it, a canary or a tenant override).
    One the caller may not use, or that is not registered: 404 for an alias (it is
    what the caller asked for); for a canary or tenant override, the base answers."""
    assert decision.adapter is not None
    found = (
        await adapters.resolve(decision.adapter, request.tenant) if adapters is not None else None
    )
    if found is not None:
        return request.with_adapter(found), decision
    if decision.adapter_required:
        raise model_not_found(request.model)
    log.warning(
        "route %s of %s names adapter %s, which is not registered or not visible to "
        "the caller: the base answers", decision.step, decision.model, decision.adapter,
    )  # fmt: skip
    return request, replace(decision, adapter=None)
