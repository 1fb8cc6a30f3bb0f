"""``switchyard eval``: the sets listed, a bad set name refused, and the key never in
the command line a report records."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli.eval import without_key
from app.cli.main import app


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        (["eval", "run", "--model", "m", "--api-key", "sk-1"], ["eval", "run", "--model", "m"]),
        (["eval", "run", "--api-key=sk-1", "--model", "m"], ["eval", "run", "--model", "m"]),
        (["eval", "run", "--model", "m"], ["eval", "run", "--model", "m"]),
    ],
)
def test_the_key_is_left_out_of_the_recorded_command(argv: list[str], recorded: list[str]) -> None:
    assert without_key(argv) == recorded


def test_sets_lists_the_shipped_sets() -> None:
    result = CliRunner().invoke(app, ["eval", "sets"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["general", "korean", "service"]
    assert [line.split("\t")[1] for line in lines] == ["100 items", "50 items", "50 items"]


def test_an_unknown_set_is_refused() -> None:
    result = CliRunner().invoke(app, ["eval", "run", "--model", "m", "--sets", "trivia"])
    assert result.exit_code == 2 and "choose among general, korean, service" in result.output
