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

from app.scheduler.plugins import PoolContext
from app.scheduler.state import Candidates, RoutedRequest

NEW_PREFIX_WEIGHT = 0.5  # a new prefix's pull toward empty caches, below any real match


class PrefixScorer:
    name = "prefix"

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        n = len(request.hashes)
        if n == 0:
            return [0.0] * len(cands.ids)
        matched = ctx.matched(request, cands.ids)
        if any(matched.values()):
            return [matched[r] / n for r in cands.ids]
        # A new prefix: prefer the replicas holding the fewest blocks, so new prefixes
        # spread over the caches instead of following momentary load.
        sizes = [ctx.index.size(r) for r in cands.ids]
        top = max(sizes)
        if top == 0:
            return [0.0] * len(sizes)
        return [NEW_PREFIX_WEIGHT * (1.0 - size / top) for size in sizes]
