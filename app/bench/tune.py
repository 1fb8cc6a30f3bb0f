"""``switchyard profile tune``'s measuring: sweep one knob of a serving profile, run the
load generator against a pool built with each value, and pick by the rule of
:mod:`app.profiles.tune`.

Per knob value (``TuneConfig.values``, the profile's own included): one pool with the
profile and that value, then one closed-loop run (``app.bench.run.execute``, mode
``closed``) per concurrency of ``concurrencies(max_num_seqs, factors)`` — 1, ½×, 1×, 1½×
the setting's batch by default, never a fixed request rate — each with its own warm-up
and steady-state window; then the pool goes. One pool at a time. The pool's
``max_ongoing_requests`` is its batch for an interactive pool (the checks refuse more)
and the highest concurrency otherwise. A setting the checks refuse (the model's
validation, or the builder's KV budget on vLLM) is reported and skipped.

Goodput counts a request as meeting the SLO when its TTFT, its TPOT (its mean gap
between tokens, held to the ITL limit) and its E2E are within the SLO's limits.

Targets (``Target``): ``SimulatedTarget`` serves the SIMULATED engine in-process
(``app.bench.simserver``) with the capacity ``app.builders.simulation_profile`` derives
from the knobs — fast, for tests and demonstrations; ``VllmTarget`` builds the
Switchyard application (``build_application``) on a local Ray and ``serve.run``\\ s it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError, model_validator

from app.bench import metrics
from app.bench.metadata import cpu_info, gpu_info
from app.bench.run import BenchConfig, execute
from app.bench.simserver import SimServerConfig, serve_in_background
from app.bench.specs import FixedSpec
from app.builders import build_application, resolve_source, simulation_profile
from app.config import AppArgs, ModelSpec
from app.engine.simulated import SimulationProfile
from app.profiles.catalog import CATALOGUE, Bundle, ProfileName, Slo
from app.profiles.tune import (
    DEFAULT_FACTORS,
    MAX_ERROR_RATE,
    TIE_TOLERANCE,
    Knob,
    Point,
    Quantiles,
    best_points,
    choose,
    concurrencies,
    sweep_values,
    tuned_bundle,
    violations,
)
from app.schema import StrictFrozen
from app.settings import Settings

MODEL_ID = "profile-tune"
Progress = Callable[[str], None]


class TuneConfig(StrictFrozen):
    """What one tune measures and how (written into its report)."""

    profile: ProfileName
    slo: Slo
    knob: Knob = "max_num_seqs"
    values: list[int] | None = Field(default=None, description="Default: DEFAULT_VALUES.")
    factors: tuple[float, ...] = Field(default=DEFAULT_FACTORS, min_length=1)
    warmup_s: float = Field(default=3.0, ge=0)
    duration_s: float = Field(default=20.0, gt=0)
    input_tokens: int = Field(default=512, ge=1)
    output_tokens: int = Field(default=128, ge=2)
    max_error_rate: float = Field(default=MAX_ERROR_RATE, ge=0, le=1)
    tie_tolerance: float = Field(default=TIE_TOLERANCE, ge=0, lt=1)
    seed: int = 0
    fields: dict[str, Any] = Field(
        default_factory=dict, description="More model fields for every pool (max_model_len …)."
    )

    @model_validator(mode="after")
    def _slo_sets_a_limit(self) -> TuneConfig:
        if not self.slo.model_dump(exclude_none=True):
            raise ValueError("the SLO sets no p95 (ttft_p95_ms, itl_p95_ms or e2e_p95_ms)")
        if any(f <= 0 for f in self.factors):
            raise ValueError("concurrency factors must be positive")
        return self

    def sweep(self) -> list[int]:
        return sweep_values(self.knob, getattr(CATALOGUE[self.profile], self.knob), self.values)


class Target(Protocol):
    """Where the pools run."""

    @property
    def engine(self) -> str: ...
    def model_fields(self) -> dict[str, Any]:
        """The model's fields besides the profile and the knobs (engine, source …)."""
        ...

    def tokenizer(self) -> str | None:
        """An HF tokenizer directory for exact prompt lengths (None: simulated counts)."""
        ...

    def hardware(self) -> str: ...
    def pool(self, spec: ModelSpec) -> AbstractAsyncContextManager[str]:
        """A pool serving ``spec`` while open; yields its base URL. ``ValueError``: the
        setting is refused."""
        ...

    async def close(self) -> None: ...


