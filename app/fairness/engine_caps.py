# The engines' own load as a limit on one pool's cap (``app.fairness.queue``).
#
# Rule. The queue's cap C counts only this ingress replica's requests; the engines may
# be full before it is reached (other ingress replicas or clients share them, long
# prompts fill the KV cache). Each answer's first delta carries its replica's engine
# load (running and waiting requests, KV-cache usage): ``observe``. A view is full when
# waiting > engine_max_waiting or KV usage ≥ engine_max_kv_usage. When every view
# younger than engine_stale_s is full, the cap is frozen at the requests running then:
# a leave lets one waiter in, as a freed slot would, but nothing more starts. A view
# that is not full lifts the freeze at once; engine_stale_s without a newer full view
# lifts it too (fail open to C alone). Each freeze counts as "held", each lapse as
# "stale".
#
# Parameters (``QueueSettings``): engine_max_waiting (2), engine_max_kv_usage (0.95),
# engine_stale_s (5 s).
"""``EngineCaps``: the latest engine view of each replica of one pool, and the freeze."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from app.engine.protocol import EngineLoad

EngineCap = Literal["held", "stale"]


class EngineCaps:
    """One pool's replica views on one ingress replica (module comment)."""

    def __init__(
        self, max_waiting: int, max_kv_usage: float, stale_s: float, clock: Callable[[], float]
    ) -> None:
        self.max_waiting, self.max_kv_usage, self.stale_s = max_waiting, max_kv_usage, stale_s
        self.clock = clock
        self._views: dict[str, tuple[EngineLoad, float]] = {}  # replica → (load, when)
        self.frozen: int | None = None  # the cap while every fresh view is full
        self.frozen_at = 0.0  # the last full view's time
        self.counts: dict[EngineCap, int] = {"held": 0, "stale": 0}
        self.on_count: Callable[[EngineCap], None] | None = None  # e.g. a counter

    def limit(self, cap: int) -> int:
        """``cap``, or the frozen count while the freeze holds (it lapses here)."""
        if self.frozen is None:
            return cap
        if self.clock() - self.frozen_at > self.stale_s:
            self.frozen = None  # no newer full view: fail open
            self._views.clear()
            self._count("stale")
            return cap
        return min(cap, self.frozen)

    def observe(self, replica: str, load: EngineLoad, running: int) -> bool:
        """Take ``replica``'s view, ``running`` requests of this pool now; True when a
        freeze was lifted (waiters may start)."""
        now = self.clock()
        self._views[replica] = (load, now)
        for name in [n for n, (_, at) in self._views.items() if now - at > self.stale_s]:
            del self._views[name]
        if all(self.full(v) for v, _ in self._views.values()):
            if self.frozen is None:
                self._count("held")
            self.frozen, self.frozen_at = running, now
            return False
        lifted = self.frozen is not None
        self.frozen = None
        return lifted

    def full(self, load: EngineLoad) -> bool:
        return load.waiting > self.max_waiting or load.kv_cache_usage >= self.max_kv_usage

    def due_s(self) -> float:
        """Seconds until the freeze lapses without a newer full view."""
        return max(0.0, self.frozen_at + self.stale_s - self.clock())

    def _count(self, kind: EngineCap) -> None:
        self.counts[kind] += 1
        if self.on_count is not None:
            self.on_count(kind)
