"""Shared fixtures. Settings are read once per test session, like the app does:
`make test` prepares the embedded models into the same cache first, so the suite
reuses them (preparation is idempotent)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports transformers

import shutil
import socket
import subprocess
import time
import uuid
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


# ---- a real Redis for the state-store tests -------------------------------------------


def unique_namespace(prefix: str = "t") -> str:
    """A Redis key namespace no other test uses (tests share one server)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_namespace() -> str:
    return unique_namespace()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` on a free loopback port, without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: run `make services` first", pytrace=False)
    workdir = tmp_path_factory.mktemp("redis")
    for _ in range(3):  # another process may grab the free port before redis does
        port = _free_port()
        args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
        log = (workdir / f"redis-{port}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline and not _answers_ping(port):
            time.sleep(0.05)
        if proc.poll() is None and _answers_ping(port):
            break
        proc.kill()
        proc.wait()
        log.close()
    else:
        pytest.fail(f"redis-server did not start; see {workdir}", pytrace=False)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