def hardware() -> str:
    """``2x NVIDIA H100 80GB HBM3`` where a GPU is found, else the CPU and its cores."""
    gpu = gpu_info()
    return f"{gpu['gpu_count']}x {gpu['gpu']}" if gpu["gpu_count"] else cpu_info()


class SimulatedTarget:
    """The SIMULATED engine behind ``app.bench.simserver``, in this process."""

    engine = "simulated"

    def __init__(self, simulation: SimulationProfile | None = None) -> None:
        self.simulation = simulation

    def model_fields(self) -> dict[str, Any]:
        base: dict[str, Any] = {"engine": "simulated"}
        if self.simulation is not None:
            base["simulation"] = self.simulation.model_dump(exclude_unset=True)
        return base

    def tokenizer(self) -> str | None:
        return None

    def hardware(self) -> str:
        name = (self.simulation or SimulationProfile()).name
        return f"{cpu_info()}, simulating {name}"

    @contextlib.asynccontextmanager
    async def pool(self, spec: ModelSpec) -> AsyncIterator[str]:
        config = SimServerConfig(model=spec.id, profile=simulation_profile(spec))
        async with serve_in_background(config) as url:
            yield url

    async def close(self) -> None:
        return None


class VllmTarget:
    """Switchyard's application with vLLM engines on a local Ray, one app at a time."""

    engine = "vllm"
    app_name = "profile-tune"

    def __init__(self, source: str, dtype: str, settings: Settings, num_cpus: int = 4) -> None:
        self.source, self.dtype, self.settings, self.num_cpus = source, dtype, settings, num_cpus
        self.port: int | None = None

    def model_fields(self) -> dict[str, Any]:
        return {"engine": "vllm", "source": self.source, "dtype": self.dtype}

    def tokenizer(self) -> str | None:
        try:
            path = resolve_source(self.source, self.settings)
        except (ValueError, OSError):
            return None
        return str(path) if (path / "tokenizer_config.json").is_file() else None

    def hardware(self) -> str:
        return hardware()

    def _start(self) -> int:
        if self.port is None:
            import ray
            from ray import serve

            # Switchyard's Ray Serve mode, and a stopping ingress drained in 2 s, not 30
            os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
            os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            ray.init(
                address="local",
                include_dashboard=False,
                num_cpus=self.num_cpus,
                log_to_driver=False,
            )
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            self.port = port
        return self.port

    @contextlib.asynccontextmanager
    async def pool(self, spec: ModelSpec) -> AsyncIterator[str]:
        from ray import serve

        gateway = {"anonymous_tenant": "profile-tune"}  # no credentials, as local.yaml
        args = AppArgs.model_validate(
            {"models": [spec], "default_model": spec.id, "gateway": gateway}
        )
        app = build_application(args, self.settings)  # ValueError: refused
        port = self._start()
        await asyncio.to_thread(serve.run, app, name=self.app_name, route_prefix="/")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await asyncio.to_thread(serve.delete, self.app_name)

    async def close(self) -> None:
        if self.port is not None:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
            self.port = None


class TuneResult(BaseModel):
    """A tune's configuration, curve, choice and bundle (``app.bench.tune_report``)."""

    config: TuneConfig
    engine: str
    hardware: str
    metadata: dict[str, Any]
    curve: list[Point]
    refused: dict[int, str] = Field(description="Settings the checks refused, and why.")
    best: dict[int, Point | None]
    chosen: Point
    bundle: Bundle


def setting_fields(config: TuneConfig, target: Target, value: int) -> tuple[dict[str, Any], int]:
    """The model's fields for one knob value, and that setting's batch."""
    bundle = CATALOGUE[config.profile]
    batch = (
        value
        if config.knob == "max_num_seqs"
        else int(config.fields.get("max_num_seqs") or bundle.max_num_seqs or 1)
    )
    points = concurrencies(batch, config.factors)
    ongoing = batch if config.profile == "interactive" else max(batch, *points)
    fields = {
        **target.model_fields(),
        **config.fields,
        "id": MODEL_ID,
        "profile": config.profile,
        config.knob: value,
        "max_ongoing_requests": ongoing,
    }
    return fields, batch


