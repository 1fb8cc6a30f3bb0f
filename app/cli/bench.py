"""``switchyard bench``: the load generator (``run``), run comparison (``compare``),
the cross-check against vLLM's formulas (``crosscheck``) and the standalone simulated
endpoint it is calibrated against (``sim-server``).

``run`` takes a YAML/JSON ``--config`` (a ``BenchConfig``; unknown keys are errors)
and/or options; an option given on the command line overrides the file. Results go to
``--out`` as ``NAME.json`` (per-request records + aggregates), ``NAME.md`` and PNG
plots. Progress goes to stderr, the result paths and the headline to stdout. Exit
status 3 marks a run the generator's self-check declared INVALID.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from app.bench.client import raise_fd_limit
from app.bench.compare import ResultError, compare, format_comparison, load_result
from app.bench.metrics import SLO
from app.bench.report import verdict, write_report
from app.bench.run import BenchConfig, execute
from app.bench.schedule import parse_stages
from app.bench.simserver import SimServerConfig, run_sim_server
from app.engine.simulated import SimulationProfile

bench_app = typer.Typer(
    help="Load generator: open/closed loop, ramps, reports, comparisons.", no_args_is_help=True
)
_SLO_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "e2e": "e2e_s"}


def _opt(help_text: str, *names: str) -> Any:
    return typer.Option(*names, help=help_text, show_default=False)


def _load_file(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: expected a mapping")
    return data


def parse_goodput(items: list[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (ms, as ``vllm bench serve --goodput``) → SLO fields (s)."""
    out: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in _SLO_KEYS or not value:
            raise typer.BadParameter(f"--goodput {item!r}: use ttft:MS, tpot:MS or e2el:MS")
        out[_SLO_KEYS[key]] = float(value) / 1000.0
    return out


