"""``switchyard eval``: ``sets`` lists the shipped evaluation sets (layer, version, items);
``run`` sends them through a running endpoint's chat API for one model and writes the
scored report (markdown, JSON and a plot) under ``--out``. Progress goes to stderr, the
report's paths to stdout. The key comes from ``--api-key`` or ``SWITCHYARD_API_KEY`` and
is never written anywhere."""

from __future__ import annotations

import asyncio
import datetime as dt
import shlex
import sys
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.bench.metadata import git_commit
from app.eval import report
from app.eval.runner import Result, run
from app.eval.sets import LAYERS, EvalSet, load

eval_app = typer.Typer(help="Score a model on the shipped evaluation sets.", no_args_is_help=True)


@eval_app.command("sets")
def sets_command() -> None:
    """The shipped sets: layer, version (with the file's digest) and items."""
    for layer in LAYERS:
        s = load(layer)
        typer.echo(f"{s.label}\t{len(s.items)} items")


def without_key(argv: list[str]) -> list[str]:
    """The command line as the report records it: ``--api-key`` and its value left out."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--api-key":
            skip = True
        elif not arg.startswith("--api-key="):
            out.append(arg)
    return out


def _sets(names: str) -> list[EvalSet]:
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in LAYERS]
    if unknown or not chosen:
        raise typer.BadParameter(f"--sets: choose among {', '.join(LAYERS)}")
    return [load(n) for n in chosen]


@eval_app.command("run")
def run_command(
    model: Annotated[str, typer.Option("--model", help="The model (or alias) to score.")],
    url: Annotated[str, typer.Option("--url", help="Base URL.")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="SWITCHYARD_API_KEY", help="Bearer key.", show_default=False
        ),
    ] = None,
    sets: Annotated[str, typer.Option("--sets", help="Comma-separated sets.")] = ",".join(LAYERS),
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="The first N items of each set.")
    ] = None,
    concurrency: Annotated[int, typer.Option("-c", "--concurrency", min=1)] = 4,
    timeout: Annotated[float, typer.Option("--timeout", help="Per request (s).")] = 120.0,
    out: Annotated[Path, typer.Option("--out", help="Report directory.")] = Path("eval-reports"),
    tag: Annotated[str, typer.Option("--tag", help="Appended to the report's name.")] = "",
) -> None:
    """Score MODEL on the sets; write ``eval-<model>-<date>[-<tag>]`` under --out."""
    chosen = _sets(sets)
    total = sum(min(len(s.items), limit or len(s.items)) for s in chosen)
    console = Console(stderr=True)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"eval {model}", total=total)
        failed = [0]

        def progress(r: Result) -> None:
            failed[0] += 0 if r.verdict.ok else 1
            bar.update(task, advance=1, description=f"eval {model}: {failed[0]} failed")

        async def go() -> list[Result]:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout) as c:
                return await run(c, chosen, model, concurrency, limit, progress)

        results = asyncio.run(go())
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    argv = without_key(sys.argv[1:])
    meta = {
        "model": model,
        "date": date,
        "git_commit": git_commit(),
        "command": "switchyard " + shlex.join(argv),
        "sets": [s.label for s in chosen],
        "concurrency": concurrency,
        "limit": limit,
    }
    doc = report.document(results, meta)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in model)
    stem = "-".join(p for p in ("eval", safe, date[:10], tag) if p)
    for path in report.write(doc, out, stem):
        typer.echo(str(path))
    o = doc["overall"]
    low, high = o["ci95"]
    console.print(
        f"{model}: {o['passed']}/{o['n']} passed, score {o['score']:.3f} "
        f"(95 % {low:.3f}–{high:.3f})"
    )
