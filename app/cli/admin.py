"""``switchyard keys|tenants|limits``: operator actions on the state store (``usage`` is
in ``app.cli.usage``).

Each command opens the store named by ``--state-url`` (default: the settings'
``resolved_state_url``), runs one ``AdminService`` call and closes the store. Results go
to stdout (a new key's secret is the only line ``keys create`` and ``keys rotate``
print; it is never shown again), notes and errors to stderr; an error the operator can
fix (unknown id, unreachable store) exits with status 1.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.adapters.registry import AdapterBase, AdapterRegistry, S3Defaults
from app.admin.service import AdminError, AdminService
from app.admin.views import format_time, parse_time, public_key_view
from app.settings import Settings, load_settings
from app.state.factory import open_store
from app.state.protocol import StoreUnavailable
from app.state.records import Limits

T = TypeVar("T")

keys_app = typer.Typer(help="Create, list, revoke and rotate API keys.", no_args_is_help=True)
tenants_app = typer.Typer(help="Create, list, enable and disable tenants.", no_args_is_help=True)
limits_app = typer.Typer(help="Limits for teams and users inside a tenant.", no_args_is_help=True)


class Format(StrEnum):
    table = "table"
    json = "json"


StateUrlOption = Annotated[
    str | None,
    typer.Option(
        "--state-url",
        help="sqlite:///PATH or redis://HOST:PORT/DB; default from settings.",
        show_default=False,
    ),
]
FormatOption = Annotated[Format, typer.Option("--format", help="Output format.")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant id.")]


def _limit_option(flag: str, kind: type, low: int, text: str) -> Any:
    option = typer.Option(flag, min=low, help=text, show_default=False, rich_help_panel="Limits")
    return Annotated[kind | None, option]


# The limit flags, declared once; ``with_limit_options`` hands them to a command.
LIMIT_OPTIONS: dict[str, Any] = {
    "rpm": _limit_option("--rpm", int, 1, "Requests per minute."),
    "tpm": _limit_option("--tpm", int, 1, "Tokens (prompt + completion) per minute."),
    "max_concurrent": _limit_option("--max-concurrent", int, 1, "Requests in flight at once."),
    "daily_tokens": _limit_option("--daily-tokens", int, 0, "Tokens per UTC day."),
    "monthly_tokens": _limit_option("--monthly-tokens", int, 0, "Tokens per UTC month."),
    "daily_usd": _limit_option("--daily-usd", float, 0, "US dollars per UTC day."),
    "monthly_usd": _limit_option("--monthly-usd", float, 0, "US dollars per UTC month."),
    # how the level shares a saturated model (app.fairness)
    "priority": Annotated[
        str | None,
        typer.Option(
            "--priority",
            help="Band: interactive, standard or batch (sheddable).",
            show_default=False,
            rich_help_panel="Limits",
        ),
    ],
    "share": _limit_option("--share", float, 0, "Weight among tenants of a saturated model."),
    "raise_priority": Annotated[
        bool | None,
        typer.Option(
            "--raise-priority/--no-raise-priority",
            show_default=False,
            help="Whether requests may ask for a higher band (x-switchyard-priority).",
            rich_help_panel="Limits",
        ),
    ],
}


def with_limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the limit flags; it receives them as ``limits: Limits``
    (a keyword-only parameter), unset flags meaning no limit."""
    signature = inspect.signature(command, eval_str=True)
    kept = [p for p in signature.parameters.values() if p.name != "limits"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in LIMIT_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in LIMIT_OPTIONS}
        command(*args, limits=Limits(**values), **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
    return wrapper


# ---- plumbing ----------------------------------------------------------------------------


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _note(message: str) -> None:
    _stderr().print(escape(message))


def _fail(message: str) -> NoReturn:
    _stderr().print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)


