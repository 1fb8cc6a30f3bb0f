"""vLLM's own stat objects (real vLLM classes) into the engine family and the KV
connector's counters (app.engine.vllm_stats)."""

from __future__ import annotations

from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    PrefixCacheStats,
    SchedulerStats,
)

from app.engine.kv_transfer import ConnectorCounters
from app.engine.telemetry import EngineTelemetry, RequestTimes
from app.engine.vllm_stats import stat_logger


def _iteration(computed: int, generated: int, preempted: int = 0) -> IterationStats:
    it = IterationStats()
    it.prompt_token_stats.computed = computed
    it.prompt_token_stats.total = computed + 64  # the cached part is not work
    it.num_generation_tokens = generated
    it.num_preempted_reqs = preempted
    return it


def test_scheduler_and_iteration_stats_feed_the_telemetry() -> None:
    t, c = EngineTelemetry(), ConnectorCounters()
    logger = stat_logger(t, c)(None, 0)
    first = SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.4,
                           prefix_cache_stats=PrefixCacheStats(queries=300, hits=128))  # fmt: skip
    logger.record(first, _iteration(computed=172, generated=3))
    done = FinishedRequestStats("length", queued_time=0.25, prefill_time=0.5, decode_time=2.0)
    it = _iteration(computed=0, generated=2, preempted=1)
    it.finished_requests.append(done)
    second = SchedulerStats(num_running_reqs=1, kv_cache_usage=0.1,
                            prefix_cache_stats=PrefixCacheStats(queries=50, hits=0))  # fmt: skip
    logger.record(second, it)
    assert (t.running, t.waiting, t.kv_cache_usage) == (1, 0, 0.1)
    assert (t.prefix_queried_tokens_total, t.prefix_hit_tokens_total) == (350, 128)
    assert (t.preemptions_total, t.steps_total) == (1, 2)
    samples = t.drain()
    assert samples.step_tokens == (175, 2)
    assert samples.requests == (RequestTimes(0.25, 0.5, 2.0),)


def test_the_connector_counters_come_from_the_same_reports() -> None:
    t, c = EngineTelemetry(), ConnectorCounters()
    logger = stat_logger(t, c)(None, 0)
    logger.record(SchedulerStats(kv_connector_stats={"transfer_duration": [0.5],
                                                     "bytes_transferred": [7]}), None)  # fmt: skip
    logger.record(SchedulerStats(), None)  # a step without transfers
    logger.record(None, None)  # neither
    assert (c.transfers, c.bytes, c.seconds) == (1, 7, 0.5)
    assert t.steps_total == 2


def test_without_a_connector_its_stats_are_ignored() -> None:
    t = EngineTelemetry()
    stats = SchedulerStats(kv_connector_stats={"bytes_transferred": [7]})
    stat_logger(t)(None, 0).record(stats, None)
    assert t.steps_total == 1


def test_spec_decoding_stats_feed_the_speculative_totals() -> None:
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    t = EngineTelemetry()
    logger = stat_logger(t)(None, 0)
    spec = SpecDecodingStats.new(num_spec_tokens=4)
    spec.observe_draft(num_draft_tokens=4, num_accepted_tokens=3)
    spec.observe_draft(num_draft_tokens=2, num_accepted_tokens=0)
    logger.record(SchedulerStats(spec_decoding_stats=spec), None)
    logger.record(SchedulerStats(), None)  # a step without drafts
    again = SpecDecodingStats.new(num_spec_tokens=4)
    again.observe_draft(num_draft_tokens=4, num_accepted_tokens=4)
    logger.record(SchedulerStats(spec_decoding_stats=again), None)
    assert (t.spec_drafts_total, t.spec_draft_tokens_total, t.spec_accepted_tokens_total) == (
        3,
        10,
        7,
    )
