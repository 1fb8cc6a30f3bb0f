"""A throw-away ``redis-server`` on a free loopback port, without persistence — for the
test suite (tests/conftest.py) and the benchmarks — and ``RedisProcess``, one that can
be stopped, killed and started again on the same port and data (outage tests). Never a
fake: the real server."""

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


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server process; kill it when it does not exit within 10 s."""
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
                    stop_process(proc)
                return
            stop_process(proc)
    raise RedisUnavailable(f"redis-server did not start; see the logs in {workdir}")


class RedisProcess:
    """A ``redis-server`` that can be stopped and started again on the same port and
    data (append-only file, fsync'd on every write): an outage, not a wipe."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisUnavailable("redis-server is not installed: run `make services` first")
        self.exe, self.workdir, self.port = exe, workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", "always",
                "--dir", str(self.workdir)]  # fmt: skip
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while not answers_ping(self.port):
            assert self.proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL: what a crashed or OOM-killed Redis looks like to its clients."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
