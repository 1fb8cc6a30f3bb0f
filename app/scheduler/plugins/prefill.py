# Prefill scorer: keep a new prompt off replicas that are computing another one.
#
# Rule: pending(replica) = prompt tokens this router sent there that have not had their
# first token yet (``app.scheduler.state.PrefillBook``). score = 1 − pending ÷ the most
# pending over the candidates (none pending anywhere: 1 everywhere, the scorer
# abstains). Why: an engine step that prefills a prompt lasts as long as that prefill, and
# every request that joins the replica meanwhile waits for the step to end before its
# own prefill starts (on the simulated CPU engine a 128-token prefill is 0.19 s, a
# decode step 0.04 s). A replica that is only decoding starts a new prompt within one
# short step; ``docs/fairness.md`` gives what this does to a light tenant's TTFT under a
# flood.
#
# Parameters: none (its weight, ``routing.scorers.prefill``).
"""Pending-prefill scorer."""

from __future__ import annotations

from app.scheduler.plugins import PoolContext
from app.scheduler.state import Candidates, RoutedRequest


class PrefillScorer:
    name = "prefill"

    def score(self, request: RoutedRequest, cands: Candidates, ctx: PoolContext) -> list[float]:
        pending = ctx.prefill.pending(cands.ids)
        top = max(pending, default=0)
        if top <= 0:
            return [1.0] * len(pending)
        return [1.0 - p / top for p in pending]
