"""`switchyard serve`: a SIGTERM drains every application before Serve shuts down; the
serving process gets Switchyard's Ray environment, a single-machine Ray and HAProxy's
side listeners on loopback; a port someone else holds is one line and exit code 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ray import serve

from app.cli import serve as serve_cli


class _Status:
    def __init__(self, apps: list[str]) -> None:
        self.applications = {name: object() for name in apps}


@pytest.mark.parametrize("apps", [["a", "b"], []])
def test_sigterm_deletes_every_app_then_interrupts(
    monkeypatch: pytest.MonkeyPatch, apps: list[str]
) -> None:
    deleted: list[str] = []
    monkeypatch.setattr(serve, "status", lambda: _Status(apps))
    monkeypatch.setattr(serve, "delete", lambda name, **kw: deleted.append(name))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            serve_cli._interrupt(signal.SIGTERM, None)
        assert deleted == apps
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # no second interrupt
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_failed_drain_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> Any:
        raise RuntimeError("controller gone")

    monkeypatch.setattr(serve, "status", boom)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            serve_cli._interrupt(signal.SIGTERM, None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_ray_processes_get_switchyards_environment() -> None:
    assert serve_cli.RAY_ENV == {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "app.api.proxy_guard:middlewares",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_NBTHREAD": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    }


@pytest.mark.parametrize(
    ("base", "local_ray", "expected"),
    [
        # a new local Ray: single-machine, HAProxy through the loopback wrapper
        ({}, True, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "wrapper": True}),
        # a cluster given by address: its nodes must be reachable, no single-machine mode
        ({}, False, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None, "wrapper": True}),
        # the caller's own settings win
        ({"RAY_SERVE_ENABLE_HA_PROXY": "0"}, True, {"wrapper": False}),
        ({"RAY_SERVE_HAPROXY_BINARY_PATH": "/opt/haproxy"}, True, {"wrapper": False}),
        ({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}, True,
         {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "wrapper": True}),
    ],
)  # fmt: skip
def test_serving_env(
    tmp_path: Path, base: dict[str, str], local_ray: bool, expected: dict[str, Any]
) -> None:
    env = serve_cli.serving_env(base, local_ray, tmp_path, header_timeout_s=2.5)
    for key, value in base.items():
        assert env[key] == value
    if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in expected:
        assert env.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == expected[
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
        ]
    wrapper = tmp_path / "haproxy"
    assert (env.get("RAY_SERVE_HAPROXY_BINARY_PATH") == str(wrapper)) is expected["wrapper"]
    assert wrapper.exists() is expected["wrapper"]
    if expected["wrapper"]:  # the front's header deadline is the settings' one
        assert "timeout http-request 2500ms" in (tmp_path / "switchyard-haproxy.sed").read_text()


def test_a_port_held_by_another_program_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    config = tmp_path / "serve.yaml"
    config.write_text(f"http_options: {{host: 127.0.0.1, port: {port}}}\napplications: []\n")
    try:
        got = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "serve", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "RAY_SERVE_ENABLE_HA_PROXY": "0"},
        )
    finally:
        holder.close()
    assert got.returncode == 2, got.stderr
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, got.stderr
    assert f"port {port} (127.0.0.1) is in use by pid {os.getpid()}" in lines[0]
    assert "Traceback" not in got.stderr
