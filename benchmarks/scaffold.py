"""The benchmarks' one command-line scaffold. A script's parser starts from ``parser``
with the flags every script shares (``--out``: the report's folder, ``docs/benchmarks``
by default; ``--tag``: appended to the file name; ``--quick`` where the script has a
short run), its report is named by ``stem`` (``<name>-<date>[-quick][-<tag>]``, so a
quick or tagged run never overwrites a report of record), ``command`` is the line that
re-runs it, and ``finish`` ends the run: the plot, then the JSON and the markdown
under that stem (``report_files.write_report``), and one line saying where they went."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.report_files import write_report

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "docs" / "benchmarks"


def parser(
    description: str | None, *, quick: bool = False, out: Path = OUT_DIR
) -> argparse.ArgumentParser:
    """A parser with the shared flags; ``description`` is the script's docstring (its
    first paragraph is shown)."""
    first = (description or "").strip().split("\n\n")[0]
    p = argparse.ArgumentParser(description=first or None)
    p.add_argument("--out", type=Path, default=out, help="the folder the report goes to")
    p.add_argument("--tag", default="", help="appended to the report's file name")
    if quick:
        p.add_argument("--quick", action="store_true", help="a short run, named -quick")
    return p


def stem(name: str, args: argparse.Namespace, date: str | None = None) -> str:
    """``<name>-<date>[-quick][-<tag>]``; ``date`` (ISO, today by default) is cut to
    the day."""
    parts = [name, (date or dt.date.today().isoformat())[:10]]
    if getattr(args, "quick", False):
        parts.append("quick")
    if getattr(args, "tag", ""):
        parts.append(args.tag)
    return "-".join(parts)


def command(script: str, argv: list[str] | None = None) -> str:
    """The command that re-runs this run: ``python -m benchmarks.<script>`` and its
    arguments."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m benchmarks." + script, *args])


def shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (reports carry no
    machine paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def finish(
    args: argparse.Namespace,
    name: str,
    doc: Any,
    markdown: str,
    plot: Callable[[Path], None] | None = None,
) -> Path:
    """Write the run's plot (``plot(<out>/<name>.png)``, when given), its JSON and its
    markdown under ``args.out``; say where; return the markdown's path."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if plot is not None:
        plot(out / f"{name}.png")
    _, text = write_report(out, name, doc, markdown)
    print(f"wrote {shown(text)}", file=sys.stderr, flush=True)
    return text
