"""``switchyard usage``: the ledger per tenant and model, or its records, as a table,
JSON or CSV (the same data as ``GET /admin/usage``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

import typer
from pydantic import BaseModel

from app.admin.service import UsageRow
from app.admin.views import format_time
from app.cli.admin import StateUrlOption, _call, _print_json, _print_table, _time
from app.state.protocol import LedgerQuery, gateway_request_id
from app.state.records import LedgerRecord

usage_app = typer.Typer(subcommand_metavar="")


class UsageFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


# ---- usage -------------------------------------------------------------------------------

USAGE_HEADERS = ("TENANT", "MODEL", "REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "CACHED")
USAGE_SUMS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
    "gpu_seconds",
    "gpu_cost_usd",
)
RECORD_HEADERS = ("ENDED", "TENANT", "MODEL", "STATUS", "PROMPT", "COMPLETION", "CACHED")


def _csv(models: Sequence[BaseModel], fields: Sequence[str]) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows(m.model_dump() for m in models)
    typer.echo(out.getvalue(), nl=False)


def _usage_table(rows: list[UsageRow]) -> None:
    def cells(r: UsageRow) -> tuple[str, ...]:
        counts = (r.requests, r.errors, r.prompt_tokens, r.completion_tokens, r.cached_tokens)
        costs = (f"{r.cost_usd:.6f}", f"{r.gpu_seconds:.3f}", f"{r.gpu_cost_usd:.6f}")
        return (r.tenant, r.model, *map(str, counts), *costs)

    sums = {f: sum(getattr(r, f) for r in rows) for f in USAGE_SUMS}
    total = UsageRow(tenant="total", model="", **sums)
    body = [cells(r) for r in rows] + ([cells(total)] if len(rows) > 1 else [])
    headers = (*USAGE_HEADERS, "LIST USD", "GPU S", "GPU USD")
    _print_table("usage", headers, body)


def _records_table(records: list[LedgerRecord]) -> None:
    rows = [
        (
            *(format_time(r.ended_at), r.tenant, r.model_served or r.model_requested, r.status),
            *map(str, (r.prompt_tokens, r.completion_tokens, r.cached_tokens)),
            *(f"{r.cost_usd:.6f}", _gpu(r.gpu_seconds, 3), _gpu(r.gpu_cost_usd, 6)),
            r.request_id,
        )
        for r in records
    ]
    headers = (*RECORD_HEADERS, "LIST USD", "GPU S", "GPU USD", "REQUEST ID")
    _print_table("usage records", headers, rows)


def _gpu(value: float | None, places: int) -> str:
    return "-" if value is None else f"{value:.{places}f}"


@usage_app.callback(invoke_without_command=True)
def usage(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="ISO 8601, epoch seconds, or 24h/7d ago.")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Exclusive end, like --since.")
    ] = None,
    fmt: Annotated[
        UsageFormat, typer.Option("--format", help="Output format.")
    ] = UsageFormat.table,
    records: Annotated[
        bool, typer.Option("--records", help="The ledger records, not the summary.")
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most N newest records.")
    ] = None,
    request_id: Annotated[
        str | None,
        typer.Option(
            "--request-id",
            help="The record of one request: its x-request-id or the response's id "
            "(chatcmpl-…); implies --records.",
        ),
    ] = None,
    state_url: StateUrlOption = None,
) -> None:
    """Usage from the ledger, per tenant and model (or the records, with --records)."""
    query = LedgerQuery(
        tenant=tenant,
        since=_time(since, "--since"),
        until=_time(until, "--until"),
        limit=limit,
        request_id=None if request_id is None else gateway_request_id(request_id),
    )
    if records or request_id is not None:
        found = _call(ctx, state_url, lambda s: s.usage_records(query))
        if fmt is UsageFormat.json:
            _print_json([r.model_dump() for r in found])
        elif fmt is UsageFormat.csv:
            _csv(found, list(LedgerRecord.model_fields))
        else:
            _records_table(found)
        return
    rows = _call(ctx, state_url, lambda s: s.usage(query))
    if fmt is UsageFormat.json:
        _print_json([r.model_dump() for r in rows])
    elif fmt is UsageFormat.csv:
        _csv(rows, list(UsageRow.model_fields))
    else:
        _usage_table(rows)
