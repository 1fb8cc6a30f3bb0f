"""The one report writer every benchmark uses: a run's JSON (its data and metadata) and
its markdown, side by side under one stem in the output folder (``docs/benchmarks/``
for reports of record)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, stem: str, doc: Any, markdown: str) -> tuple[Path, Path]:
    """Write ``<out>/<stem>.json`` and ``<out>/<stem>.md``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    data, text = out / f"{stem}.json", out / f"{stem}.md"
    data.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    text.write_text(markdown.rstrip("\n") + "\n")
    return data, text
