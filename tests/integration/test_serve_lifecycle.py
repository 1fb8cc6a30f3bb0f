"""`switchyard serve` (what `make run` runs) as a terminal and a supervisor run it: a
start after every kind of stop, a stop on one signal (to the whole process group, or to
the command alone) with streams drained and billed and nothing left running, no
listener beyond loopback, and the front it ships (HAProxy before the ingress replicas'
own HTTP servers) answering what it refuses in the API's shape.

Each run starts its own single-machine Ray, apart from the test session's. Every
process of a run carries ``SWITCHYARD_LIFECYCLE_RUN`` in its environment (inherited
from the command through Ray's daemons, workers, engines and HAProxy), which is how the
test finds what a run left behind. ``ray stop --force`` is played as what it does to a
run (SIGKILL to its raylet and GCS) so the test session's own Ray is spared."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from app.cli import processes
from benchmarks.local_redis import free_port
from tests.integration.streams import read_stream, slow_sim, sqlite_records

pytestmark = pytest.mark.integration

MARK = "SWITCHYARD_LIFECYCLE_RUN"
GRACE_S = 10
STOP_BOUND_S = GRACE_S + 20  # the supervisor's deadline (grace + STOP_MARGIN_S)
READY_S = 300
TENANT = "life-t"
FRONT_MAX_BODY = 256 * 1024


def _marked(run: str) -> list[psutil.Process]:
    """Every live process whose environment carries this run's mark."""
    needle = f"{MARK}={run}".encode()
    found = []
    for p in processes.processes():
        if p.zombie or p.pid == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0"):
                found.append(psutil.Process(p.pid))
        except (OSError, psutil.Error):
            continue
    return found


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:80]!r}")
        except psutil.Error:
            continue
    return "; ".join(out)


