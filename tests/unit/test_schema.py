"""app/schema.py: the strict bases refuse unknown fields by name; the frozen one also
refuses changes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schema import Strict, StrictFrozen


class Body(Strict):
    name: str


class Settings(StrictFrozen):
    size: int = 1


@pytest.mark.parametrize("model", [Body, Settings])
def test_an_unknown_field_is_refused_by_name(model: type[Strict | StrictFrozen]) -> None:
    with pytest.raises(ValidationError, match="nmae"):
        model.model_validate({"name": "x", "size": 1, "nmae": "typo"})


def test_only_the_frozen_base_refuses_changes() -> None:
    body = Body(name="a")
    body.name = "b"
    assert body.name == "b"
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.size = 2  # type: ignore[misc]
    assert settings.size == 1
