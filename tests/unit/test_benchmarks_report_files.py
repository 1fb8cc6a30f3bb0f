"""benchmarks/report_files.py: one writer for a run's JSON and markdown."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.report_files import write_report


def test_json_and_markdown_side_by_side_under_one_stem(tmp_path: Path) -> None:
    out = tmp_path / "new" / "folder"  # created when missing
    when = datetime(2026, 12, 6, tzinfo=UTC)
    data, text = write_report(out, "run-2026-12-06", {"when": when, "n": 3}, "# Run\n\n\n")
    assert (data, text) == (out / "run-2026-12-06.json", out / "run-2026-12-06.md")
    assert json.loads(data.read_text()) == {"when": str(when), "n": 3}  # non-JSON as str
    assert text.read_text() == "# Run\n"  # one final newline