def _call(
    ctx: typer.Context,
    state_url: str | None,
    action: Callable[[AdminService], Awaitable[T]],
    adapter_bases: dict[str, AdapterBase] | None = None,
    adapter_s3: S3Defaults | None = None,
) -> T:
    """Run one service call on a freshly opened store, closing it afterwards (with the
    served models adapters may extend, for adapter registration)."""
    if state_url is None:
        settings = ctx.find_object(Settings) or load_settings()
        state_url = settings.resolved_state_url

    async def run(url: str) -> T:
        store = open_store(url)
        registry = (
            None if adapter_bases is None else AdapterRegistry(store, adapter_bases, s3=adapter_s3)
        )
        try:
            return await action(AdminService(store, adapters=registry))
        finally:
            await store.close()

    try:
        return asyncio.run(run(state_url))
    except (AdminError, StoreUnavailable, ValueError) as exc:
        _fail(str(exc))
    except OSError as exc:  # e.g. the SQLite file's directory cannot be made
        _fail(f"cannot open the state store {state_url}: {exc}")


def _time(value: str | None, flag: str, *, future: bool = False) -> float | None:
    try:
        return None if value is None else parse_time(value, future=future)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


def _limits_text(limits: Limits) -> str:
    set_ = {k: v for k, v in limits.model_dump().items() if v is not None}
    return " ".join(f"{k}={v}" for k, v in set_.items()) or "-"


def _print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(*headers, title=title, title_justify="left")
    for row in rows:
        table.add_row(*row)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 240  # piped: do not fold columns to 80 characters
    console.print(table)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


# ---- keys --------------------------------------------------------------------------------


def _issued_note(verb: str, key_id: str, tenant: str) -> None:
    _note(
        f"{verb} key {key_id} for tenant {tenant}. The key above is shown only this once "
        "and will not be shown again: store it now."
    )


@keys_app.command("create")
@with_limit_options
def keys_create(
    ctx: typer.Context,
    tenant: TenantOption,
    team: Annotated[str | None, typer.Option("--team", help="Team inside the tenant.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="User inside the tenant.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="A label for listings.")] = None,
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="ISO 8601 time, epoch seconds, or a duration (30d)."),
    ] = None,
    state_url: StateUrlOption = None,
    *,
    limits: Limits,
) -> None:
    """Create a key (and its tenant if new); prints the secret key, once."""
    expires_at = _time(expires, "--expires", future=True)
    issued = _call(
        ctx,
        state_url,
        lambda s: s.create_key(
            tenant, team=team, user=user, name=name, limits=limits, expires_at=expires_at
        ),
    )
    typer.echo(issued.secret)
    _issued_note("created", issued.record.id, tenant)


@keys_app.command("list")
def keys_list(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    fmt: FormatOption = Format.table,
    state_url: StateUrlOption = None,
) -> None:
    """List keys (never their secrets)."""
    keys = _call(ctx, state_url, lambda s: s.list_keys(tenant))
    if fmt is Format.json:
        _print_json([public_key_view(k) for k in keys])
        return
    headers = ("ID", "PREFIX", "TENANT", "TEAM", "USER", "NAME", "LIMITS", "CREATED")
    rows = [
        (
            *(k.id, k.prefix, k.tenant, k.team or "-", k.user or "-", k.name or "-"),
            *(_limits_text(k.limits), format_time(k.created_at), format_time(k.expires_at)),
            *(format_time(k.revoked_at), format_time(k.last_used_at)),
        )
        for k in keys
    ]
    _print_table("keys", (*headers, "EXPIRES", "REVOKED", "LAST USED"), rows)


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="Key id.")],
    state_url: StateUrlOption = None,
) -> None:
    """Revoke a key at once (revoking twice changes nothing)."""
    record = _call(ctx, state_url, lambda s: s.revoke_key(key_id))
    _note(f"key {record.id} revoked at {format_time(record.revoked_at)}")


@keys_app.command("rotate")
def keys_rotate(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="Key id.")],
    state_url: StateUrlOption = None,
) -> None:
    """Give a key a new secret (same id and limits); prints it, once. The old one stops."""
    issued = _call(ctx, state_url, lambda s: s.rotate_key(key_id))
    typer.echo(issued.secret)
    _issued_note("rotated", issued.record.id, issued.record.tenant)


