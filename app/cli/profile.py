"""``switchyard profile``: tune a serving profile on this hardware (``tune``) and print a
resolved profile (``show``).

``tune`` sweeps one knob (``--knob max_num_seqs=4,8,16``; default values in
``app.profiles.tune.DEFAULT_VALUES``) of a catalogue profile, runs closed-loop load at
concurrencies relative to each setting's batch against a pool built with it, and keeps
the setting with the most goodput whose p95s meet ``--slo`` (rule in
``app.profiles.tune``; measuring in ``app.bench.tune``). It writes ``--out`` (the
profile file a model references as ``profile: {name, file}``) and a report into
``--report-dir``. One progress line per point goes to stderr; the written paths to
stdout. Exit 2: bad arguments; 1: no setting meets the SLO. The load generator (the
``bench`` extra) is imported only when ``tune`` runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from app.profiles.catalog import CATALOGUE, PROFILES, Bundle, Slo
from app.profiles.resolve import ProfileRef, load_bundle
from app.profiles.tune import DEFAULT_FACTORS, KNOBS, Knob
from app.settings import Settings, load_settings

profile_app = typer.Typer(
    help="Serving profiles: tune one on this hardware, show a resolved one.",
    no_args_is_help=True,
)
_SLO_ALIASES = {"ttft": "ttft_p95_ms", "itl": "itl_p95_ms", "e2e": "e2e_p95_ms"}


def parse_slo(text: str) -> Slo:
    """``ttft_p95_ms=1500,itl_p95_ms=150`` (or ``ttft=1500,itl=150``) → ``Slo``."""
    fields: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = _SLO_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in Slo.model_fields:
            known = ", ".join(Slo.model_fields)
            raise typer.BadParameter(f"--slo {item!r}: use KEY=MS with KEY one of {known}")
        try:
            fields[key] = float(value)
        except ValueError:
            raise typer.BadParameter(f"--slo {item!r}: {value!r} is not a number") from None
    if not fields:
        raise typer.BadParameter(f"--slo {text!r}: give at least one KEY=MS")
    try:
        return Slo.model_validate(fields)
    except ValidationError as exc:
        raise typer.BadParameter(f"--slo {text!r}: every limit must be > 0 ms ({exc})") from None


def parse_knob(text: str) -> tuple[Knob, list[int] | None]:
    """``max_num_seqs=4,8,16`` → the knob and its values (a bare knob: the defaults)."""
    name, _, values = text.partition("=")
    knob = next((k for k in KNOBS if k == name.strip()), None)
    if knob is None:
        raise typer.BadParameter(f"--knob {name!r}: one of {', '.join(KNOBS)}")
    try:
        parsed = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"--knob {text!r}: values are whole numbers") from None
    if any(v < 1 for v in parsed):
        raise typer.BadParameter(f"--knob {text!r}: values are >= 1")
    return knob, parsed or None


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{option} {text!r}: numbers, comma-separated") from None
    if not out or any(v <= 0 for v in out):
        raise typer.BadParameter(f"{option} {text!r}: positive numbers, comma-separated")
    return out


def _sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set {item!r}: use FIELD=VALUE (a model field)")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _opt(help_text: str, *names: str) -> Any:
    return typer.Option(*names, help=help_text)


@profile_app.command("tune")
def tune_command(
    ctx: typer.Context,
    profile: Annotated[str, _opt(f"One of {', '.join(PROFILES)}.", "--profile")],
    slo: Annotated[
        str | None,
        _opt("KEY=MS,… (ttft_p95_ms, itl_p95_ms, e2e_p95_ms); default the profile's.", "--slo"),
    ] = None,
    engine: Annotated[str, _opt("vllm | simulated.", "--engine")] = "vllm",
    source: Annotated[str, _opt("vllm: the model source.", "--source")] = "embedded:smollm2",
    dtype: Annotated[str, _opt("vllm: the model's dtype.", "--dtype")] = "auto",
    knob: Annotated[str, _opt("KNOB[=V1,V2,…] to sweep.", "--knob")] = "max_num_seqs",
    concurrency: Annotated[
        str, _opt("Concurrencies as factors of max_num_seqs (1 is always run).", "--concurrency")
    ] = ",".join(f"{f:g}" for f in DEFAULT_FACTORS),
    duration_s: Annotated[float, _opt("Steady state per point (s).", "--duration-s")] = 20.0,
    warmup_s: Annotated[float, _opt("Warm-up per point (s).", "--warmup-s")] = 3.0,
    input_tokens: Annotated[int, _opt("Prompt tokens per request.", "--input-tokens")] = 512,
    output_tokens: Annotated[int, _opt("Output tokens per request.", "--output-tokens")] = 128,
    max_error_rate: Annotated[float, _opt("Error budget (0-1).", "--max-error-rate")] = 0.01,
    seed: Annotated[int, _opt("Seed of prompts and think times.", "--seed")] = 0,
    sets: Annotated[
        list[str] | None, _opt("FIELD=VALUE: a model field for every pool (repeatable).", "--set")
    ] = None,
    out: Annotated[
        Path | None, _opt("Profile file (default profiles/PROFILE-ENGINE.yaml).", "--out")
    ] = None,
    report_dir: Annotated[Path, _opt("Report directory.", "--report-dir")] = Path("bench-results"),
) -> None:
    """Tune PROFILE's knob on this hardware; write the profile file and a report."""
    if profile not in PROFILES:
        raise typer.BadParameter(f"one of {', '.join(PROFILES)}", param_hint="--profile")
    if engine not in ("vllm", "simulated"):
        raise typer.BadParameter("vllm or simulated", param_hint="--engine")
    name = profile
    knob_name, values = parse_knob(knob)
    try:
        from app.bench.tune import SimulatedTarget, Target, TuneConfig, VllmTarget, tune
        from app.bench.tune_report import rerun_command, write_tune
    except ImportError as exc:
        typer.echo(
            f"profile tune needs the bench extra ({exc.name} is not installed): "
            "pip install 'switchyard[bench]'",
            err=True,
        )
        raise typer.Exit(2) from None
    try:
        config = TuneConfig(
            profile=name,
            slo=parse_slo(slo) if slo is not None else CATALOGUE[name].slo,
            knob=knob_name,
            values=values,
            factors=_floats(concurrency, "--concurrency"),
            warmup_s=warmup_s,
            duration_s=duration_s,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            max_error_rate=max_error_rate,
            seed=seed,
            fields=_sets(sets or []),
        )
    except ValidationError as exc:
        typer.echo(f"invalid tune: {exc}", err=True)
        raise typer.Exit(2) from None
    target: Target
    target_args = {"engine": engine}
    if engine == "vllm":
        settings = ctx.find_object(Settings) or load_settings()
        target = VllmTarget(source, dtype, settings)
        target_args |= {"source": source, "dtype": dtype}
    else:
        target = SimulatedTarget()
    path = out or Path("profiles") / f"{profile}-{engine}.yaml"

    def say(line: str) -> None:
        typer.echo(line, err=True)

    try:
        result = asyncio.run(tune(config, target, say))
        command = rerun_command(config, target_args, path, report_dir)
        files = write_tune(result, path, report_dir, command)
    except ValueError as exc:  # no setting meets the SLO; a profile the checks refuse
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo("\n".join(str(p) for p in files.paths))


@profile_app.command("show")
def show_command(
    which: Annotated[str, typer.Argument(help="A profile name or a profile file.")],
) -> None:
    """Print a profile resolved (a file's values over the catalogue's) as YAML."""
    bundle: Bundle
    if which in PROFILES:
        bundle = CATALOGUE[which]
    else:
        try:
            tuned = load_bundle(Path(which))
            bundle = ProfileRef(name=tuned.profile, file=which).bundle()
        except ValueError as exc:
            raise typer.BadParameter(
                f"{exc} (a name is one of {', '.join(PROFILES)})", param_hint="NAME|FILE"
            ) from None
    typer.echo(yaml.safe_dump(bundle.model_dump(mode="json", exclude_none=True), sort_keys=False))
