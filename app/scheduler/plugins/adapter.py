# Adapter-affinity scorer.
#
# Rule: a request without a LoRA adapter scores 0 everywhere (the scorer abstains), and
# so does one whose adapter no candidate holds (it is loaded where the other scorers
# send it). Otherwise the replicas holding the adapter (``AdapterPlacement``) score 1
# and the others 0, except:
# - when every holder has ``saturated_in_flight`` or more requests in flight, every
#   replica scores 1 (load decides, and the adapter is loaded on another one);
# - when the adapter is hot (``hot_rps``) and fewer than ``min_replicas`` candidates hold
#   it, the non-holders score 1 and the holders 0, so the next request warms another
#   replica: a hot adapter never stays pinned to one replica (ray#65691, llm-d#709).
#
# Parameters: ``routing.adapter.hot_rps``, ``min_replicas``, ``saturated_in_flight``.
"""Adapter-affinity scorer."""

from __future__ import annotations

from app.scheduler.plugins import PoolContext
from app.scheduler.state import Candidates, RoutedRequest


class AdapterScorer:
    name = "adapter"

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        n = len(cands.ids)
        if request.adapter is None:
            return [0.0] * n
        holders = ctx.adapters.holders(request.adapter, cands.ids)
        if not holders:
            return [0.0] * n
        cfg = ctx.config.adapter
        if len(holders) < min(cfg.min_replicas, n) and (
            ctx.adapters.rate(request.adapter) >= cfg.hot_rps
        ):
            return [0.0 if r in holders else 1.0 for r in cands.ids]
        busy = [f for r, f in zip(cands.ids, cands.in_flight, strict=True) if r in holders]
        if min(busy) >= cfg.saturated_in_flight:
            return [1.0] * n
        return [1.0 if r in holders else 0.0 for r in cands.ids]
