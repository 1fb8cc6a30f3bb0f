# Prefix scorer.
#
# Rule: score(replica) = leading prompt blocks the replica is believed to hold ÷ prompt
# blocks (``PrefixIndex.match``; blocks are ``routing.prefix.block_size`` tokens, salted
# by the tenant's cache salt so tenants never match each other). A prompt no replica
# holds any block of is a new prefix: score = NEW_PREFIX_WEIGHT × (1 − the replica's
# indexed blocks ÷ the most any candidate has), so new prefixes go to the emptiest
# caches (SGLang's and Ray's "smallest tree"). A prompt shorter than one block scores 0
# everywhere (nothing to reuse: the scorer abstains).
#
# Parameters: ``routing.prefix.block_size``, ``routing.prefix.max_blocks`` (the index).
"""Prefix-affinity scorer."""

from __future__ import annotations

from collections.abc import Sequence

from app.scheduler.plugins import PoolContext
from app.scheduler.state import ReplicaView, RoutedRequest

NEW_PREFIX_WEIGHT = 0.5  # a new prefix's pull toward empty caches, below any real match


class PrefixScorer:
    name = "prefix"

    def score(
        self, request: RoutedRequest, replicas: Sequence[ReplicaView], ctx: PoolContext
    ) -> dict[str, float]:
        n = len(request.hashes)
        if n == 0:
            return {r.id: 0.0 for r in replicas}
        matched = ctx.matched(request, [r.id for r in replicas])
        if any(matched.values()):
            return {rid: m / n for rid, m in matched.items()}
        # A new prefix: prefer the replicas holding the fewest blocks, so new prefixes
        # spread over the caches instead of following momentary load.
        sizes = {r.id: ctx.index.size(r.id) for r in replicas}
        top = max(sizes.values())
        if top == 0:
            return {rid: 0.0 for rid in sizes}
        return {rid: NEW_PREFIX_WEIGHT * (1.0 - size / top) for rid, size in sizes.items()}
