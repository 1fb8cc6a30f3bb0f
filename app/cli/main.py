"""The ``switchyard`` command line.

``app`` is the root typer application; each area hangs a sub-typer on it (``models``
here: prepare, list and locate the embedded models, and ``kv-budget`` from
:mod:`app.cli.kv`). Settings are read once, in the root callback, into ``ctx.obj``
(tests hand ``obj=Settings(...)`` to the runner instead) and passed to library
functions as plain arguments.

Progress and errors go to stderr; stdout carries only results, so scripts can use them
(``switchyard models path smollm2`` prints the directory and nothing else).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from app.cli.adapters import adapters_app
from app.cli.admin import keys_app, limits_app, tenants_app
from app.cli.cost import cost_command
from app.cli.kv import kv_budget_command
from app.cli.plan import plan_command
from app.cli.profile import profile_app
from app.cli.routes import routes_app
from app.cli.serve import serve
from app.cli.usage import usage_app
from app.models.prepare import (
    MODELS,
    ModelPreparationError,
    PreparedModel,
    ProgressEvent,
    find_prepared,
    prepare_model,
)
from app.models.s3 import FetchProgress, S3Location, S3SourceError, fetch_model
from app.settings import Settings, load_settings


def _add_extra(parent: typer.Typer, name: str, module: str, attr: str, help_text: str) -> None:
    """``switchyard <name>`` from ``module``, or — when the bench extra it needs (aiohttp,
    matplotlib, jsonschema) is not installed, as in a serving image — a command that says
    how to get it."""
    try:
        sub = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        missing = exc.name or str(exc)

        def needs_extra() -> None:
            typer.echo(
                f"switchyard {name} needs the bench extra ({missing} is not installed): "
                "pip install 'switchyard[bench]'",
                err=True,
            )
            raise typer.Exit(2)

        extra = {"allow_extra_args": True, "ignore_unknown_options": True}
        helped = f"{help_text} (needs: pip install 'switchyard[bench]')."
        parent.command(name=name, help=helped, context_settings=extra)(needs_extra)
        return
    parent.add_typer(sub, name=name)


app = typer.Typer(
    name="switchyard",
    help="Switchyard: an OpenAI-compatible LLM endpoint on Ray Serve and vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(
    help="Prepare and locate the models shipped inside PyPI wheels; size a KV cache.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")
models_app.command("kv-budget")(kv_budget_command)
app.add_typer(keys_app, name="keys")
app.add_typer(adapters_app, name="adapters")
app.add_typer(tenants_app, name="tenants")
app.add_typer(limits_app, name="limits")
app.add_typer(usage_app, name="usage", help="Usage from the ledger (summary or records).")
app.add_typer(routes_app, name="routes")
app.add_typer(profile_app, name="profile")
app.command(name="cost")(cost_command)
app.command(name="plan")(plan_command)
_add_extra(app, "bench", "app.cli.bench", "bench_app", "Load generator")
_add_extra(app, "eval", "app.cli.eval", "eval_app", "Evaluation sets")
app.command(name="serve")(serve)

CacheDirOption = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Cache directory (models go to CACHE_DIR/models); default from settings.",
        file_okay=False,
        show_default=False,
    ),
]
NamesArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help=f"Models to prepare: {', '.join(MODELS)} (default: all).", show_default=False
    ),
]


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Read the settings once for every sub-command."""
    if not isinstance(ctx.obj, Settings):
        ctx.obj = load_settings()


def _stderr() -> Console:
    return Console(stderr=True)


def _models_dir(ctx: typer.Context, cache_dir: Path | None) -> Path:
    settings = ctx.find_object(Settings)
    if settings is None:  # pragma: no cover - the root callback always sets it
        settings = load_settings()
    if cache_dir is not None:
        settings = settings.model_copy(update={"cache_dir": cache_dir.expanduser().resolve()})
    return settings.models_dir


