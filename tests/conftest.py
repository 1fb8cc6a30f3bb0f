"""Shared fixtures. Settings are read once per test session, like the app does:
`make test` prepares the embedded models into the same cache first, so the suite
reuses them (preparation is idempotent)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports transformers

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    yield load_settings()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight two-layer Llama with a locally trained tokenizer (~5 s)."""
    from app.models.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")
