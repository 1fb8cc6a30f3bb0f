"""``app.cli.main``: the CLI works without the load generator's extra (a serving image
leaves aiohttp and matplotlib out); ``switchyard bench`` then says how to get it."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Run the CLI in a fresh interpreter where the bench extra cannot be imported.
WITHOUT_BENCH = """
import sys
sys.modules["matplotlib"] = None  # import fails as if the package were absent
from app.cli.main import main
sys.argv = ["switchyard", *sys.argv[1:]]
main()
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_BENCH, *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("args", [["bench"], ["bench", "run", "--rate", "1"]])
def test_bench_without_its_extra_exits_2_and_names_the_extra(args: list[str]) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert "pip install 'switchyard[bench]'" in result.stderr
    assert "matplotlib" in result.stderr


def test_the_other_commands_work_without_the_bench_extra() -> None:
    result = run("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout
