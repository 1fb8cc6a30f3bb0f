"""vLLM's own statistics into Switchyard's engine family: a vLLM stat logger that feeds
an ``EngineTelemetry`` (and the KV connector's counters, when there is a connector).

vLLM hands every stat logger, per engine-core output batch, the scheduler's stats
(requests running and waiting, KV-cache usage, the prefix-cache lookups since the
previous report, the connector's transfer stats) and the iteration's (prompt tokens
computed, neither cached nor pulled, and tokens generated; preemptions; the requests
that finished, with their queue, prefill and decode times), the speculative drafts of
the interval (with a ``speculative_config``), and — with iteration
details on — each step's own time (the engine's busy total, against which the GPU-time
attribution of ``app.engine.vllm_gpu_time`` is checked).
With a custom logger vLLM turns its stats on and its own loggers (log lines, its
Prometheus registry) off."""

from __future__ import annotations

from typing import Any

from app.engine.kv_transfer import ConnectorCounters
from app.engine.telemetry import EngineTelemetry


def record(
    telemetry: EngineTelemetry,
    connector: ConnectorCounters | None,
    scheduler_stats: Any,
    iteration_stats: Any,
) -> None:
    """One report of vLLM's stats (either may be None) into ``telemetry``."""
    tokens = 0
    if iteration_stats is not None:
        computed = iteration_stats.prompt_token_stats.computed  # not cached nor pulled
        tokens = computed + iteration_stats.num_generation_tokens
        telemetry.preempted(iteration_stats.num_preempted_reqs)
        for done in iteration_stats.finished_requests:
            telemetry.finished(done.queued_time, done.prefill_time, done.decode_time)
    if scheduler_stats is None:
        return
    telemetry.step(
        scheduler_stats.num_running_reqs,
        scheduler_stats.num_waiting_reqs,
        scheduler_stats.kv_cache_usage,
        tokens,
    )
    details = getattr(scheduler_stats, "iteration_details", None)
    if details is not None and not details.is_dummy:
        telemetry.busy(details.elapsed_ms / 1000)
    prefix = scheduler_stats.prefix_cache_stats
    if prefix is not None:
        telemetry.prefix_lookup(prefix.queries, prefix.hits)
    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
    if spec is not None:
        telemetry.speculated(spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)
    data = getattr(scheduler_stats, "kv_connector_stats", None)
    if data and connector is not None:
        connector.observe(data)


def stat_logger(telemetry: EngineTelemetry, connector: ConnectorCounters | None = None) -> Any:
    """A vLLM stat-logger factory feeding ``telemetry`` (and ``connector``)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SwitchyardLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            record(telemetry, connector, scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _SwitchyardLogger
