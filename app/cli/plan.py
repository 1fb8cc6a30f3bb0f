"""``switchyard plan --rps R --mix FILE --slo ttft_p95=…,itl_p95=… --gpu-hourly X``: the
replicas, GPUs, profile, monthly cost and utilisation a traffic mix needs, from the
measured curves of profile tune reports (rule in ``app.cost.plan``; the reports read by
``app.bench.plan_input``, the files written by ``app.bench.plan_report``). Default
reports: the shipped ``docs/benchmarks/profile-tune-*.json``. Prints one line per
class and the total, then writes ``<stem>.json/.md`` into ``--out`` and prints the
paths. Exit 2: bad arguments, or a refusal (no measured point meets a class's SLO, or
no report matches ``--hardware``), with a message naming the class, the SLO and the
nearest measured point.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from app.bench.plan_input import load_reports
from app.bench.plan_report import document, summary, write
from app.cli.profile import parse_slo
from app.cost.mix import Mix, Objective
from app.cost.plan import PlanRefused, Pricing, plan, select_hardware

REPORTS_OF_RECORD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def _opt(help_text: str, *names: str) -> Any:
    return typer.Option(*names, help=help_text)


def parse_objective(text: str) -> Objective:
    """``ttft_p95=1500,itl_p95=150`` (also ``ttft_p95_ms=`` or ``ttft=``) → limits in ms."""
    items = []
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        items.append(f"{key}_ms{sep}{value}" if key.endswith("_p95") else f"{key}{sep}{value}")
    return Objective.model_validate(parse_slo(",".join(items)).model_dump())


def load_mix(path: Path) -> Mix:
    try:
        return Mix.model_validate(yaml.safe_load(path.read_text()))
    except OSError as exc:
        raise typer.BadParameter(f"{path}: cannot be read ({exc.strerror})") from None
    except (yaml.YAMLError, ValidationError) as exc:
        raise typer.BadParameter(f"{path}: not a valid mix: {exc}") from None


def plan_command(
    rps: Annotated[float, _opt("Offered requests/s, all classes together.", "--rps")],
    mix: Annotated[Path, _opt("Traffic mix (YAML): classes with their shares.", "--mix")],
    slo: Annotated[str, _opt("p95 limits in ms: ttft_p95=…,itl_p95=…[,e2e_p95=…]", "--slo")],
    gpu_hourly: Annotated[float, _opt("$ per GPU-hour.", "--gpu-hourly")],
    gpus_per_replica: Annotated[int, _opt("GPUs per replica.", "--gpus-per-replica")] = 1,
    spare: Annotated[int, _opt("Spare replicas per class (N+1).", "--spare")] = 1,
    hardware: Annotated[str | None, _opt("Hardware class (substring).", "--hardware")] = None,
    out: Annotated[Path, _opt("Output directory.", "--out")] = Path("bench-results"),
    stem: Annotated[str, _opt("File name stem.", "--stem")] = "plan",
    reports: Annotated[
        list[Path] | None,
        typer.Argument(help="Profile tune reports (JSON); default: the shipped ones."),
    ] = None,
) -> None:
    """Replicas, GPUs and monthly cost for a traffic mix, from measured profile curves."""
    if rps <= 0 or gpu_hourly < 0 or gpus_per_replica < 1 or spare < 0:
        raise typer.BadParameter(
            "--rps must be > 0, --gpu-hourly ≥ 0, --gpus-per-replica ≥ 1, --spare ≥ 0"
        )
    objective = parse_objective(slo)
    paths = reports or sorted(REPORTS_OF_RECORD.glob("profile-tune-*.json"))
    try:
        loaded = load_reports(paths)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        curves, left_out = select_hardware([c for c, _ in loaded], hardware)
        result = plan(
            rps, load_mix(mix), objective, curves, Pricing(gpu_hourly, gpus_per_replica, spare)
        )
    except PlanRefused as exc:
        typer.echo(f"plan refused: {exc}", err=True)
        raise typer.Exit(2) from None
    used = [origin for curve, origin in loaded if curve in curves]
    doc = document(result, used, left_out, " ".join(["switchyard plan", *sys.argv[2:]]))
    for line in summary(doc):
        typer.echo(line)
    for path in write(doc, out, stem):
        typer.echo(str(path))
