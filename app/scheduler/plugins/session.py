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

from app.scheduler.plugins import PoolContext
from app.scheduler.state import Candidates, RoutedRequest


class SessionScorer:
    name = "session"

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        out = [0.0] * len(cands.ids)
        if request.session is not None:
            loads = dict(zip(cands.ids, cands.in_flight, strict=True))
            owner = ctx.ring.owner(request.session, loads)
            if owner is not None:
                out[cands.ids.index(owner)] = 1.0
        return out
