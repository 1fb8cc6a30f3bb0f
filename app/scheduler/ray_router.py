"""``SwitchyardRouter``: the Ray Serve request router of an LLMServer deployment whose
model has a ``routing:`` block (``RequestRouterConfig.request_router_kwargs`` = that
block). Ray builds one per DeploymentHandle, so each ingress replica routes with its
own index and load book.

Flow per request: ``choose_replicas`` turns the handle call's ``InferenceRequest`` into
a ``RoutedRequest`` (prompt token ids hashed in salted blocks, the session key), runs
the scheduler over the candidates Ray offers, books the winner at once (so requests
routed in the same instant see each other) and returns ``[[winner], rest by rank]`` —
Ray falls back to the rest only when the winner is full. In precise mode the router
first follows the KV-event endpoint each replica advertises in its routing stats
(``kv_events``; ``app.scheduler.kv_feed``) and applies every event received since the
last decision to its index (``Scheduler.engine_events``). ``on_request_routed`` moves
the booking if Ray sent it elsewhere; ``on_request_completed`` releases it. The
decision is kept, by gateway request id, for the ingress to put in the route header
(``app.scheduler.decisions``). Ray pickles this module by value into the processes that
route; anything shared with the ingress code lives in other modules (imported there by
reference), never in this module's globals.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from app.request import InferenceRequest
from app.scheduler.blocks import chain_hashes, routing_salt
from app.scheduler.config import ReplicaRouting
from app.scheduler.kv_feed import KvEventFeed
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest
from app.scheduler.views import register


def routed_request(request: InferenceRequest, config: ReplicaRouting) -> RoutedRequest:
    """The request as the scheduler sees it: salted block hashes of its prompt ids (the
    prompt's UTF-8 bytes stand in when it was not tokenized at the ingress) and its
    tenant-scoped session key."""
    ids: tuple[int, ...] | None = request.prompt.token_ids
    if ids is None:
        ids = tuple(request.prompt.view.encode())
    adapter = request.adapter.id if request.adapter is not None else None
    salt = routing_salt(request.cache_salt, adapter)
    hashes = chain_hashes(ids, config.prefix.block_size, salt)
    session = None
    key = config.session.key
    if key != "none":
        value = request.session_id
        if value is None and key == "session_or_user":
            value = request.user
        if value is not None:
            session = f"{request.tenant or ''}|{value}"
    return RoutedRequest(
        key=request.id, hashes=hashes, prompt_tokens=len(ids), session=session, adapter=adapter
    )


# LLMServer methods whose first argument is the gateway's request: the prefill role's
# ``prefill`` is routed like ``generate`` (prefix affinity on the prefill replicas).
ROUTED_METHODS = ("generate", "prefill")


class SwitchyardRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._config = ReplicaRouting.model_validate(kwargs)
        self._scheduler = Scheduler(self._config)
        self._requests: dict[str, RoutedRequest] = {}  # by Ray's internal request id
        self._feed = KvEventFeed() if self._config.prefix.mode == "precise" else None
        register(self._deployment_id.name, self._scheduler)  # for this process's ingress

    @property
    def feed(self) -> KvEventFeed | None:
        return self._feed

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        ids = [r.replica_id.unique_id for r in replicas]
        self._scheduler.set_replicas(ids)
        if self._feed is not None:
            alive = set(ids)
            for gone in [r for r in self._feed.followed() if r not in alive]:
                self._feed.unfollow(gone)
            self._follow(replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._scheduler.forget(replica_id.unique_id)
        if self._feed is not None:
            self._feed.unfollow(replica_id.unique_id)

    def _follow(self, replicas: list[RunningReplica]) -> None:
        """Precise mode: subscribe to each replica's KV events, apply what arrived."""
        assert self._feed is not None
        for r in replicas:
            endpoint = r.routing_stats.get("kv_events")
            if isinstance(endpoint, str):
                self._feed.follow(r.replica_id.unique_id, endpoint)
        for replica, events in self._feed.drain():
            if self._feed.following(replica) is not None:  # not a replica that left
                self._scheduler.engine_events(replica, events)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        request = _inference_request(pending_request)
        if request is None:  # not a generate call (embed, stats): Ray's order
            return [candidate_replicas]
        internal = pending_request.metadata.internal_request_id
        routed = self._requests.get(internal)
        if routed is None:
            routed = self._requests[internal] = routed_request(request, self._config)
        if self._feed is not None:
            self._follow(candidate_replicas)
        if routed.adapter is not None:  # which replicas' engines hold which adapters
            for r in candidate_replicas:
                held = r.routing_stats.get("adapters")
                if isinstance(held, list):
                    self._scheduler.ctx.adapters.report(r.replica_id.unique_id, held)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        decision = self._scheduler.decide(routed, list(by_id))
        self._scheduler.routed(internal, routed, decision.replica)
        request.replica_note.write(decision)  # read by the ingress (app.request)
        ranked = [by_id[r] for r in decision.ranking]
        return [ranked[:1], ranked[1:]] if len(ranked) > 1 else [ranked]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        internal = pending_request.metadata.internal_request_id
        routed = self._requests.get(internal)
        actual = replica_id.unique_id
        if routed is not None and self._scheduler.ctx.book.booked_on(internal) != actual:
            self._scheduler.routed(internal, routed, actual)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        routed = self._requests.pop(internal_request_id, None)
        self._scheduler.completed(internal_request_id, routed.key if routed else None)


def _inference_request(pending: PendingRequest) -> InferenceRequest | None:
    if pending.metadata.call_method not in ROUTED_METHODS or not pending.args:
        return None
    first = pending.args[0]
    return first if isinstance(first, InferenceRequest) else None
