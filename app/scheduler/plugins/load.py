# Load scorer, and the imbalance rule that lets balance win over affinity.
#
# Rule: load(replica) = requests this router has in flight there + booked prompt tokens
# ÷ ``tokens_per_request`` (``app.scheduler.state``). score = 1 − load ÷ max load over
# the candidates (all idle: 1 everywhere). ``imbalanced`` (SGLang's cache-aware rule, on
# requests in flight): max − min > ``abs_threshold`` and max > ``rel_threshold`` × min;
# then the scheduler ranks by this scorer alone.
#
# Parameters: ``routing.load.abs_threshold``, ``rel_threshold``, ``tokens_per_request``.
"""Load scorer."""

from __future__ import annotations

from collections.abc import Sequence

from app.scheduler.config import LoadRouting
from app.scheduler.plugins import PoolContext
from app.scheduler.state import Candidates, RoutedRequest


class LoadScorer:
    name = "load"

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        top = max(cands.load, default=0.0)
        if top <= 0:
            return [1.0] * len(cands.load)
        return [1.0 - x / top for x in cands.load]


def imbalanced(in_flight: Sequence[int], cfg: LoadRouting) -> bool:
    """Counted in requests in flight (as SGLang counts running requests), not in the
    token-weighted load: one long prompt must not flip the pool into balance mode."""
    if len(in_flight) < 2:
        return False
    high, low = max(in_flight), min(in_flight)
    return high - low > cfg.abs_threshold and high > cfg.rel_threshold * low
