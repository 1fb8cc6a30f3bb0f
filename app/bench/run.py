"""One benchmark run, end to end: configuration → stages → result dict.

Modes: ``open`` (one open-loop stage at ``rate``), ``closed`` (one closed-loop stage of
``concurrency`` users) and ``ramp`` (stages of increasing concurrency, closed loop, or
of increasing rates, open loop). Every stage has a warm-up window (left out of the
aggregates) and a steady-state window. The ramp stops after the first stage whose
error rate exceeds ``slo.max_error_rate`` or whose p95 of ``slo.p95_metric`` exceeds
that SLO, and reports the last safe stage (seed 003 §8.2). The result's shape is
described in ``app.bench.report``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, SecretStr

from app.bench import metrics
from app.bench.agentic import AgenticWorkload
from app.bench.client import Client, wait_ready
from app.bench.metadata import collect_metadata
from app.bench.per_dollar import per_dollar
from app.bench.prompts import HFCounter, PromptFactory, SimulatedCounter, TokenCounter
from app.bench.records import RequestRecord
from app.bench.report import SCHEMA
from app.bench.runner import Jobs, Recorder, RequestJobs, SessionJobs, closed_loop, open_loop
from app.bench.schedule import DEFAULT_CONCURRENCY_STAGES, Arrival, arrivals
from app.bench.selfcheck import SelfCheck, gc_paused
from app.bench.server_metrics import delta, parse, scrape
from app.bench.specs import FixedSpec, WorkloadSpec, build_workload
from app.bench.trace import TraceWorkload
from app.bench.workloads import Workload
from app.schema import Strict
from app.stats import percentile

Progress = Callable[[str, bool], None]
"""(message, always): ``always`` marks stage changes; the rest are periodic updates."""


class BenchConfig(Strict):
    """Everything a run depends on (written into the result)."""

    base_url: str = "http://127.0.0.1:8000"
    api_key: SecretStr | None = None
    model: str | None = Field(default=None, description="default: the first listed model")
    embed_model: str | None = None
    mode: Literal["open", "closed", "ramp"] = "open"
    rate: float = Field(default=10.0, gt=0)
    arrival: Arrival = "poisson"
    burstiness: float = Field(default=1.0, gt=0)
    num_requests: int | None = Field(default=None, ge=1)
    concurrency: int = Field(default=8, ge=1)
    think_s: float = Field(default=0.0, ge=0)
    ramp_by: Literal["concurrency", "rate"] = "concurrency"
    stages: list[float] = Field(
        default_factory=lambda: [float(s) for s in DEFAULT_CONCURRENCY_STAGES]
    )
    warmup_s: float = Field(default=10.0, ge=0)
    duration_s: float = Field(default=60.0, gt=0)
    workload: WorkloadSpec = Field(default_factory=FixedSpec)
    tokenizer: str | None = Field(default=None, description="HF tokenizer dir; default simulated")
    max_model_len: int | None = Field(default=None, ge=2)
    time_scale: float = Field(
        default=1.0,
        gt=0,
        description="trace timestamps are multiplied by this (0.5: twice as fast)",
    )
    slo: metrics.SLO = Field(default_factory=metrics.SLO)
    hourly_usd: float | None = Field(
        default=None,
        gt=0,
        description="The served hardware's price per hour (all of it): goodput per dollar "
        "per workload class and tenant (app.bench.per_dollar)",
    )
    timeout_s: float = Field(default=600.0, gt=0)
    ready_timeout_s: float = Field(default=60.0, ge=0)
    """How long to wait for ``GET /v1/models`` to answer before giving up."""
    seed: int = 0
    engine: str | None = None
    engine_version: str | None = None

    def public(self) -> dict[str, Any]:
        """The configuration without secrets (API keys become the tenants they serve)."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        keys = data["workload"].pop("tenant_keys", None)
        if keys:
            data["workload"]["tenants_with_keys"] = sorted(keys)
        return data


