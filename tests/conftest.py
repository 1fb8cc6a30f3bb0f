"""Shared fixtures. Settings are read once per test session, like the app does:
`make test` prepares the embedded models into the same cache first, so the suite
reuses them (preparation is idempotent)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports transformers

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings, load_settings
from benchmarks.local_redis import RedisProcess, RedisUnavailable, redis_server


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    yield load_settings()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight two-layer Llama with a locally trained tokenizer (~5 s)."""
    from app.models.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def tiny_loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three random rank-8 LoRA adapters of the tiny Llama (PEFT files, no download)."""
    from app.models.tiny import build_tiny_lora

    root = tmp_path_factory.mktemp("tiny-loras")
    names = ("a1", "a2", "a3")
    return {name: build_tiny_lora(root / name, seed) for seed, name in enumerate(names, 1)}


# ---- a real S3-compatible server for the s3:// model sources ---------------------------


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on a free loopback port; its dummy credentials are in the
    environment for the whole session (Ray workers started later inherit them)."""
    from tests.s3_server import CREDENTIALS, s3_server

    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    with s3_server(tmp_path_factory.mktemp("s3")) as url:
        yield url


# ---- a real Redis for the state-store tests -------------------------------------------


def unique_namespace(prefix: str = "t") -> str:
    """A Redis key namespace no other test uses (tests share one server)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_namespace() -> str:
    return unique_namespace()


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` on a free loopback port, without persistence."""
    try:
        with redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url + "/0"
    except RedisUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A real ``redis-server`` of this test's own that it may stop, kill and start again
    on the same port and data (outage tests)."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    r = RedisProcess(workdir)
    try:
        r.start()
    except RedisUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield r
    r.stop()
