"""The shipped evaluation sets (app.eval.sets): their sizes and kinds as the seed asks
(100 general questions, 50 Korean instructions, 50 service prompts), a version tied to
the file's bytes, and set files that cannot load."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.eval.sets import LAYERS, SETS_DIR, EvalSet, load


@pytest.mark.parametrize(
    ("layer", "kinds"),
    [
        ("general", {"answer": 100}),
        ("korean", {"instruction": 50}),
        ("service", {"json": 17, "tool_call": 17, "refusal": 16}),
    ],
)
def test_the_shipped_sets(layer: str, kinds: dict[str, int]) -> None:
    s = load(layer)
    assert Counter(i.kind for i in s.items) == kinds
    assert s.label == f"{layer} v{s.version} ({s.digest})" and len(s.digest) == 12


def test_korean_instructions_ask_for_korean_or_a_checkable_shape() -> None:
    for i in load("korean").items:
        assert i.checks is not None
        assert i.checks.language == "ko" or i.checks.format is not None, i.id


def test_service_refusals_cover_both_sides() -> None:
    refusals = [i for i in load("service").items if i.kind == "refusal"]
    assert {i.refuse for i in refusals} == {True, False}
    assert all(i.system == "support" for i in refusals)


def test_the_version_follows_the_files_bytes(tmp_path: Path) -> None:
    text = (SETS_DIR / "general.yaml").read_text()
    (tmp_path / "general.yaml").write_text(text)
    same = load("general", tmp_path)
    (tmp_path / "general.yaml").write_text(text.replace("France", "Belgium", 1))
    changed = load("general", tmp_path)
    assert same.digest == load("general").digest != changed.digest
    assert set(LAYERS) == {"general", "korean", "service"}


BASE: dict[str, Any] = {
    "set": "service",
    "version": 1,
    "max_tokens": 8,
    "tools": {"t": {"description": "d", "parameters": {}}},
}


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ([{"id": "a", "prompt": "p"}], "exactly one way"),
        ([{"id": "a", "prompt": "p", "accept": ["x"], "refuse": True}], "exactly one way"),
        (
            [
                {"id": "a", "prompt": "p", "accept": ["x"]},
                {"id": "a", "prompt": "q", "accept": ["y"]},
            ],
            "repeat",
        ),
        ([{"id": "a", "prompt": "p", "tools": ["nope"], "call": "nope"}], "unknown names"),
        ([{"id": "a", "prompt": "p", "tools": ["t"], "call": "u"}], "unknown names"),
        ([{"id": "a", "prompt": "p", "json_schema": "none"}], "unknown names"),
        ([{"id": "a", "prompt": "p", "system": "none", "refuse": True}], "unknown names"),
        ([{"id": "a", "prompt": "p", "accept": ["x"], "colour": "red"}], "Extra inputs"),
        ([{"id": "a", "prompt": "p", "pattern": "(unclosed"}], "a: pattern"),
    ],
)
def test_a_set_that_does_not_load(items: list[dict[str, Any]], error: str, tmp_path: Path) -> None:
    (tmp_path / "service.yaml").write_text(yaml.safe_dump({**BASE, "items": items}))
    with pytest.raises(ValidationError, match=error):
        load("service", tmp_path)
    with pytest.raises(ValidationError):
        EvalSet.model_validate({**BASE, "items": items, "unknown": 1})
