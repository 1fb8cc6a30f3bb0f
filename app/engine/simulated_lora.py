# SIMULATED multi-LoRA of the simulated engine (vLLM's rules, a timing model).
#
# Rule: the engine holds at most ``max_cpu_loras`` adapters in host memory, least
# recently used first out (an adapter a running request uses is never evicted). A
# request whose adapter is not held is a cold load: admitting it adds ``adapter_load_s``
# to that engine step (every request in the batch waits for it, as vLLM loads adapters
# inside the engine step) and its first delta reports the load time. A batch mixes at
# most ``max_loras`` adapters: a waiting request whose adapter would be one too many is
# skipped and stays at the head of the queue while later requests are admitted (vLLM's
# scheduler skips it the same way). ``max_loras`` 0: LoRA is off, adapters are refused.
#
# Parameters: ``max_loras``, ``max_cpu_loras``, ``adapter_load_s`` (SimulationProfile).
"""Adapter slots of a simulated engine."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class SimulatedLoras:
    def __init__(self, max_loras: int, max_cpu_loras: int, load_s: float) -> None:
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self.load_s = load_s
        self._held: OrderedDict[str, None] = OrderedDict()
        self.loads_total = 0
        self.load_seconds_total = 0.0

    @property
    def enabled(self) -> bool:
        return self.max_loras > 0

    def fits(self, adapter: str, running: set[str]) -> bool:
        """Whether a batch running ``running`` adapters may take one with ``adapter``."""
        return adapter in running or len(running) < self.max_loras

    def acquire(self, adapter: str, running: Iterable[str]) -> float | None:
        """Mark ``adapter`` used; the seconds a cold load takes, None when held."""
        if adapter in self._held:
            self._held.move_to_end(adapter)
            return None
        self._held[adapter] = None
        pinned = set(running) | {adapter}
        for name in list(self._held):
            if len(self._held) <= self.max_cpu_loras:
                break
            if name not in pinned:
                del self._held[name]
        self.loads_total += 1
        self.load_seconds_total += self.load_s
        return self.load_s

    def held(self) -> tuple[str, ...]:
        """Held adapters, least recently used first."""
        return tuple(self._held)
