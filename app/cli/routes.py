"""``switchyard routes check FILE``: validate a routes file the way the router will on a
(hot) reload, naming the path of every bad field; with ``--serve-config`` also check
that local pools name models the application serves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from app.config import AppArgs
from app.routing.spec import RoutesFileError, load_routes
from app.routing.table import LocalModel, check_local_pools

routes_app = typer.Typer(help="Check routes files.", no_args_is_help=True)


def _served_models(config: Path) -> dict[str, LocalModel]:
    data = yaml.safe_load(config.read_text())
    out: dict[str, LocalModel] = {}
    for application in data.get("applications", []):
        args = AppArgs.model_validate(application.get("args", {}))
        for m in args.models:
            out[m.id] = LocalModel(m.pool, m.task, m.max_model_len)
    return out


@routes_app.command("check")
def check(
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
    typer.echo(
        f"ok: {len(spec.pools)} pools, {len(spec.models)} models, {len(spec.aliases)} aliases"
    )
