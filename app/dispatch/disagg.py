"""Dispatch to a disaggregated pool: the per-request rule (``app.disagg.rule``) on what
this process's replica routers know, then the two-leg stream (``app.disagg.stream``)
over the prefill and decode deployments' handles.

The rule's inputs: the prompt's tokens not held by the best decode replica (the decode
deployment's router index, when it has a ``routing:`` block; else nothing is taken as
held), and the requests this process has in flight on each replica of both roles (their
routers' bookings; before the prefill router exists, none on each configured replica),
ejected prefill replicas left out. The stream's verdict on each hand-off goes back to
the prefill router (``app.scheduler.ejection``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.disagg.config import Disaggregation
from app.disagg.rule import PdChoice, decide
from app.disagg.stream import PdStream
from app.engine.protocol import KvHandoff
from app.request import InferenceRequest
from app.scheduler import views
from app.scheduler.config import ReplicaRouting
from app.scheduler.ray_router import routed_request


@dataclass(frozen=True)
class DisaggregatedPool:
    """A model served by a decode deployment that may hand prefills to another."""

    decode: str  # deployment names
    prefill: str
    settings: Disaggregation
    decode_routing: ReplicaRouting | None = None  # how the decode router hashes prompts


def choose(pool: DisaggregatedPool, request: InferenceRequest) -> PdChoice:
    s = pool.settings
    ids = request.prompt.token_ids
    prompt_tokens = len(ids) if ids is not None else request.prompt.upper_bound_tokens()
    cached = 0
    if pool.decode_routing is not None:
        routed = routed_request(request, pool.decode_routing)
        cached = views.best_prefix_tokens(pool.decode, routed)
    busy = views.in_flight(pool.prefill, ejected=False)
    ejected = busy == [] and bool(views.in_flight(pool.prefill))
    if busy is None:
        busy = [0] * s.prefill.num_replicas
    return decide(
        mode=s.mode,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        min_uncached_tokens=s.min_uncached_tokens,
        prefill_in_flight=busy,
        max_prefill_in_flight=s.max_prefill_in_flight,
        prefill_ejected=ejected,
        decode_in_flight=views.in_flight(pool.decode),
        max_decode_in_flight=s.max_decode_in_flight,
        choices=request.n,
    )


def open_pd(
    pool: DisaggregatedPool,
    servers: dict[str, Any],
    request: InferenceRequest,
    attempt: int,
    budget_s: float | None = None,
) -> PdStream:
    """Start one dispatch attempt of ``request`` on a disaggregated pool, whose first
    delta must come within ``budget_s``."""
    prefill = servers[pool.prefill]
    decode = servers[pool.decode].options(stream=True)

    def start_prefill() -> Any:
        return prefill.prefill.remote(request, attempt)

    def start_decode(handoff: KvHandoff | None) -> Any:
        return decode.generate.remote(request, attempt, handoff)

    def judged(ok: bool) -> None:
        views.report(pool.prefill, request.id, ok)

    s = pool.settings
    return PdStream(
        choose(pool, request),
        start_prefill,
        start_decode,
        prefill_deadline_s=s.prefill_deadline_s,
        transfer_deadline_s=s.transfer_deadline_s,
        budget_s=budget_s,
        judged=judged,
    )