def point_of(value: int, batch: int, concurrency: int, summary: dict[str, Any]) -> Point:
    """A ``Point`` from a run's summary (``metrics.summarize``)."""

    def ms(key: str) -> Quantiles:
        d = summary.get(key) or {}
        return Quantiles(
            **{q: None if d.get(q) is None else d[q] * 1000 for q in ("p50", "p95", "p99")}
        )

    done, ttft = summary["completed"], (summary.get("ttft_s") or {}).get("mean")
    prompt = summary["total_input_tokens"] / done if done else 0.0
    return Point(
        value=value,
        max_num_seqs=batch,
        concurrency=concurrency,
        requests=summary["requests"],
        goodput=summary.get("goodput") or 0.0,
        output_tokens_per_s=summary["output_throughput"],
        error_rate=summary["error_rate"],
        ttft_ms=ms("ttft_s"),
        itl_ms=ms("itl_s"),
        e2e_ms=ms("e2e_s"),
        prefill_tokens_per_s=prompt / ttft if prompt and ttft else None,
    )


def describe(point: Point, knob: str, problems: list[str]) -> str:
    """One progress line per point."""

    def p95(q: Quantiles) -> str:
        return "-" if q.p95 is None else f"{q.p95:.0f} ms"

    verdict = "meets the SLO" if not problems else "; ".join(problems)
    return (
        f"{knob}={point.value} c={point.concurrency}: goodput {point.goodput:.2f} req/s, "
        f"{point.output_tokens_per_s:.0f} output tok/s, TTFT p95 {p95(point.ttft_ms)}, "
        f"ITL p95 {p95(point.itl_ms)}, errors {point.error_rate:.1%} — {verdict}"
    )


async def tune(config: TuneConfig, target: Target, progress: Progress | None = None) -> TuneResult:
    """Measure every setting, choose (``app.profiles.tune.choose``: raises
    ``NoSettingMeetsSlo``), and return the result with the tuned bundle."""
    say = progress or (lambda _line: None)
    slo = config.slo
    bench_slo = metrics.SLO(
        ttft_s=None if slo.ttft_p95_ms is None else slo.ttft_p95_ms / 1000,
        tpot_s=None if slo.itl_p95_ms is None else slo.itl_p95_ms / 1000,
        e2e_s=None if slo.e2e_p95_ms is None else slo.e2e_p95_ms / 1000,
        max_error_rate=config.max_error_rate,
    )
    workload = FixedSpec(input_tokens=config.input_tokens, output_tokens=config.output_tokens)
    curve: list[Point] = []
    refused: dict[int, str] = {}
    metadata: dict[str, Any] = {}
    tokenizer = target.tokenizer()
    try:
        for value in config.sweep():
            fields, batch = setting_fields(config, target, value)
            async with contextlib.AsyncExitStack() as stack:
                try:
                    spec = ModelSpec.model_validate(fields)
                    url = await stack.enter_async_context(target.pool(spec))
                except ValueError as exc:  # a pydantic ValidationError is one too
                    refused[value] = _reason(exc)
                    say(f"{config.knob}={value}: refused: {refused[value]}")
                    continue
                say(f"{config.knob}={value}: pool ready ({target.engine})")
                for users in concurrencies(batch, config.factors):
                    bench = BenchConfig(
                        base_url=url,
                        model=spec.id,
                        mode="closed",
                        concurrency=users,
                        warmup_s=config.warmup_s,
                        duration_s=config.duration_s,
                        workload=workload,
                        tokenizer=tokenizer,
                        slo=bench_slo,
                        seed=config.seed,
                        engine=target.engine,
                        ready_timeout_s=600,
                    )
                    result = await execute(bench)
                    metadata = metadata or result["metadata"]
                    point = point_of(value, batch, users, result["summary"])
                    curve.append(point)
                    say(describe(point, config.knob, violations(point, slo, config.max_error_rate)))
    finally:
        await target.close()
    chosen = choose(
        curve, slo, config.profile, config.knob, config.max_error_rate, config.tie_tolerance
    )
    where = target.hardware()
    bundle = tuned_bundle(config.profile, slo, config.knob, chosen, curve, where)
    factors = ", ".join(f"{f:g}x" for f in config.factors)
    metadata = {
        **metadata,
        "concurrency": f"closed loop per setting at 1 and {factors} its max_num_seqs",
        "warmup": f"{config.warmup_s:g} s per point",
        "duration": f"{config.duration_s:g} s per point (steady state)",
    }
    best = best_points(curve, slo, config.profile, config.max_error_rate)
    return TuneResult(
        config=config,
        engine=target.engine,
        hardware=where,
        metadata=metadata,
        curve=curve,
        refused=refused,
        best=best,
        chosen=chosen,
        bundle=bundle,
    )


def _reason(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return str(exc)