@dataclass
class Server:
    """One `switchyard serve` run, in a process group of its own like a terminal job."""

    config: Path
    port: int
    env: dict[str, str]
    log_path: Path
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        exe = Path(sys.executable).with_name("switchyard")
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(exe), "serve", str(self.config)],
            env={**self.env, MARK: self.run},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def serves_the_port(self) -> bool:
        """Whether this run (not an earlier one still stopping) holds the HTTP port."""
        pids = {p.pid for p in _marked(self.run)}
        return any(port == self.port for _, port, _ in processes.listeners(pids))

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_S
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                ok = httpx.get(self.root + "/ready", timeout=2).status_code == 200
                if ok and self.serves_the_port():
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "not ready\n" + self.log()
            time.sleep(0.5)

    def signal_group(self, sig: int) -> float:
        """Send ``sig`` to the run's process group; seconds until the command ended."""
        assert self.proc is not None
        sent = time.monotonic()
        os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=STOP_BOUND_S + 30)
        return time.monotonic() - sent

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 5  # processes killed at the end are reaped
        while (left := _marked(self.run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], _describe(left) + "\n" + self.log()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in _marked(self.run):
            p.kill()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []
    port = free_port()
    env = {
        **os.environ,
        "SWITCHYARD_STATE_URL": f"sqlite:///{tmp_path / 'state.db'}",
        "SWITCHYARD_DATA_DIR": str(tmp_path / "data"),
        # the front's limits, small (read once by the command and by the replicas)
        "SWITCHYARD_HEADER_TIMEOUT_S": "2",
        "SWITCHYARD_BODY_TIMEOUT_S": "2",
        "SWITCHYARD_PROXY_MAX_BODY_BYTES": str(FRONT_MAX_BODY),
        # HAProxy's side listeners on ports of their own (the wrapper follows them)
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
    }
    env.pop("RAY_ADDRESS", None)

    def make(models: list[dict[str, Any]]) -> Server:
        config = {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [
                {
                    "name": "life",
                    "route_prefix": "/",
                    "import_path": "app.builders:build_app",
                    "args": {
                        "gateway": {"anonymous_tenant": TENANT},
                        "graceful_shutdown_timeout_s": GRACE_S,
                        "models": models,
                    },
                }
            ],
        }
        path = tmp_path / "serve.yaml"
        path.write_text(yaml.safe_dump(config))
        server = Server(path, port, env, tmp_path / f"serve-{len(started)}.log")
        started.append(server)
        return server

    yield make
    for server in started:
        server.kill()


def _streams(server: Server, n: int, tokens: int) -> tuple[list[threading.Thread], list[Any]]:
    results: list[dict[str, Any]] = []
    body = {
        "model": "life-slow",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }
    url = server.root + "/v1/chat/completions"
    threads = [threading.Thread(target=read_stream, args=(url, body, results)) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # every stream has produced tokens
    return threads, results


def test_one_signal_to_the_group_drains_and_stops_everything_then_it_starts_again(
    make_server: Any, tiny_model_dir: Path
) -> None:
    tiny = {
        "id": "life-tiny",
        "source": str(tiny_model_dir),
        "max_model_len": 256,
        "kv_cache_memory_bytes": 32 * 1024**2,
        "max_num_seqs": 4,
    }
    first = make_server([tiny, slow_sim("life-slow")]).start()  # /ready: the first
    first.wait_ready()

    # nothing listens beyond loopback: Ray, its agents, replicas and HAProxy included
    pids = {p.pid for p in _marked(first.run)}
    listening = processes.listeners(pids)
    assert {port for _, port, _ in listening} >= {first.port}
    exposed = [(a, port, pid) for a, port, pid in listening if not processes.is_loopback(a)]
    assert exposed == [], exposed
    assert any(p.name() == "haproxy" for p in _marked(first.run))  # the shipped front
    got = httpx.post(
        first.root + "/v1/completions",
        json={"model": "life-tiny", "prompt": "hello", "max_tokens": 4},
        timeout=60,
    )
    assert got.status_code == 200, got.text
    _front_answers_in_the_api_shape(first)

    # Ctrl-C in a terminal: SIGINT to the whole group, streams in flight
    threads, results = _streams(first, 2, 60)
    took = first.signal_group(signal.SIGINT)
    for t in threads:
        t.join(timeout=60)
    assert first.proc is not None and first.proc.returncode == 0, first.log()
    assert took < STOP_BOUND_S, first.log()
    assert results == [{"chunks": 60, "done": True, "error": None, "status": 200}] * 2
    first.assert_nothing_left()

    # the same command again, on the same ports; then a supervisor's SIGTERM to the group
    # (the command runs Ray in a session of its own, so its group holds only the command:
    # this is also `kill PID`)
    second = make_server([slow_sim("life-slow")]).start()
    second.wait_ready()
    threads, results = _streams(second, 1, 60)
    during: list[tuple[int, str, str | None]] = []
    poller = threading.Thread(target=_poll_while_stopping, args=(second, during))
    poller.start()
    took = second.signal_group(signal.SIGTERM)
    poller.join(timeout=60)
    for t in threads:
        t.join(timeout=60)
    # requests arriving while it drains: served, or a retryable 503 in the API's shape
    # (never Ray's plain-text 404 for a path no application serves any more)
    assert during, "no request reached the front while it stopped"
    odd = [
        (status, code, retry_after)
        for status, code, retry_after in during
        if not (status == 200 or (status == 503 and retry_after is not None))
        or code not in ("ok", "shutting_down", "not_ready", "upstream_error")
    ]
    assert odd == [], during
    assert second.proc is not None and second.proc.returncode == 0, second.log()
    assert took < STOP_BOUND_S, second.log()
    assert results == [{"chunks": 60, "done": True, "error": None, "status": 200}]
    second.assert_nothing_left()
    records = sqlite_records(second.env["SWITCHYARD_STATE_URL"], TENANT)
    slow = [r.completion_tokens for r in records if r.model_requested == "life-slow"]
    served_while_stopping = sum(1 for status, _, _ in during if status == 200)
    served_by_the_front_checks = sum(1 for _, _, status, _ in FRONT_CASES if status == 200)
    twos = served_while_stopping + served_by_the_front_checks
    assert sorted(slow) == [2] * twos + [60] * 3


def _poll_while_stopping(server: Server, out: list[tuple[int, str, str | None]]) -> None:
    """New requests every 0.2 s until the front stops answering: (status, error code or
    "ok", Retry-After)."""
    body = {"model": "life-slow", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2}  # fmt: skip
    while server.proc is not None and server.proc.poll() is None:
        try:
            got = httpx.post(server.root + "/v1/chat/completions", json=body, timeout=10)
        except httpx.HTTPError:
            if out:
                return  # the front is gone
            time.sleep(0.2)
            continue
        try:
            code = "ok" if got.status_code == 200 else got.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = f"not the error shape: {got.headers.get('content-type')} {got.text[:80]!r}"
        out.append((got.status_code, code, got.headers.get("retry-after")))
        time.sleep(0.2)


def _serving_process(server: Server) -> psutil.Process:
    assert server.proc is not None
    children = psutil.Process(server.proc.pid).children()
    return next(c for c in children if processes.SERVER_MARK in c.cmdline())


def test_a_start_after_any_unclean_stop(make_server: Any) -> None:
    models = [slow_sim("life-slow")]

    # SIGKILL of the command: its serving process drains by itself (a stream longer than
    # the grace keeps it draining for the whole grace), the next start waits for it
    first = make_server(models).start()
    first.wait_ready()
    assert first.proc is not None
    threads, _ = _streams(first, 1, int(GRACE_S / 0.05) * 2)
    first.proc.kill()
    first.proc.wait()
    second = make_server(models).start()
    second.wait_ready()  # on the port once the first run is gone
    assert "to finish stopping" in second.log()
    first.assert_nothing_left()
    for t in threads:
        t.join(timeout=60)

    # SIGKILL of the serving process (Ray's driver): the command ends what it started
    _serving_process(second).kill()
    assert second.proc is not None and second.proc.wait(timeout=STOP_BOUND_S) == 1
    assert "the serving process died (SIGKILL)" in second.log()
    second.assert_nothing_left()

    # `ray stop --force`: the run's raylet and GCS killed under it
    third = make_server(models).start()
    third.wait_ready()
    daemons = [p for p in _marked(third.run) if p.name() in ("raylet", "gcs_server")]
    assert len(daemons) == 2
    for p in daemons:
        p.kill()
    assert third.proc is not None and third.proc.wait(timeout=STOP_BOUND_S) == 1
    assert "Ray's GCS or raylet is gone" in third.log()
    third.assert_nothing_left()



def _http(server: Server, request: bytes, wait_s: float = 20) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 exchange: (status, headers, body); the front closes or answers
    within ``wait_s`` (a hang fails the test)."""
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.settimeout(wait_s)
        conn.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(
            answer
        ):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split(" ")[1]), headers, body


def _length(answer: bytes) -> int:
    found = re.search(rb"\r\ncontent-length: *(\d+)", answer.partition(b"\r\n\r\n")[0], re.I)
    return int(found.group(1)) if found else 1 << 30


def _post(extra_headers: bytes = b"", body: bytes | None = None, length: int | None = None
          ) -> bytes:  # fmt: skip
    body = body if body is not None else json.dumps(
        {"model": "life-slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    n = len(body) if length is None else length
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: front\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(n).encode() + b"\r\n"
        + extra_headers + b"\r\n" + body
    )


# (case, raw request, status, the error's code and param; None: served)
FRONT_CASES: list[tuple[str, bytes, int, tuple[str, str | None] | None]] = [
    ("served", _post(), 200, None),
    ("client request id kept", _post(b"X-Request-ID: trace-1.a\r\n"), 200, None),
    ("client request id not a token", _post(b"X-Request-ID: a/b\r\n"), 200, None),
    ("ray's timeout header ignored", _post(b"X-Request-Timeout-Seconds: 0.001\r\n"), 200, None),
    ("session id not utf-8", _post(b"X-Session-ID: \xff\xfe\r\n"), 400,
     ("invalid_header", "x-session-id")),
    ("credential not utf-8", _post(b"Authorization: Bearer \xff\xfe\r\n"), 401,
     ("invalid_api_key", None)),
    ("credential not bearer", _post(b"Authorization: Basic YTpi\r\n"), 401,
     ("invalid_api_key", None)),
    ("body not json", _post(body=b"{not json"), 400, ("invalid_json", None)),
    ("body too large", _post(body=b"x" * (FRONT_MAX_BODY + 1)), 413, ("request_too_large", None)),
    ("body too slow", _post(body=b'{"model":', length=100), 408, ("request_timeout", None)),
]  # fmt: skip


def _front_answers_in_the_api_shape(server: Server) -> None:
    """What the shipped front refuses, through it: every answer of the proxy guard and
    the app is the API's error shape with the request's id; what HAProxy's HTTP/1 layer
    answers before a request exists is its own page (see app/cli/haproxy_bind.py)."""
    got = []
    for case, request, _, _ in FRONT_CASES:
        status, headers, body = _http(server, request)
        error = json.loads(body)["error"] if status != 200 else None
        assert error is None or set(error) == {"message", "type", "param", "code"}, body
        assert re.fullmatch(r"[0-9a-f]{32}", headers.get("x-request-id", "")), (case, headers)
        got.append((case, status, None if error is None else (error["code"], error["param"])))
        if case == "client request id kept":
            assert headers.get("x-client-request-id") == "trace-1.a", headers
        if case == "client request id not a token":
            assert "x-client-request-id" not in headers, headers
    assert got == [(case, status, error) for case, _, status, error in FRONT_CASES]
    # headers that never complete: closed at the front's header deadline (2 s here)
    status, _, _ = _http(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: front\r\n")
    assert status == 408
    # a request HAProxy cannot read at all: its own 400
    assert _http(server, b"GARBAGE\r\n\r\n")[0] == 400
