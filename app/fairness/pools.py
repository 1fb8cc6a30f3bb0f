# This ingress replica's fair queues, one per capped pool (``app.fairness.queue``).
#
# Rule. A pool's cap is its engine slots (replicas × max_num_seqs) divided among the
# ingress replicas, rounded up (at least 1); its token caps are per engine replica, times
# its replicas, divided likewise (``app.fairness.token_caps``). A pool of unknown slots
# (an upstream) has no queue. When a new route table changes a pool, its queue keeps
# its waiters and counters and takes the new caps.
"""``FairQueues``: the ``PoolQueue`` of each capped pool on this ingress replica."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.fairness.queue import PoolQueue, QueueSettings
from app.fairness.token_caps import TokenCaps


@dataclass
class FairQueues:
    """This ingress replica's queue per capped pool: a pool's cap is its engine slots
    over the ingress replicas (a pool of unknown slots, an upstream, has none)."""

    settings: QueueSettings = field(default_factory=QueueSettings)
    ingress_replicas: int = 1
    clock: Callable[[], float] = time.monotonic
    on_new: Callable[[str, PoolQueue], None] | None = None  # e.g. its gauges
    _queues: dict[str, PoolQueue] = field(default_factory=dict)

    def of(self, pool: str, slots: int | None, replicas: int = 1) -> PoolQueue | None:
        """``slots``: the pool's engine slots, all replicas; ``replicas``: its engine
        replicas (the token caps are per replica)."""
        if slots is None:
            return None
        cap = max(1, math.ceil(slots / self.ingress_replicas))
        s = self.settings
        tokens = TokenCaps.of(
            s.max_prefill_tokens, s.max_kv_tokens, replicas, self.ingress_replicas
        )
        q = self._queues.get(pool)
        if q is None:
            q = self._queues[pool] = PoolQueue(cap, self.settings, self.clock, tokens=tokens)
            if self.on_new is not None:
                self.on_new(pool, q)
        elif q.cap != cap or q.tokens.caps != tokens:  # the pool changed (a new route table)
            q.cap, q.tokens.caps = cap, tokens
            q._next()
        return q

    def queues(self) -> dict[str, PoolQueue]:
        return dict(self._queues)
