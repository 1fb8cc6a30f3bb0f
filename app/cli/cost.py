"""``switchyard cost REPORT.json``: what serving the measured run costs, and against
what API price it breaks even (rules in ``app.cost.model``, ``app.cost.scenarios``,
``app.cost.sheet``; the run's figures from ``app.bench.cost_input``). Writes
``<stem>.json/.md/.png`` into ``--out`` and prints the paths. Exit 2: bad arguments
(a report without runs, an ambiguous run, a missing or undated price)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from app.bench.cost_input import measured
from app.bench.cost_report import write
from app.bench.metrics import SLO
from app.cost.prices import load_prices
from app.cost.scenarios import SECONDS_PER_MONTH, Instance, cases
from app.cost.sheet import SheetInputs, Throughput, WorkloadClass, sheet

DEFAULT_PRICES = Path(__file__).resolve().parents[2] / "prices.yaml"
TRAFFIC_SHARES = {"low": 0.1, "medium": 0.4, "high": 0.8}  # of the instance's capacity


def _opt(help_text: str, *names: str) -> Any:
    return typer.Option(*names, help=help_text)


def parse_scenario(text: str) -> Instance:
    """``NAME=HOURLY@CAPACITY_RPS[@QUALITY[@SLO_MET]]`` (capacity measured on that
    instance class; its answers' graded quality and share meeting the SLO, if known)."""
    name, _, rest = text.partition("=")
    parts = rest.split("@")
    try:
        if not 2 <= len(parts) <= 4:
            raise ValueError(text)
        hourly, capacity, *extra = (float(p) for p in parts)
        quality, slo_met = (*extra, None, None)[:2]
        return Instance(name.strip(), hourly, capacity, quality, slo_met)
    except ValueError:
        raise typer.BadParameter(
            f"--scenario {text!r}: use NAME=HOURLY@CAPACITY_RPS[@QUALITY[@SLO_MET]]"
        ) from None


def parse_slo(text: str) -> SLO:
    """``ttft=MS,tpot=MS,e2e=MS``: per-request limits in milliseconds."""
    limits: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition("=")
        if key.strip() not in ("ttft", "tpot", "e2e"):
            raise typer.BadParameter(f"--slo {item!r}: use ttft=MS,tpot=MS,e2e=MS")
        try:
            limits[f"{key.strip()}_s"] = float(value) / 1000
        except ValueError:
            raise typer.BadParameter(f"--slo {item!r}: use ttft=MS,tpot=MS,e2e=MS") from None
    return SLO.model_validate(limits)


def parse_traffic(text: str) -> dict[str, float]:
    """``low=1e5,medium=1e6,high=1e7`` requests per month."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise typer.BadParameter(f"--traffic {item!r}: use LEVEL=REQUESTS_PER_MONTH") from None
    return out


def cost_command(
    report: Annotated[Path, typer.Argument(help="A bench or profile report (JSON).")],
    gpu_hourly: Annotated[float, _opt("$ per hour of one instance.", "--gpu-hourly")],
    gpus: Annotated[int, _opt("Instances serving at the measured rate each.", "--gpus")] = 1,
    utilisation: Annotated[float, _opt("Average utilisation (0-1].", "--utilisation")] = 1.0,
    labour_monthly: Annotated[float, _opt("Operations labour $/month.", "--labour-monthly")] = 0.0,
    prices: Annotated[Path, _opt("Dated price table.", "--prices")] = DEFAULT_PRICES,
    run: Annotated[str | None, _opt("Which run of the report.", "--run")] = None,
    input_weight: Annotated[
        float, _opt("Prompt token cost / output token.", "--input-weight")
    ] = 0.2,
    scenario: Annotated[
        list[str] | None, _opt("NAME=HOURLY@CAPACITY_RPS (repeatable).", "--scenario")
    ] = None,
    traffic: Annotated[str | None, _opt("LEVEL=REQUESTS/MONTH,…", "--traffic")] = None,
    revenue: Annotated[float | None, _opt("Revenue $/request.", "--revenue-per-request")] = None,
    quality: Annotated[
        float | None, _opt("The measured model's graded answer quality.", "--quality")
    ] = None,
    api_quality: Annotated[
        list[str] | None, _opt("PRICE_ROW=QUALITY of an API (repeatable).", "--api-quality")
    ] = None,
    slo: Annotated[
        str | None, _opt("Per-request SLO ttft=MS,tpot=MS,e2e=MS (default: the report's).", "--slo")
    ] = None,
    out: Annotated[Path, _opt("Output directory.", "--out")] = Path("bench-results"),
    stem: Annotated[str | None, _opt("File name stem.", "--stem")] = None,
) -> None:
    """Cost, break-even and the §11.4 scenarios of one measured run."""
    try:
        data = json.loads(report.read_text())
        m = measured(data, run, parse_slo(slo) if slo else None)
        qualities = {
            name.strip(): float(q)
            for name, _, q in (item.partition("=") for item in api_quality or [])
        }
        table = load_prices(prices)
        for name in qualities:
            table.find(name)  # refuses a name no price row has
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    t = Throughput(
        m.input_tokens_per_s,
        m.output_tokens_per_s,
        m.requests_per_s,
        m.success_rate,
        m.input_tokens_per_request,
        m.output_tokens_per_request,
        m.cached_share,
        m.retry_overhead,
    )
    measured_instance = Instance(
        f"measured ×{gpus}", gpu_hourly * gpus, m.requests_per_s * gpus, quality, m.slo_met
    )
    instances = [measured_instance, *(parse_scenario(s) for s in scenario or [])]
    levels = (
        parse_traffic(traffic)
        if traffic
        else {
            k: v * measured_instance.capacity_rps * SECONDS_PER_MONTH
            for k, v in TRAFFIC_SHARES.items()
        }
    )
    inputs = SheetInputs(gpu_hourly, gpus, utilisation, labour_monthly, input_weight)
    env = data.get("environment") or data.get("metadata") or {}
    doc = {
        "report": report.name,
        "run": m.run,
        "commit": env.get("git_commit"),
        "measured_on": env.get("cpu_model") or env.get("gpu"),
        "command": " ".join(["switchyard cost", *sys.argv[2:]]),
        "sheet": sheet(
            t,
            inputs,
            table,
            instances,
            levels,
            cases(labour_monthly),
            revenue,
            [WorkloadClass(**asdict(c)) for c in m.classes],
            qualities,
        ),
    }
    for path in write(doc, out, stem or f"cost-{report.stem}"):
        typer.echo(str(path))
