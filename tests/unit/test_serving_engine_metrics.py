"""EngineMetrics (app.serving.engine_metrics): an engine's stats as the catalog's
replica families, counters as increments, histograms from drained samples."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.engine.protocol import EngineStats
from app.engine.telemetry import EngineTelemetry
from app.observability import catalog
from app.serving.engine_metrics import EngineMetrics, publish_forever


@dataclass
class Recorder:
    metric: catalog.Metric
    calls: list[tuple[str, float, dict[str, str] | None]] = field(default_factory=list)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("set", value, tags))

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("inc", value, tags))

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("observe", value, tags))


def _metrics() -> tuple[EngineMetrics, dict[str, Recorder]]:
    made: dict[str, Recorder] = {}

    def factory(m: catalog.Metric) -> Recorder:
        made[m.name] = Recorder(m)
        return made[m.name]

    return EngineMetrics("m", factory), made


def _stats(queried: int, hits: int, preempted: int) -> EngineStats:
    return EngineStats(running=2, waiting=1, aborted_total=0, finished_total=0,
                       kv_cache_usage=0.25, prefix_queried_tokens_total=queried,
                       prefix_hit_tokens_total=hits, preemptions_total=preempted)  # fmt: skip


def test_every_replica_family_of_the_catalog_is_made() -> None:
    _, made = _metrics()
    assert set(made) == {m.name for m in catalog.METRICS if m.source == "replica"}


def test_counters_grow_by_increments_and_never_go_back() -> None:
    metrics, made = _metrics()
    metrics.publish(_stats(100, 40, 0), None)
    metrics.publish(_stats(160, 40, 1), None)
    metrics.publish(_stats(10, 5, 0), None)  # the engine restarted: nothing is added
    metrics.publish(_stats(30, 5, 0), None)
    tag = {"model": "m"}
    assert made["switchyard_engine_prefix_cache_queried_tokens"].calls == [
        ("inc", 100, tag), ("inc", 60, tag), ("inc", 20, tag)]  # fmt: skip
    assert made["switchyard_engine_prefix_cache_hit_tokens"].calls == [("inc", 40, tag)]
    assert made["switchyard_engine_preemptions"].calls == [("inc", 1, tag)]
    assert made["switchyard_engine_running_requests"].calls[-1] == ("set", 2, tag)
    assert made["switchyard_engine_waiting_requests"].calls[-1] == ("set", 1, tag)
    assert made["switchyard_engine_kv_cache_usage_ratio"].calls[-1] == ("set", 0.25, tag)


def test_histograms_observe_each_drained_sample_once() -> None:
    metrics, made = _metrics()
    t = EngineTelemetry()
    t.step(1, 0, 0.1, tokens=300)
    t.finished(0.5, 1.5, 3.0)
    metrics.publish(_stats(0, 0, 0), t)
    metrics.publish(_stats(0, 0, 0), t)  # nothing new
    values = {n: [c[1] for c in made[n].calls] for n in made if made[n].metric.kind == "histogram"}
    assert values == {
        "switchyard_engine_step_tokens": [300],
        "switchyard_engine_queue_seconds": [0.5],
        "switchyard_engine_prefill_seconds": [1.5],
        "switchyard_engine_decode_seconds": [3.0],
    }


async def test_a_failing_read_is_retried_at_the_next_interval() -> None:
    metrics, made = _metrics()
    reads = 0

    def read() -> tuple[EngineStats, EngineTelemetry | None]:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise RuntimeError("engine gone for a moment")
        return _stats(5, 0, 0), None

    task = asyncio.ensure_future(publish_forever(metrics, read, interval_s=0.001))
    for _ in range(5000):  # bounded: a publisher that stopped after the failure fails here
        if reads >= 3:
            break
        await asyncio.sleep(0.001)
    task.cancel()
    assert reads >= 3, "the publisher did not read again after a failed read"
    assert made["switchyard_engine_prefix_cache_queried_tokens"].calls[0][1] == 5


def test_speculative_totals_become_the_spec_decode_counters() -> None:
    metrics, made = _metrics()
    for drafts, drafted, accepted in [(10, 40, 30), (10, 40, 30), (25, 100, 61)]:
        metrics.publish(EngineStats(running=0, waiting=0, aborted_total=0, finished_total=0,
                                    spec_drafts_total=drafts, spec_draft_tokens_total=drafted,
                                    spec_accepted_tokens_total=accepted), None)  # fmt: skip
    grew = {
        name: [v for kind, v, _ in made[f"switchyard_engine_spec_decode_{name}"].calls]
        for name in ("drafts", "draft_tokens", "accepted_tokens")
    }
    assert grew == {"drafts": [10, 15], "draft_tokens": [40, 60], "accepted_tokens": [30, 31]}
