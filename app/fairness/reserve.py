# The free slots of one pool kept for light requests, sized to their demand.
#
# Rule. A request is light when it is not batch and its tenant holds fewer slots than its
# fair part (``app.fairness.queue``); any other request may take a free slot only while
# more than R slots stay free. n: the slots light requests hold now; D: the
# time-weighted mean of n, an exponential average with time constant τ = 4 × the mean
# slot hold (it follows the light demand over a few request lifetimes). A light arrival
# sees n others of its kind running, about Poisson(D) distributed (Poisson arrivals see
# time averages), so keeping T = round(D + z·√D) slots for light requests, held or free,
# leaves one free for it unless n ≥ T (z = 1: about 5 arrivals in 6 once D ≳ 1):
#
#   R = min(C − 1, max(H, T − n)),   H = the fixed headroom (``PoolQueue.headroom``).
#
# With no light demand (T = 0) R is the fixed headroom alone. R < C: on an idle pool any
# request starts, so whoever waits has a running request whose end re-checks the rule.
# D falls back to 0 when no light request has held a slot for the last 2 mean holds (a
# light stream that comes rarely is served by H alone, and the flood gets the slots back
# at once).
#
# Parameters: z (``headroom_sigmas``, 1.0; none: R = H always), τ = 4 mean holds, the
# 2-hold reset.
"""``LightDemand``: the light requests' slots now and on average, and the reserve R."""

from __future__ import annotations

import math
from collections.abc import Callable

TAU_HOLDS = 4.0  # τ, in mean slot holds
RESET_HOLDS = 2.0  # idle this long (mean holds), D falls back to 0


class LightDemand:
    """n and D of the module comment for one pool on one ingress replica."""

    def __init__(self, sigmas: float | None, clock: Callable[[], float]) -> None:
        self.sigmas, self.clock = sigmas, clock
        self.held = 0  # n
        self._mean = 0.0  # D at ``_at``
        self._at = clock()

    def mean(self, hold_s: float) -> float:
        """D now (``hold_s``: the mean slot hold, τ's unit)."""
        dt = max(0.0, self.clock() - self._at)
        if self.held == 0 and dt > RESET_HOLDS * hold_s:
            return 0.0
        tau = max(TAU_HOLDS * hold_s, 1e-9)
        return self.held + (self._mean - self.held) * math.exp(-dt / tau)

    def change(self, delta: int, hold_s: float) -> None:
        """A light request took (+1) or gave back (−1) a slot."""
        self._mean, self._at = self.mean(hold_s), self.clock()
        self.held += delta

    def reserve(self, cap: int, headroom: int, hold_s: float) -> int:
        """R: the free slots a request that is not light must leave (``cap``: C)."""
        if self.sigmas is None:
            return headroom
        d = self.mean(hold_s)
        wanted = max(headroom, round(d + self.sigmas * math.sqrt(d)) - self.held)
        return max(0, min(cap - 1, wanted))
