"""``switchyard adapters add|list|remove``: the LoRA adapters of served models.

``add`` reads the serve config (``--config``, default the one ``make run`` serves) to
know the served models and their ``lora:`` blocks, checks the adapter's PEFT files
against them (rank, target modules) and registers it in the state store, where every
ingress replica finds it at its next request: no restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from app.adapters.registry import AdapterBase
from app.builders import adapter_bases, adapter_s3, engine_config
from app.cli.admin import (
    Format,
    FormatOption,
    StateUrlOption,
    _call,
    _note,
    _print_json,
    _print_table,
)
from app.config import AppArgs
from app.models.lora import build_random_lora
from app.settings import Settings, load_settings

adapters_app = typer.Typer(help="Register, list and remove LoRA adapters.", no_args_is_help=True)

ConfigOption = Annotated[
    Path, typer.Option("--config", help="The serve config whose models adapters extend.")
]


def served_bases(config: Path, settings: Settings) -> dict[str, AdapterBase]:
    data = yaml.safe_load(config.read_text())
    engines = {}
    for application in data.get("applications", []):
        args = AppArgs.model_validate(application.get("args", {}))
        engines.update({m.id: engine_config(m, settings) for m in args.models})
    return adapter_bases(engines)


@adapters_app.command("add")
def adapters_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Adapter name; clients ask for BASE:NAME.")],
    base: Annotated[str, typer.Option("--base", help="The served base model's id.")],
    source: Annotated[
        str, typer.Option("--source", help="Directory or s3://bucket/prefix of the PEFT files.")
    ],
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Private to this tenant (others get 404).")
    ] = None,
    price_in: Annotated[
        float | None, typer.Option("--price-per-1m-in", help="USD per 1M input tokens.")
    ] = None,
    price_out: Annotated[
        float | None, typer.Option("--price-per-1m-out", help="USD per 1M output tokens.")
    ] = None,
    config: ConfigOption = Path("serve_configs/lora.yaml"),  # the config that serves adapters
    state_url: StateUrlOption = None,
) -> None:
    """Check an adapter's files against its base and register it."""
    settings = ctx.find_object(Settings) or load_settings()
    bases = served_bases(config, settings)
    source = str(Path(source).resolve()) if "://" not in source else source
    record = _call(
        ctx,
        state_url,
        lambda s: s.add_adapter(name, base, source, tenant, price_in, price_out),
        adapter_bases=bases,
        adapter_s3=adapter_s3(settings),
    )
    owner = f" for tenant {record.tenant}" if record.tenant else ""
    _note(f"added adapter {record.id} (rank {record.rank}){owner}")
    typer.echo(record.id)


@adapters_app.command("list")
def adapters_list(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")] = None,
    fmt: FormatOption = Format.table,
    state_url: StateUrlOption = None,
) -> None:
    """Registered adapters."""
    found = _call(ctx, state_url, lambda s: s.list_adapters(tenant))
    if fmt == Format.json:
        _print_json([a.model_dump() for a in found])
        return
    rows = [[a.id, a.base, str(a.rank), a.tenant or "(all)", a.source] for a in found]
    _print_table("adapters", ["id", "base", "rank", "tenant", "source"], rows)


@adapters_app.command("remove")
def adapters_remove(
    ctx: typer.Context,
    adapter_id: Annotated[str, typer.Argument(help="BASE:NAME")],
    state_url: StateUrlOption = None,
) -> None:
    """Remove an adapter: requests for it get 404 from then on."""
    _call(ctx, state_url, lambda s: s.remove_adapter(adapter_id))
    _note(f"removed adapter {adapter_id}")


@adapters_app.command("random")
def adapters_random(
    ctx: typer.Context,
    dest: Annotated[Path, typer.Argument(help="Directory to write the PEFT files into.")],
    base: Annotated[str, typer.Option("--base", help="The served base model's id.")],
    rank: Annotated[int, typer.Option("--rank", help="LoRA rank.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same weights.")] = 0,
    config: ConfigOption = Path("serve_configs/lora.yaml"),  # the config that serves adapters
) -> None:
    """Write a random-weight LoRA adapter of a served model (to try the workflow; it
    changes answers and teaches nothing)."""
    settings = ctx.find_object(Settings) or load_settings()
    found = served_bases(config, settings).get(base)
    if found is None or found.weights is None:
        raise typer.BadParameter(
            f"{base} is not a served model with weights on this node in {config} "
            "(run `make models` first)",
            param_hint="--base",
        )
    try:
        build_random_lora(dest, found.weights, seed=seed, rank=rank)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--base") from None
    _note(f"wrote a random rank-{rank} adapter of {base} to {dest}")
    typer.echo(str(dest))
