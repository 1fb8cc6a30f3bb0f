"""A throw-away ``redis-server`` on a free loopback port, without persistence — for the
test suite (tests/conftest.py) and the benchmarks. Never a fake: the real server."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ATTEMPTS = 3  # another process may take the free port before redis binds it
START_TIMEOUT_S = 10.0


class RedisUnavailable(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """Start ``redis-server`` (logs in ``workdir``) and yield ``redis://127.0.0.1:PORT``;
    stop it on exit. Raises ``RedisUnavailable`` when it is not installed or won't start."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RedisUnavailable("redis-server is not installed: run `make services` first")
    for _ in range(ATTEMPTS):
        port = free_port()
        args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
        with (workdir / f"redis-{port}.log").open("wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline and not answers_ping(port):
                time.sleep(0.05)
            if proc.poll() is None and answers_ping(port):
                try:
                    yield f"redis://127.0.0.1:{port}"
                finally:
                    _stop(proc)
                return
            _stop(proc)
    raise RedisUnavailable(f"redis-server did not start; see the logs in {workdir}")