# ---- tenants -----------------------------------------------------------------------------

TenantArgument = Annotated[str, typer.Argument(help="Tenant id.")]


@tenants_app.command("create")
@with_limit_options
def tenants_create(
    ctx: typer.Context, tenant: TenantArgument, state_url: StateUrlOption = None, *, limits: Limits
) -> None:
    """Create a tenant with the given limits."""
    _call(ctx, state_url, lambda s: s.create_tenant(tenant, limits))
    _note(f"created tenant {tenant} (limits: {_limits_text(limits)})")


@tenants_app.command("list")
def tenants_list(
    ctx: typer.Context, fmt: FormatOption = Format.table, state_url: StateUrlOption = None
) -> None:
    """List tenants."""
    tenants = _call(ctx, state_url, lambda s: s.list_tenants())
    if fmt is Format.json:
        _print_json([t.model_dump() for t in tenants])
        return
    rows = [
        (
            t.id,
            "disabled" if t.disabled else "enabled",
            _limits_text(t.limits),
            format_time(t.created_at),
        )
        for t in tenants
    ]
    _print_table("tenants", ("ID", "STATE", "LIMITS", "CREATED"), rows)


def _set_disabled(ctx: typer.Context, tenant: str, disabled: bool, url: str | None) -> None:
    _call(ctx, url, lambda s: s.update_tenant(tenant, disabled=disabled))
    _note(f"tenant {tenant} {'disabled' if disabled else 'enabled'}")


@tenants_app.command("disable")
def tenants_disable(
    ctx: typer.Context, tenant: TenantArgument, state_url: StateUrlOption = None
) -> None:
    """Refuse every request of a tenant until it is enabled again."""
    _set_disabled(ctx, tenant, True, state_url)


@tenants_app.command("enable")
def tenants_enable(
    ctx: typer.Context, tenant: TenantArgument, state_url: StateUrlOption = None
) -> None:
    """Serve a disabled tenant again."""
    _set_disabled(ctx, tenant, False, state_url)


@tenants_app.command("set-limits")
@with_limit_options
def tenants_set_limits(
    ctx: typer.Context, tenant: TenantArgument, state_url: StateUrlOption = None, *, limits: Limits
) -> None:
    """Replace a tenant's limits (a flag not given means no such limit)."""
    _call(ctx, state_url, lambda s: s.update_tenant(tenant, limits=limits))
    _note(f"tenant {tenant} limits: {_limits_text(limits)}")


# ---- team and user limits ----------------------------------------------------------------


@limits_app.command("set")
@with_limit_options
def limits_set(
    ctx: typer.Context,
    tenant: TenantOption,
    team: Annotated[str | None, typer.Option("--team", help="A team's limits.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="A user's limits.")] = None,
    state_url: StateUrlOption = None,
    *,
    limits: Limits,
) -> None:
    """Replace the limits of one team or one user (give --team or --user)."""
    if (team is None) == (user is None):
        raise typer.BadParameter("give exactly one of --team and --user")
    level, name = ("team", team) if team is not None else ("user", user or "")
    record = _call(ctx, state_url, lambda s: s.set_limits(level, tenant, name, limits))
    _note(f"{record.scope} limits: {_limits_text(limits)}")


@limits_app.command("list")
def limits_list(
    ctx: typer.Context, fmt: FormatOption = Format.table, state_url: StateUrlOption = None
) -> None:
    """List team and user limits."""
    records = _call(ctx, state_url, lambda s: s.list_limits())
    if fmt is Format.json:
        _print_json([r.model_dump() for r in records])
        return
    rows = [(r.level, r.tenant, r.name, _limits_text(r.limits)) for r in records]
    _print_table("limits", ("LEVEL", "TENANT", "NAME", "LIMITS"), rows)
