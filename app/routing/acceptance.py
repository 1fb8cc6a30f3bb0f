# The speculative-decoding health rule's measure: each pool's recent draft acceptance,
# as one gateway replica sees it (seed 003 §5.3: a speculative setting whose acceptance
# is too low for the extra compute to pay is not used).
#
# Rule. A local replica's first delta carries its engine's speculative totals (draft
# tokens proposed and accepted since that engine started, ``SpecCounters``). Per pool
# and engine the last totals are kept; what they grew since — everything at an engine's
# first sighting — is one sample (time, drafted, accepted) of the pool. A pool's
# acceptance is Σ accepted ÷ Σ drafted over its samples younger than ``window_s``;
# None while fewer than ``min_draft_tokens`` were drafted in the window (unknown: the
# rule fails open and the pool is used). The routes stop choosing a speculative pool
# whose acceptance is below its ``draft.min_acceptance`` (``app.routing.table``); it
# then gets no new samples from this replica, so the low measure ages out after
# ``window_s`` and the pool is tried again: the probe.
#
# Parameters: window_s (60 s), min_draft_tokens (256), ENGINES_KEPT per pool (256).
"""``DraftAcceptance``: each pool's draft acceptance over a sliding window."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

from app.engine.protocol import SpecCounters

WINDOW_S = 60.0
MIN_DRAFT_TOKENS = 256
ENGINES_KEPT = 256


class _Pool:
    def __init__(self) -> None:
        self.last: OrderedDict[str, tuple[int, int]] = OrderedDict()  # engine -> totals
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, drafted, accepted)
        self.drafted = 0  # sums over ``samples``
        self.accepted = 0


class DraftAcceptance:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        min_draft_tokens: int = MIN_DRAFT_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.min_draft_tokens = min_draft_tokens
        self._clock = clock
        self._pools: dict[str, _Pool] = {}

    def observe(self, pool: str, spec: SpecCounters) -> None:
        """An answer's first delta from ``pool`` carried ``spec``."""
        p = self._pools.get(pool)
        if p is None:
            p = self._pools[pool] = _Pool()
        drafted0, accepted0 = p.last.pop(spec.engine, (0, 0))
        p.last[spec.engine] = (spec.draft_tokens, spec.accepted_tokens)
        while len(p.last) > ENGINES_KEPT:
            p.last.popitem(last=False)
        drafted = spec.draft_tokens - drafted0
        accepted = spec.accepted_tokens - accepted0
        if drafted < 0 or accepted < 0:  # the totals fell: count them from zero
            drafted, accepted = spec.draft_tokens, spec.accepted_tokens
        if drafted > 0:
            p.samples.append((self._clock(), drafted, accepted))
            p.drafted += drafted
            p.accepted += accepted

    def __call__(self, pool: str) -> float | None:
        """The pool's acceptance over the window; None while unknown (module comment)."""
        p = self._pools.get(pool)
        if p is None:
            return None
        horizon = self._clock() - self.window_s
        while p.samples and p.samples[0][0] < horizon:
            _, drafted, accepted = p.samples.popleft()
            p.drafted -= drafted
            p.accepted -= accepted
        if p.drafted < self.min_draft_tokens:
            return None
        return p.accepted / p.drafted
