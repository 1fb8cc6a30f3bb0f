# Session scorer.
#
# Rule: a request with a session key scores 1 on the replica the bounded-load
# consistent-hash ring assigns to the key (``app.scheduler.session_ring``) and 0 on the
# others; without a key every replica scores 0 (the scorer abstains).
#
# Parameters: ``routing.session.key`` (which request field is the key; read by the
# router), ``epsilon``, ``virtual_nodes``.
"""Session-affinity scorer."""

from __future__ import annotations

from collections.abc import Sequence

from app.scheduler.plugins import PoolContext
from app.scheduler.state import ReplicaView, RoutedRequest


class SessionScorer:
    name = "session"

    def score(
        self, request: RoutedRequest, replicas: Sequence[ReplicaView], ctx: PoolContext
    ) -> dict[str, float]:
        if request.session is None:
            return {r.id: 0.0 for r in replicas}
        loads = {r.id: r.in_flight for r in replicas}
        owner = ctx.ring.owner(request.session, loads, lambda rid: loads[rid])
        return {r.id: 1.0 if r.id == owner else 0.0 for r in replicas}