def _check_name(name: str) -> str:
    if name not in MODELS:
        raise typer.BadParameter(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return name


def _select(names: list[str] | None, all_models: bool) -> list[str]:
    if names and all_models:
        raise typer.BadParameter("give model names or --all, not both")
    chosen = list(MODELS) if all_models or not names else names
    return list(dict.fromkeys(_check_name(name) for name in chosen))


def _result_line(model: PreparedModel) -> str:
    return f"{model.name}\t{model.path}\tsha256:{model.sha256}"


@models_app.command("prepare")
def prepare_command(
    ctx: typer.Context,
    names: NamesArgument = None,
    all_models: Annotated[bool, typer.Option("--all", help="Prepare every model.")] = False,
    cache_dir: CacheDirOption = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-hash existing files; rebuild damaged copies.")
    ] = False,
) -> None:
    """Prepare models (idempotent); prints NAME, PATH and sha256 per model."""
    selected = _select(names, all_models)
    models_dir = _models_dir(ctx, cache_dir)
    done: list[PreparedModel] = []
    failure: ModelPreparationError | None = None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=_stderr()) as progress:
        for name in selected:
            task = progress.add_task(name, total=len(MODELS[name].steps))

            def report(event: ProgressEvent, task: TaskID = task) -> None:
                progress.update(
                    task,
                    description=escape(f"{event.model}: {event.step}"),
                    completed=event.completed,
                    total=event.total,
                )

            try:
                done.append(prepare_model(name, models_dir, report, verify=verify))
            except ModelPreparationError as exc:
                failure = exc
                break
    for model in done:
        typer.echo(_result_line(model))
    if failure is not None:
        _stderr().print(f"[red]error:[/red] {escape(str(failure))}")
        raise typer.Exit(1)


@models_app.command("quantize")
def quantize_command(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="An embedded model's name or an HF directory.")],
    dest: Annotated[Path, typer.Argument(help="The new directory (an earlier quantized "
                                               "copy there is replaced).")],
    scheme: Annotated[str, typer.Option(help="w8a8 (int8 weights and activations) or "
                                             "w4a16 (int4 weights).")] = "w8a8",
    group_size: Annotated[int, typer.Option(help="w4a16: input columns per scale.")] = 64,
    cache_dir: CacheDirOption = None,
) -> None:
    """Quantize a model's weights here, round to nearest (app/models/quantize.py); serve
    the result as a model's ``source``. Prints the new directory."""
    from app.models.quantize import SCHEMES, quantize

    if scheme not in SCHEMES:
        raise typer.BadParameter(f"one of {', '.join(SCHEMES)}", param_hint="--scheme")
    path = Path(source)
    if source in MODELS:
        found = find_prepared(source, _models_dir(ctx, cache_dir))
        if found is None:
            raise typer.BadParameter(f"run `switchyard models prepare {source}` first")
        path = Path(found.path)
    try:
        done = quantize(path, dest, scheme, group_size)
    except (OSError, ValueError) as exc:
        _stderr().print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    typer.echo(str(done))


@models_app.command("fetch")
def fetch_command(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="s3://BUCKET/PREFIX of an HF model folder.")],
    cache_dir: CacheDirOption = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Re-hash a cached copy; fetch it again if damaged.")
    ] = False,
) -> None:
    """Download an s3:// model into this node's cache, as a replica would at start (an
    init container can pre-warm a node); prints the directory. Endpoint and region come
    from SWITCHYARD_S3_ENDPOINT_URL / SWITCHYARD_S3_REGION, credentials from the AWS
    chain."""
    settings = ctx.find_object(Settings) or load_settings()
    try:
        location = S3Location.parse(url, settings.s3_endpoint_url, settings.s3_region)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    dest = location.cache_dir(_models_dir(ctx, cache_dir))
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TimeElapsedColumn(), console=_stderr()) as progress:
        task = progress.add_task(escape(location.url), total=None)

        def report(event: FetchProgress) -> None:
            progress.update(task, completed=event.done, total=event.total)

        try:
            fetched = fetch_model(location, dest, progress=report, progress_every_s=0.2,
                                  verify=verify)  # fmt: skip
        except S3SourceError as exc:
            _stderr().print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(1) from None
    _stderr().print("downloaded" if fetched else "already on this node")
    typer.echo(str(dest))


@models_app.command("list")
def list_command(
    ctx: typer.Context,
    cache_dir: CacheDirOption = None,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash every file.")] = False,
) -> None:
    """Show every known model, whether it is prepared, and where."""
    models_dir = _models_dir(ctx, cache_dir)
    rows = [("NAME", "STATE", "SERVED AS", "SHA256", "PATH")]
    for name, spec in MODELS.items():
        found = find_prepared(name, models_dir, verify=verify)
        path = models_dir / name
        state = "ready" if found else ("invalid" if path.exists() else "missing")
        rows.append((name, state, spec.served_name, found.sha256[:12] if found else "-", str(path)))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        typer.echo("  ".join([*cells, row[4]]))


@models_app.command("path")
def path_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.", callback=_check_name)],
    cache_dir: CacheDirOption = None,
) -> None:
    """Print the directory of a prepared model (exit 1 if it is not prepared)."""
    found = find_prepared(name, _models_dir(ctx, cache_dir))
    if found is None:
        _stderr().print(
            f"[red]error:[/red] model {name!r} is not prepared; "
            f"run: switchyard models prepare {name}"
        )
        raise typer.Exit(1)
    typer.echo(str(found.path))


def main() -> None:
    """Console-script entry point (``switchyard``)."""
    app()


if __name__ == "__main__":
    main()
