"""Shared fixtures. Settings are built once per test session in a temporary cache
directory unless SWITCHYARD_CACHE_DIR points at prepared models (CI and `make test`
prepare them first, so the suite reuses that cache)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings, load_settings


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield load_settings()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight two-layer Llama with a locally trained tokenizer (~5 s)."""
    from app.models.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")
