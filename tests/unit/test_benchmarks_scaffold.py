"""benchmarks/scaffold.py: the shared flags, the report's name, the re-run command and
the run's end (plot, JSON, markdown under one stem)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import scaffold


@pytest.mark.parametrize(
    ("argv", "quick", "date", "expected"),
    [
        ([], False, "2026-12-06", "run-2026-12-06"),
        (["--tag", "r2"], False, "2026-12-06", "run-2026-12-06-r2"),
        (["--quick"], True, "2026-12-06T10:11:12+00:00", "run-2026-12-06-quick"),
        (["--quick", "--tag", "x"], True, "2026-12-06", "run-2026-12-06-quick-x"),
        ([], True, "2026-12-06", "run-2026-12-06"),
    ],
)
def test_stem_names_quick_and_tagged_runs_apart(
    argv: list[str], quick: bool, date: str, expected: str
) -> None:
    args = scaffold.parser("doc", quick=quick).parse_args(argv)
    assert scaffold.stem("run", args, date) == expected


def test_parser_shares_out_and_tag_and_offers_quick_only_when_asked(tmp_path: Path) -> None:
    plain = scaffold.parser("First paragraph.\n\nMore.")
    assert plain.description == "First paragraph."
    args = plain.parse_args(["--out", str(tmp_path)])
    assert args.out == tmp_path and args.tag == ""
    assert scaffold.parser(None).parse_args([]).out == scaffold.OUT_DIR
    with pytest.raises(SystemExit):
        plain.parse_args(["--quick"])


def test_command_re_runs_the_script_with_its_arguments() -> None:
    assert scaffold.command("hops", ["--n", "50"]) == "python -m benchmarks.hops --n 50"
    assert scaffold.command("hops", []) == "python -m benchmarks.hops"


def test_shown_is_relative_to_the_repository_or_only_the_name(tmp_path: Path) -> None:
    assert scaffold.shown(scaffold.OUT_DIR / "x.md") == "docs/benchmarks/x.md"
    assert scaffold.shown(tmp_path / "y.md") == "y.md"


def test_finish_writes_plot_json_and_markdown_under_one_stem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reports"
    args = scaffold.parser("doc").parse_args(["--out", str(out)])
    drawn: list[Path] = []
    path = scaffold.finish(args, "run-x", {"a": 1}, "# Title", drawn.append)
    assert path == out / "run-x.md" and path.read_text() == "# Title\n"
    assert json.loads((out / "run-x.json").read_text()) == {"a": 1}
    assert drawn == [out / "run-x.png"]
    assert "wrote run-x.md" in capsys.readouterr().err
    scaffold.finish(args, "run-y", {}, "no plot")
    assert sorted(p.name for p in out.iterdir()) == [
        "run-x.json",
        "run-x.md",
        "run-y.json",
        "run-y.md",
    ]
