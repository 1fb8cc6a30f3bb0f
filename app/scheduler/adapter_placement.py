# Where each LoRA adapter is loaded, as one router sees it, and how hot it is.
#
# Rule: a replica holds an adapter when its last routing stats said so (``adapters``:
# what its engine's host cache held, reported every few seconds) or when this router
# sent it a request with the adapter in the last ``recent_s`` seconds (the engine has
# loaded it by then, before the next stats arrive). An adapter's request rate is an
# exponentially decaying count of this router's sends (time constant ``RATE_TAU_S``),
# in requests per second; above ``hot_rps`` the adapter is hot.
#
# Parameters: ``routing.adapter.hot_rps``, ``recent_s``.
"""Adapter placement and request rates, per router."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

RATE_TAU_S = 10.0


class AdapterPlacement:
    def __init__(self, recent_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.recent_s = recent_s
        self._clock = clock
        self._reported: dict[str, frozenset[str]] = {}
        self._sent: dict[str, dict[str, float]] = {}  # replica -> adapter -> last send
        self._rate: dict[str, tuple[float, float]] = {}  # adapter -> (rate, at)

    def report(self, replica: str, adapters: Iterable[str]) -> None:
        """The replica's stats: the adapters its engine held."""
        self._reported[replica] = frozenset(adapters)

    def routed(self, replica: str, adapter: str) -> None:
        now = self._clock()
        self._sent.setdefault(replica, {})[adapter] = now
        rate, at = self._rate.get(adapter, (0.0, now))
        self._rate[adapter] = (rate * math.exp(-(now - at) / RATE_TAU_S) + 1 / RATE_TAU_S, now)

    def holders(self, adapter: str, replicas: Iterable[str]) -> set[str]:
        since = self._clock() - self.recent_s
        return {
            r for r in replicas
            if adapter in self._reported.get(r, ())
            or self._sent.get(r, {}).get(adapter, -math.inf) >= since
        }  # fmt: skip

    def rate(self, adapter: str) -> float:
        """Requests per second this router sent with ``adapter``, recently."""
        rate, at = self._rate.get(adapter, (0.0, 0.0))
        return rate * math.exp(-(self._clock() - at) / RATE_TAU_S)

    def drop(self, replica: str) -> None:
        self._reported.pop(replica, None)
        self._sent.pop(replica, None)
