# The engine metric family, as each engine keeps it from its own statistics.
#
# Rule. An engine updates one ``EngineTelemetry`` as it works: after each step the
# gauges (requests running and waiting, the fraction of KV-cache blocks in use), the
# tokens that step processed and the step's time (its busy seconds); at each admission
# the prompt tokens looked up in the prefix cache and the ones found; each preemption;
# and once per finished request its queue time (arrival to first scheduled), prefill
# time (first scheduled to first token) and decode time (first token to last). The vLLM
# engine fills it from vLLM's own stats (``app.engine.vllm_stats``), the simulated
# engine from its scheduler, under the same names. The replica's exporter
# (``app.serving.engine_metrics``) reads the gauges and counters and drains the
# per-request and per-step samples into histograms; samples nobody drained are bounded
# (``keep`` of each, the oldest dropped). With speculative decoding on, each step's
# drafts: how many, the draft tokens proposed and the ones the target accepted (vLLM's
# ``SpecDecodingStats``; acceptance = accepted / drafted tokens).
#
# Parameters: keep = 4096.
"""``EngineTelemetry``: one engine's gauges, counters and latency samples."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from app.engine.protocol import RequestTimes

__all__ = ["EngineTelemetry", "RequestTimes", "Samples"]


@dataclass(frozen=True)
class Samples:
    """What ``EngineTelemetry.drain`` hands over: finished requests and step sizes."""

    requests: tuple[RequestTimes, ...]
    step_tokens: tuple[int, ...]


class EngineTelemetry:
    def __init__(self, keep: int = 4096) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0  # fraction of KV blocks in use, 0..1
        self.steps_total = 0
        self.prefix_queried_tokens_total = 0
        self.prefix_hit_tokens_total = 0
        self.preemptions_total = 0
        self.busy_seconds_total = 0.0  # the engine's own step times, summed
        self.spec_drafts_total = 0  # speculative decoding: drafts proposed
        self.spec_draft_tokens_total = 0  # ... their tokens
        self.spec_accepted_tokens_total = 0  # ... the tokens the target model accepted
        self._requests: deque[RequestTimes] = deque(maxlen=keep)
        self._steps: deque[int] = deque(maxlen=keep)

    def step(self, running: int, waiting: int, kv_cache_usage: float, tokens: int) -> None:
        """One engine step (or one stats interval of vLLM's) processed ``tokens``."""
        self.running, self.waiting = running, waiting
        self.kv_cache_usage = min(1.0, max(0.0, kv_cache_usage))
        self.steps_total += 1
        if tokens > 0:
            self._steps.append(tokens)

    def busy(self, seconds: float) -> None:
        """The engine spent ``seconds`` computing a step (its own measure)."""
        self.busy_seconds_total += max(0.0, seconds)

    def prefix_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        self.prefix_queried_tokens_total += queried_tokens
        self.prefix_hit_tokens_total += hit_tokens

    def speculated(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None:
        """Speculative decoding's drafts of one step (or stats interval)."""
        self.spec_drafts_total += drafts
        self.spec_draft_tokens_total += draft_tokens
        self.spec_accepted_tokens_total += accepted_tokens

    def preempted(self, requests: int) -> None:
        self.preemptions_total += requests

    def finished(self, queued_s: float, prefill_s: float, decode_s: float) -> None:
        self._requests.append(
            RequestTimes(max(0.0, queued_s), max(0.0, prefill_s), max(0.0, decode_s))
        )

    def drain(self) -> Samples:
        """The samples recorded since the last drain (at most ``keep`` of each)."""
        out = Samples(tuple(self._requests), tuple(self._steps))
        self._requests.clear()
        self._steps.clear()
        return out
