"""The HAProxy wrapper: exactly Serve's stats and metrics bind lines move to loopback
(on the bind lines of Ray's own template), HAProxy's own errors come in the API's error
shape, and the real binary runs with the same arguments — checked on the real binary."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

from app.cli import processes
from app.cli.haproxy_bind import ERRORS, RAY_NO_APP, error_response, real_haproxy, write_wrapper
from benchmarks.local_redis import free_port

STATS, METRICS, API = 8404, 9101, 8000
HEADER_TIMEOUT_S = 0.5


def _ray_bind_lines(frontend_host: str) -> list[str]:
    """Ray's template's bind lines with the values Ray fills in."""
    values = {
        "config.stats_port": str(STATS),
        "config.metrics_port": str(METRICS),
        "config.frontend_host": frontend_host,
        "config.frontend_port": str(API),
    }
    template = HAPROXY_CONFIG_TEMPLATE.splitlines()
    lines = [line for line in template if line.strip().startswith("bind ")]
    return [re.sub(r"{{ (\S+) }}", lambda m: values.get(m.group(1), m.group(0)), x) for x in lines]


def test_ray_still_writes_what_the_wrapper_rewrites() -> None:
    lines = [line.strip() for line in _ray_bind_lines("*")]
    assert f"bind *:{STATS}" in lines
    assert f"bind :{METRICS}" in lines
    assert "\ndefaults\n" in HAPROXY_CONFIG_TEMPLATE
    assert "\n    " + RAY_NO_APP in HAPROXY_CONFIG_TEMPLATE
    for status in (502, 503, 504):
        assert f"errorfile {status} {{{{ config.error_file_path }}}}" in HAPROXY_CONFIG_TEMPLATE


def test_wrapper_rewrites_only_the_side_listeners(tmp_path: Path) -> None:
    fake = tmp_path / "real-haproxy"
    fake.write_text('#!/bin/sh\necho "$@"\ncat "$3"\n')
    fake.chmod(0o700)
    wrapper = write_wrapper(tmp_path, str(fake), (STATS, METRICS), 10.0)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("\n".join(_ray_bind_lines("*")) + "\n")
    out = subprocess.run(
        [str(wrapper), "-db", "-f", str(cfg), "-sf", "42"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == f"-db -f {cfg} -sf 42"  # the real binary got the same arguments
    binds = sorted(line.strip() for line in out[1:] if line.strip().startswith("bind"))
    assert f"bind 127.0.0.1:{STATS}" in binds
    assert f"bind 127.0.0.1:{METRICS}" in binds
    assert f"bind *:{API}" in binds  # the API frontend follows http_options.host
    assert not any(b.endswith(f"*:{STATS}") or b.endswith(f" :{METRICS}") for b in binds)


@pytest.mark.parametrize("status", sorted(ERRORS))
def test_error_files_are_the_api_error_shape(status: int) -> None:
    head, _, body = error_response(status).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} ")
    assert f"Content-Length: {len(body)}" in lines
    assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert ("Retry-After: 5" in lines) is (status in (502, 503, 504))


CONFIG = """global
    maxconn 100
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 5s
frontend api
    bind 127.0.0.1:{api}
    use_backend app if {{ path_beg /v1 }}
    default_backend default_backend
backend default_backend
{ray_no_app}
backend app
    errorfile 503 {ray_error}
    server s1 127.0.0.1:{closed}
frontend prometheus
    bind :{metrics}
    http-request use-service prometheus-exporter if {{ path /metrics }}
listen stats
  bind *:{stats}
  stats enable
  stats uri /stats
"""


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, int]]:
    api, stats, metrics, closed = free_port(), free_port(), free_port(), free_port()
    ray_error = tmp_path / "500.http"
    ray_error.write_bytes(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
    private = tmp_path / "private"
    private.mkdir()
    wrapper = write_wrapper(private, real_haproxy(), (stats, metrics), HEADER_TIMEOUT_S)
    cfg = tmp_path / "haproxy.cfg"
    no_app = next(x for x in HAPROXY_CONFIG_TEMPLATE.splitlines() if RAY_NO_APP in x)
    cfg.write_text(CONFIG.format(api=api, stats=stats, metrics=metrics, closed=closed,
                                 ray_error=ray_error, ray_no_app=no_app))  # fmt: skip
    proc = subprocess.Popen([str(wrapper), "-db", "-f", str(cfg)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while processes.port_free("127.0.0.1", api):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        yield proc, api, stats, metrics
    finally:
        proc.kill()
        proc.wait()


def test_the_real_binary_serves_loopback_side_listeners_and_json_errors(
    haproxy: tuple[subprocess.Popen[bytes], int, int, int],
) -> None:
    proc, api, stats, metrics = haproxy
    listening = {(a, p) for a, p, _ in processes.listeners({proc.pid})}
    assert listening == {("127.0.0.1", api), ("127.0.0.1", stats), ("127.0.0.1", metrics)}

    # no replica behind the front: 503 in the API's shape, retryable (was Ray's text 500)
    got = httpx.get(f"http://127.0.0.1:{api}/v1/models", timeout=10)
    assert got.status_code == 503 and got.headers["retry-after"] == "5"
    assert got.json()["error"]["code"] == "not_ready"

    # a path no application serves (the app starting, or draining): 503, not a text 404
    got = httpx.post(f"http://127.0.0.1:{api}/other", json={}, timeout=10)
    assert got.status_code == 503 and got.headers["retry-after"] == "5"
    assert got.headers["content-type"] == "application/json"
    assert got.json()["error"]["code"] == "not_ready"

    # a connection whose headers never complete is closed at the header deadline, not
    # held for the client timeout (30 s here, 3,600 s in Ray's config)
    with socket.create_connection(("127.0.0.1", api)) as conn:
        conn.settimeout(20)
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 "), answer  # HAProxy's own page (mux level)
