"""``switchyard routes check FILE``: validate a routes file the way the router will on a
(hot) reload, naming the path of every bad field; with ``--serve-config`` also check
that local pools name models the application serves. A measured quality that may no
longer hold (``app.routing.measured.stale``: the eval sets changed, the report scored
another model, the model's files are newer than the report) is a warning on stderr,
not an error."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from app.config import AppArgs, ModelSpec
from app.eval.sets import LAYERS, load
from app.models.prepare import find_prepared
from app.routing.measured import stale
from app.routing.spec import RoutesFileError, load_routes
from app.routing.table import LocalModel, check_local_pools
from app.settings import Settings

routes_app = typer.Typer(help="Check routes files.", no_args_is_help=True)


def _served(config: Path) -> list[ModelSpec]:
    data = yaml.safe_load(config.read_text())
    out: list[ModelSpec] = []
    for application in data.get("applications", []):
        out += AppArgs.model_validate(application.get("args", {})).models
    return out


def _served_models(config: Path) -> dict[str, LocalModel]:
    return {m.id: LocalModel(m.pool, m.task, m.max_model_len) for m in _served(config)}


def _weights_mtime(source: str | None, models_dir: Path) -> float | None:
    """The newest file time of a model's weights where they are on this machine: an
    embedded model prepared here, or a local directory."""
    path: Path | None = None
    if source is not None and source.startswith("embedded:"):
        prepared = find_prepared(source.removeprefix("embedded:"), models_dir)
        path = prepared.path if prepared is not None else None
    elif source is not None and "://" not in source and ":" not in source.split("/")[0]:
        path = Path(source)
    if path is None or not path.is_dir():
        return None
    times = [f.stat().st_mtime for f in path.iterdir() if f.is_file()]
    return max(times, default=None)


@routes_app.command("check")
def check(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The routes file.")],
    serve_config: Annotated[
        Path | None,
        typer.Option("--serve-config", help="A serve config whose models local pools must name."),
    ] = None,
) -> None:
    """Validate a routes file; exit 1 with one line per problem."""
    err = Console(stderr=True)
    try:
        spec = load_routes(path)
        if serve_config is not None:
            check_local_pools(spec, _served_models(serve_config))
    except (RoutesFileError, ValueError) as exc:
        err.print(f"[red]invalid:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(1) from None
    mtimes: dict[str, float] = {}
    if serve_config is not None:
        settings: Settings = ctx.obj
        for m in _served(serve_config):
            when = _weights_mtime(m.source, settings.models_dir)
            if when is not None:
                mtimes[m.id] = when
    for line in stale(spec, [load(layer).label for layer in LAYERS], mtimes):
        err.print(f"[yellow]warning:[/yellow] {line}", markup=True, highlight=False)
    typer.echo(
        f"ok: {len(spec.pools)} pools, {len(spec.models)} models, {len(spec.aliases)} aliases"
    )
