"""`switchyard serve`: a SIGTERM drains every application before Serve shuts down."""

from __future__ import annotations

import signal
import subprocess
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
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    }


HAPROXY_DIR = "/tmp/haproxy-serve"


def _fake_proc(root: Path, pid: int, argv: list[str], ppid: int) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} (x) S {ppid} 1 1 0")


@pytest.mark.parametrize(
    ("argv", "parent", "killed"),
    [
        (["/x/bin/haproxy", "-f", f"{HAPROXY_DIR}/NODE/haproxy.cfg"], "init", True),
        (["/x/bin/haproxy", "-f", f"{HAPROXY_DIR}/NODE/haproxy.cfg"], "ray::HAProxyManager", False),
        (["/x/bin/haproxy", "-f", f"{HAPROXY_DIR}/OTHER/haproxy.cfg"], "init", False),
        (["/usr/bin/python", "/tmp/haproxy-serve/NODE/x"], "init", False),
    ],
)
def test_only_this_nodes_orphaned_haproxy_is_stopped(
    tmp_path: Path, argv: list[str], parent: str, killed: bool
) -> None:
    target = subprocess.Popen(["sleep", "60"])
    try:
        _fake_proc(tmp_path, 4_000_000, [parent], 0)
        _fake_proc(tmp_path, target.pid, argv, 4_000_000)
        got = serve_cli.stop_orphaned_haproxy("NODE", proc_dir=tmp_path)
        assert got == ([target.pid] if killed else [])
        if killed:
            assert target.wait(timeout=10) == -signal.SIGKILL
        else:
            assert target.poll() is None
    finally:
        target.kill()
        target.wait()
