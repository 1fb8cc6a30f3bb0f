from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings, load_settings


def test_environment_is_read_by_load_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path))
    s = load_settings()
    assert s.cache_dir == tmp_path
    assert s.models_dir == tmp_path / "models"
    assert s.vllm_cache_dir == tmp_path / "vllm"


def test_default_cache_dir_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHYARD_CACHE_DIR", raising=False)
    assert load_settings().cache_dir.name == "switchyard"


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(cache_dirr="/x")  # type: ignore[call-arg]