@bench_app.command("run")
def run_command(
    config_file: Annotated[Path | None, _opt("A BenchConfig YAML/JSON file.", "--config")] = None,
    url: Annotated[str | None, _opt("Base URL (default http://127.0.0.1:8000).", "--url")] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="SWITCHYARD_API_KEY", help="Bearer key.", show_default=False
        ),
    ] = None,
    model: Annotated[str | None, _opt("Model (default: the first listed).", "--model")] = None,
    embed_model: Annotated[str | None, _opt("Embedding model (agentic).", "--embed-model")] = None,
    mode: Annotated[str | None, _opt("open | closed | ramp (default open).", "--mode")] = None,
    rate: Annotated[
        float | None, _opt("Open loop: requests (sessions) per second.", "--rate")
    ] = None,
    arrival: Annotated[str | None, _opt("poisson | gamma | constant.", "--arrival")] = None,
    burstiness: Annotated[float | None, _opt("Gamma shape (1 = Poisson).", "--burstiness")] = None,
    num_requests: Annotated[
        int | None, _opt("Jobs per stage (default rate x time).", "-n", "--num-requests")
    ] = None,
    concurrency: Annotated[int | None, _opt("Closed loop: users.", "-c", "--concurrency")] = None,
    think: Annotated[float | None, _opt("Closed loop: mean think time (s).", "--think")] = None,
    ramp_by: Annotated[str | None, _opt("Ramp stages are concurrency | rate.", "--ramp-by")] = None,
    stages: Annotated[str | None, _opt("Ramp stages, e.g. 1,8,32,64.", "--stages")] = None,
    warmup: Annotated[float | None, _opt("Warm-up window per stage (s).", "--warmup")] = None,
    duration: Annotated[
        float | None, _opt("Steady-state window per stage (s).", "--duration")
    ] = None,
    workload: Annotated[
        str | None, _opt("fixed | mix | shared_prefix | trace | agentic.", "--workload")
    ] = None,
    input_tokens: Annotated[int | None, _opt("fixed: prompt tokens.", "--input-tokens")] = None,
    output_tokens: Annotated[
        int | None, _opt("fixed/shared_prefix: output tokens.", "--output-tokens")
    ] = None,
    endpoint: Annotated[str | None, _opt("chat | completions.", "--endpoint")] = None,
    tenants: Annotated[int | None, _opt("shared_prefix: tenants.", "--tenants")] = None,
    prefix_tokens: Annotated[
        int | None, _opt("shared_prefix: shared prefix tokens.", "--prefix-tokens")
    ] = None,
    suffix_tokens: Annotated[
        int | None, _opt("shared_prefix: unique suffix tokens.", "--suffix-tokens")
    ] = None,
    trace: Annotated[Path | None, _opt("trace: a JSONL trace to replay.", "--trace")] = None,
    time_scale: Annotated[float | None, _opt("trace: timestamps x this.", "--time-scale")] = None,
    tokenizer: Annotated[
        str | None, _opt("HF tokenizer dir for prompt lengths.", "--tokenizer")
    ] = None,
    max_model_len: Annotated[
        int | None, _opt("Context cap (default from /v1/models).", "--max-model-len")
    ] = None,
    goodput: Annotated[
        list[str] | None, _opt("SLO KEY:MS (ttft, tpot, e2el), repeatable.", "--goodput")
    ] = None,
    max_error_rate: Annotated[
        float | None, _opt("Ramp: error-rate SLO (0-1).", "--max-error-rate")
    ] = None,
    p95_metric: Annotated[
        str | None, _opt("Ramp: p95 of ttft | tpot | e2e vs its SLO.", "--p95-metric")
    ] = None,
    hourly_usd: Annotated[
        float | None, _opt("The served hardware's $/hour: goodput per dollar.", "--hourly-usd")
    ] = None,
    seed: Annotated[int | None, _opt("Seed of schedules and prompts.", "--seed")] = None,
    timeout: Annotated[float | None, _opt("Per-request timeout (s).", "--timeout")] = None,
    engine: Annotated[str | None, _opt("Engine label for the metadata.", "--engine")] = None,
    engine_version: Annotated[
        str | None, _opt("Engine version for the metadata.", "--engine-version")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Results directory.")] = Path("bench-results"),
    name: Annotated[
        str | None, _opt("File name stem (default: mode-workload-UTC time).", "--name")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress on stderr.")] = False,
) -> None:
    """Run a benchmark and write NAME.json, NAME.md and plots to --out."""
    err = Console(stderr=True)
    data = _load_file(config_file) if config_file else {}
    top = {
        "base_url": url,
        "api_key": api_key,
        "model": model,
        "embed_model": embed_model,
        "mode": mode,
        "rate": rate,
        "arrival": arrival,
        "burstiness": burstiness,
        "num_requests": num_requests,
        "concurrency": concurrency,
        "think_s": think,
        "ramp_by": ramp_by,
        "warmup_s": warmup,
        "duration_s": duration,
        "time_scale": time_scale,
        "tokenizer": tokenizer,
        "max_model_len": max_model_len,
        "seed": seed,
        "timeout_s": timeout,
        "engine": engine,
        "engine_version": engine_version,
        "hourly_usd": hourly_usd,
    }
    data.update({k: v for k, v in top.items() if v is not None})
    if stages is not None:
        data["stages"] = parse_stages(stages)
    wl = dict(data.get("workload") or {})
    if workload is not None and workload != wl.get("kind"):
        wl = {"kind": workload}
    wl_opts = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "endpoint": endpoint,
        "tenants": tenants,
        "prefix_tokens": prefix_tokens,
        "suffix_tokens": suffix_tokens,
        "path": trace,
    }
    wl.update({k: v for k, v in wl_opts.items() if v is not None})
    if wl:
        data["workload"] = {"kind": "fixed", **wl}
    slo = dict(data.get("slo") or {}) | parse_goodput(goodput or [])
    if max_error_rate is not None:
        slo["max_error_rate"] = max_error_rate
    if p95_metric is not None:
        slo["p95_metric"] = p95_metric
    try:
        if slo:
            data["slo"] = SLO.model_validate(slo).model_dump()
        config = BenchConfig.model_validate(data)
    except ValidationError as exc:
        typer.echo(f"invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    raise_fd_limit()
    stem = name or f"{config.mode}-{config.workload.kind}-" + dt.datetime.now(dt.UTC).strftime(
        "%Y%m%dT%H%M%SZ"
    )
    try:
        result = _run(config, None if quiet else _progress_printer(err))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        typer.echo(f"cannot benchmark {config.base_url}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from None
    files = write_report(result, out, stem)
    s = result["summary"]
    typer.echo(f"{files.json}\n{files.markdown}")
    typer.echo(
        f"{verdict(result)}: {s['completed']}/{s['requests']} ok, "
        f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s"
        + (f", goodput {s['goodput']:.2f} req/s" if s["goodput"] is not None else "")
    )
    if not result["self_check"]["valid"]:
        raise typer.Exit(3)


def _run(config: BenchConfig, progress: Any) -> dict[str, Any]:
    """The run on uvloop where it is installed (it ships with uvicorn[standard])."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(execute(config, progress))
    return uvloop.run(execute(config, progress))


def _progress_printer(err: Console) -> Any:
    every = 1.0 if sys.stderr.isatty() else 10.0
    last = [0.0]

    def show(message: str, always: bool) -> None:
        now = time.monotonic()
        if always or now - last[0] >= every:
            last[0] = now
            err.print(escape(message), highlight=False)

    return show


@bench_app.command("compare")
def compare_command(
    a: Annotated[Path, typer.Argument(help="Baseline result JSON.")],
    b: Annotated[Path, typer.Argument(help="Result JSON to compare with A.")],
) -> None:
    """Print B/A ratios of the key metrics of two runs (and metadata differences)."""
    try:
        rows = compare(load_result(a), load_result(b))
    except ResultError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(format_comparison(rows))


@bench_app.command("crosscheck")
def crosscheck_command(
    result: Annotated[Path, typer.Argument(help="A result JSON.")],
) -> None:
    """Recompute the result's aggregates with vLLM's own formulas; exit 1 on a mismatch."""
    from app.bench.crosscheck import TOLERANCE, crosscheck_result

    rows = crosscheck_result(load_result(result))
    worst = max(rows, key=lambda row: row["rel_diff"])
    for row in rows:
        typer.echo(
            f"{row['metric']:<24} ours {row['ours']:.6g}  vllm {row['vllm']:.6g}  "
            f"diff {row['rel_diff']:.2e}  {'ok' if row['ok'] else 'MISMATCH'}"
        )
    typer.echo(f"worst: {worst['metric']} {worst['rel_diff']:.2e} (tolerance {TOLERANCE:g})")
    if not all(row["ok"] for row in rows):
        raise typer.Exit(1)


@bench_app.command("sim-server")
def sim_server_command(
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8100,
    profile: Annotated[
        Path | None, _opt("A SimulationProfile YAML/JSON file.", "--profile")
    ] = None,
    model: Annotated[str, typer.Option("--model")] = "simulated-llm",
    embed_model: Annotated[str, typer.Option("--embed-model")] = "simulated-embed",
    replicas: Annotated[int, typer.Option("--replicas", help="Engines, round-robin.")] = 1,
    speed_spread: Annotated[
        float, typer.Option("--replica-speed-spread", help="Replica k steps (1+s*k/(n-1))x.")
    ] = 0.0,
) -> None:
    """Serve the SIMULATED engine over OpenAI HTTP without Ray (load-generator target)."""
    data = _load_file(profile) if profile else {}
    try:
        sim = SimulationProfile.model_validate(data)
    except ValidationError as exc:
        typer.echo(f"invalid profile: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        config = SimServerConfig(
            model=model,
            embed_model=embed_model,
            profile=sim,
            replicas=replicas,
            replica_speed_spread=speed_spread,
        )
    except ValidationError as exc:
        typer.echo(f"invalid option: {exc}", err=True)
        raise typer.Exit(2) from None
    Console(stderr=True).print(
        f"simulated endpoint on http://{host}:{port} ({json.dumps(sim.model_dump())})",
        highlight=False,
    )
    run_sim_server(config, host, port)