async def execute(config: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    key = config.api_key.get_secret_value() if config.api_key else None
    agentic = config.workload.kind == "agentic"
    t0 = time.perf_counter()
    async with Client(
        config.base_url,
        api_key=key,
        timeout_s=config.timeout_s,
        keep_text=agentic,
        clock=lambda: time.perf_counter() - t0,
    ) as client:
        listing = await wait_ready(client, config.ready_timeout_s)
        model, embed_model, info = _pick_models(config, listing.get("data") or [])
        max_len = config.max_model_len or (info or {}).get("max_model_len") or 2048
        counter: TokenCounter = (
            HFCounter.from_path(config.tokenizer) if config.tokenizer else SimulatedCounter()
        )
        workload = build_workload(
            config.workload,
            model=model,
            factory=PromptFactory(counter, config.seed),
            max_model_len=int(max_len),
            seed=config.seed,
            embed_model=embed_model,
        )
        jobs: Jobs = (
            SessionJobs(workload)
            if isinstance(workload, AgenticWorkload)
            else RequestJobs(workload)
        )
        rec = Recorder(client)
        check = SelfCheck(clock=client.clock)
        check.start()
        ticker = asyncio.create_task(_progress(rec, progress)) if progress else None
        try:
            with gc_paused():
                stages, ramp = await _run_stages(config, rec, jobs, workload, progress)
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            await check.stop()
    measured = [r for r in rec.records if not r.warmup]
    summary = metrics.summarize(measured, config.slo)
    describe = workload.describe()
    return {
        "schema": SCHEMA,
        "metadata": collect_metadata(
            model_info=info,
            engine=config.engine or (info or {}).get("owned_by"),
            engine_version=config.engine_version,
            dataset=str(describe.get("dataset", config.workload.kind)),
            input_lengths=str(describe.get("input_lengths", "see workload")),
            output_lengths=str(describe.get("output_lengths", "see workload")),
            concurrency=_load_text(config),
            warmup=f"{config.warmup_s:g} s per stage",
            duration=f"{config.duration_s:g} s per stage (steady state)",
            sampling=_sampling(config),
        ),
        "config": {
            **config.public(),
            "model": model,
            "embed_model": embed_model,
            "max_model_len": max_len,
        },
        "workload": describe,
        "stages": stages,
        "summary": summary,
        "by_kind": metrics.by_kind(measured, config.slo, summary["duration_s"]),
        "per_dollar": None
        if config.hourly_usd is None
        else per_dollar(measured, config.slo, config.hourly_usd, summary["duration_s"]),
        "sessions": metrics.sessions(measured),
        "self_check": check.report(
            [r.lag for r in measured if not math.isnan(r.sent)],
            rec.max_in_flight,
            rec.windows,
        ),
        "connections": _connections(rec.records, client.max_open_streams),
        "ramp": ramp,
        "records": [r.to_json() for r in rec.records],
    }


def _pick_models(
    config: BenchConfig, models: list[dict[str, Any]]
) -> tuple[str, str, dict[str, Any] | None]:
    """The generation model (given, else the first listed that is not an embedding
    model), the embedding model (given, else the first listed embedding model) and the
    listing entry of the former."""
    generate = [m["id"] for m in models if m.get("task", "generate") != "embed"]
    embed = [m["id"] for m in models if m.get("task") == "embed"]
    model = config.model or (generate[0] if generate else "default")
    embed_model = config.embed_model or (embed[0] if embed else model)
    info = next((m for m in models if m.get("id") == model), None)
    return model, embed_model, info


async def _run_stages(
    config: BenchConfig,
    rec: Recorder,
    jobs: Jobs,
    workload: Workload,
    progress: Progress | None,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    plan = _stage_plan(config)
    results: list[dict[str, Any]] = []
    ramp: dict[str, Any] | None = None
    if config.mode == "ramp":
        ramp = {"stopped": False, "stop_stage": None, "reason": None, "last_safe_stage": None}
    for index, (rate, users) in enumerate(plan):
        label = f"rate={rate:g}/s" if rate is not None else f"c={users}"
        rec.stage_label = f"stage {index + 1}/{len(plan)} {label}"
        if progress:
            progress(
                f"{rec.stage_label}: warm-up {config.warmup_s:g} s, steady {config.duration_s:g} s",
                True,
            )
        first = len(rec.records)
        before = parse(await scrape(None, config.base_url))
        began = rec.clock()
        schedule: dict[str, Any] | None = None
        if rate is not None:
            offsets = _offsets(config, rate, workload)
            start = await open_loop(rec, jobs, offsets, stage=index, warmup_s=config.warmup_s)
            schedule = _schedule_accuracy(rec.records[first:], offsets, start)
        else:
            assert users is not None
            await closed_loop(
                rec,
                jobs,
                users,
                stage=index,
                warmup_s=config.warmup_s,
                duration_s=config.duration_s,
                think_s=config.think_s,
                seed=config.seed + index,
                max_jobs=config.num_requests,
            )
        rec.windows.append((began + config.warmup_s, rec.clock()))
        server = delta(before, parse(await scrape(None, config.base_url)))
        stage_records = [r for r in rec.records[first:] if not r.warmup]
        summary = metrics.summarize(stage_records, config.slo)
        safe, reason = _verdict(summary, config.slo)
        sent = sum(1 for r in stage_records if r.step in (None, 0))
        results.append(
            {
                "stage": index,
                "label": label,
                "rate": rate,
                "concurrency": users,
                "offered_rps": rate if rate is not None else sent / config.duration_s,
                "summary": summary,
                "safe": safe,
                "reason": reason,
                "schedule": schedule,
                "server": server,
            }
        )
        if ramp is not None:
            if not safe:
                ramp.update(stopped=True, stop_stage=index, reason=reason)
                break
            ramp["last_safe_stage"] = index
    return results, ramp


def _schedule_accuracy(
    records: list[RequestRecord], offsets: list[float], start: float
) -> dict[str, Any]:
    """How faithfully an open-loop stage kept its schedule: the planned rate (jobs over
    the last planned offset) next to the achieved one (jobs over the last actual send)."""
    sends = [r.sent for r in records if r.step in (None, 0) and not math.isnan(r.sent)]
    planned = len(offsets) / offsets[-1] if offsets and offsets[-1] > 0 else None
    achieved = len(sends) / (max(sends) - start) if sends and max(sends) > start else None
    return {
        "jobs": len(offsets),
        "planned_rps": planned,
        "achieved_rps": achieved,
        "achieved_error": (achieved - planned) / planned if planned and achieved else None,
    }


def _stage_plan(config: BenchConfig) -> list[tuple[float | None, int | None]]:
    if config.mode == "open":
        return [(config.rate, None)]
    if config.mode == "closed":
        return [(None, config.concurrency)]
    if config.ramp_by == "rate":
        return [(float(s), None) for s in config.stages]
    return [(None, int(s)) for s in config.stages]


def _offsets(config: BenchConfig, rate: float, workload: Workload) -> list[float]:
    """A timed trace replays on its own clock in open mode; otherwise the arrival
    schedule at ``rate``."""
    if config.mode == "open" and isinstance(workload, TraceWorkload):
        offsets = workload.offsets(config.time_scale)
        if offsets is not None:
            return offsets
    n = config.num_requests or max(1, round(rate * (config.warmup_s + config.duration_s)))
    return arrivals(config.arrival, rate, n, burstiness=config.burstiness, seed=config.seed)


def _verdict(summary: dict[str, Any], slo: metrics.SLO) -> tuple[bool, str | None]:
    if summary["requests"] == 0:
        return False, "no request completed in the steady-state window"
    if summary["error_rate"] > slo.max_error_rate:
        return False, (f"error rate {summary['error_rate']:.1%} > {slo.max_error_rate:.1%}")
    limit = slo.limit(slo.p95_metric)
    p95 = summary[f"{slo.p95_metric}_s"]["p95"]
    if limit is not None and p95 is not None and p95 > limit:
        return False, f"p95 {slo.p95_metric} {p95:.3f} s > SLO {limit:.3f} s"
    return True, None


def _connections(records: list[RequestRecord], max_streams: int) -> dict[str, Any]:
    measured = [r for r in records if not r.warmup]
    errors: dict[str, int] = {}
    for r in measured:
        if not r.ok:
            errors[str(r.error_kind)] = errors.get(str(r.error_kind), 0) + 1
    return {
        "opened": sum(r.opened for r in measured),
        "completed": sum(r.ok for r in measured),
        "failed": sum(not r.ok for r in measured),
        "never_opened": sum(not r.opened for r in measured),
        "errors": errors,
        "max_concurrent_streams": max_streams,
    }


def _load_text(config: BenchConfig) -> str:
    if config.mode == "open":
        return f"open loop, {config.arrival} arrivals at {config.rate:g} req/s" + (
            f" (burstiness {config.burstiness:g})" if config.arrival == "gamma" else ""
        )
    if config.mode == "closed":
        return f"closed loop, {config.concurrency} users, think time {config.think_s:g} s"
    unit = "req/s" if config.ramp_by == "rate" else "users"
    return f"ramp by {config.ramp_by}: {', '.join(f'{s:g}' for s in config.stages)} {unit}"


def _sampling(config: BenchConfig) -> dict[str, Any]:
    spec = config.workload.model_dump()
    return {k: spec[k] for k in ("temperature", "ignore_eos") if k in spec} | {"stream": True}


async def _progress(rec: Recorder, progress: Progress | None) -> None:
    assert progress is not None
    last_done, last_t = 0, rec.clock()
    while True:
        await asyncio.sleep(1.0)
        now = rec.clock()
        rate = (rec.done - last_done) / (now - last_t)
        last_done, last_t = rec.done, now
        p95 = percentile(list(rec.recent_e2e), 95)
        progress(
            f"{rec.stage_label}  done {rec.done}  failed {rec.failed}  in flight {rec.in_flight}"
            f"  {rate:.1f} req/s  p95 e2e {'-' if p95 is None else f'{p95:.3f} s'}",
            False,
        )
