# The engine family of one LLMServer replica, exported through Ray's metrics.
#
# Rule. Every ``interval_s`` the replica reads its engine's stats and telemetry
# (app.engine.telemetry) and publishes them as the catalog's ``source="replica"``
# families (app.observability.catalog): gauges set to the last value; counters
# increased by what they grew since the previous publish (an engine restart that
# lowers a total adds nothing); histograms observe the finished requests' and steps'
# samples drained since then. Ray Serve adds the ``deployment``, ``replica`` and
# ``application`` labels, and Ray's metrics export (one endpoint per node, what
# KubeRay's PodMonitor scrapes) serves them as ``ray_<name>``; every replica is its own
# series, so histograms aggregate across replicas with ``sum by (le)``.
#
# Parameters: interval_s (2 s).
"""``EngineMetrics``: an engine's stats published as Prometheus families."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from app.engine.protocol import EngineStats
from app.engine.telemetry import EngineTelemetry
from app.observability import catalog

log = logging.getLogger(__name__)

INTERVAL_S = 2.0


class Family(Protocol):
    """What a ``ray.serve.metrics`` family offers (a test's recorder offers the same)."""

    def set(self, value: float, tags: dict[str, str] | None = None) -> None: ...
    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None: ...
    def observe(self, value: float, tags: dict[str, str] | None = None) -> None: ...


Factory = Callable[[catalog.Metric], Family]

COUNTERS = {
    "switchyard_engine_prefix_cache_queried_tokens": "prefix_queried_tokens_total",
    "switchyard_engine_prefix_cache_hit_tokens": "prefix_hit_tokens_total",
    "switchyard_engine_preemptions": "preemptions_total",
    "switchyard_engine_busy_seconds": "busy_seconds_total",
    "switchyard_engine_spec_decode_drafts": "spec_drafts_total",
    "switchyard_engine_spec_decode_draft_tokens": "spec_draft_tokens_total",
    "switchyard_engine_spec_decode_accepted_tokens": "spec_accepted_tokens_total",
}


def ray_family(metric: catalog.Metric) -> Family:
    """The ``ray.serve.metrics`` family of ``metric`` (Ray Serve adds its labels)."""
    from ray.serve import metrics

    keys: Any = tuple(metric.labels)  # Ray annotates tag_keys as tuple[str]
    family: Any
    if metric.kind == "counter":
        family = metrics.Counter(metric.name, metric.help, tag_keys=keys)
    elif metric.kind == "gauge":
        family = metrics.Gauge(metric.name, metric.help, tag_keys=keys)
    else:
        family = metrics.Histogram(
            metric.name, metric.help, boundaries=list(metric.buckets), tag_keys=keys
        )
    return family  # type: ignore[no-any-return]


class EngineMetrics:
    def __init__(self, model: str, factory: Factory = ray_family) -> None:
        self._tags = {"model": model}
        engine = [m for m in catalog.METRICS if m.source == "replica"]
        self._families = {m.name: factory(m) for m in engine}
        self._last: dict[str, float] = dict.fromkeys(COUNTERS.values(), 0.0)

    def publish(self, stats: EngineStats, telemetry: EngineTelemetry | None) -> None:
        f, tags = self._families, self._tags
        f["switchyard_engine_running_requests"].set(stats.running, tags)
        f["switchyard_engine_waiting_requests"].set(stats.waiting, tags)
        f["switchyard_engine_kv_cache_usage_ratio"].set(stats.kv_cache_usage, tags)
        for name, field in COUNTERS.items():
            now = float(getattr(stats, field))
            grew = now - self._last[field]
            self._last[field] = now
            if grew > 0:
                f[name].inc(grew, tags)
        if telemetry is None:
            return
        samples = telemetry.drain()
        for tokens in samples.step_tokens:
            f["switchyard_engine_step_tokens"].observe(tokens, tags)
        for r in samples.requests:
            f["switchyard_engine_queue_seconds"].observe(r.queued_s, tags)
            f["switchyard_engine_prefill_seconds"].observe(r.prefill_s, tags)
            f["switchyard_engine_decode_seconds"].observe(r.decode_s, tags)


async def publish_forever(
    metrics: EngineMetrics,
    read: Callable[[], tuple[EngineStats, EngineTelemetry | None]],
    interval_s: float = INTERVAL_S,
) -> None:
    """Publish every ``interval_s`` until cancelled; a failed read is logged and
    retried at the next interval (metrics never fail the replica)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            metrics.publish(*read())
        except Exception:
            log.exception("engine metrics: publish failed")
