# Prefix scorer.
#
# Rule: score(replica) = leading prompt blocks the replica is believed to hold ÷ prompt
# blocks (``PrefixIndex.match``; blocks are ``routing.prefix.block_size`` tokens, salted
# by the tenant's cache salt so tenants never match each other). A prompt shorter than
# one block scores 0 everywhere (nothing to reuse: the scorer abstains).
#
# Parameters: ``routing.prefix.block_size``, ``routing.prefix.max_blocks`` (the index).
"""Prefix-affinity scorer."""

from __future__ import annotations

from collections.abc import Sequence

from app.scheduler.plugins import PoolContext
from app.scheduler.state import ReplicaView, RoutedRequest


class PrefixScorer:
    name = "prefix"

    def score(
        self, request: RoutedRequest, replicas: Sequence[ReplicaView], ctx: PoolContext
    ) -> dict[str, float]:
        n = len(request.hashes)
        if n == 0:
            return {r.id: 0.0 for r in replicas}
        matched = ctx.index.match_all(request.hashes, (r.id for r in replicas))
        return {rid: m / n for rid, m in matched.items()}
