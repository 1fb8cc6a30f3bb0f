"""What an earlier run left behind, read from a /proc laid out in a directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from app.cli import processes

CFG_DIR = "/tmp/haproxy-serve"


def _fake(root: Path, pid: int, argv: list[str], ppid: int, sid: int = 1) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} (x y) S {ppid} {sid} {sid} 0")


@pytest.mark.parametrize(
    ("argv", "parent", "stale"),
    [
        # any node id: its manager is gone (parent is init, or anything else)
        (["/x/bin/haproxy", "-db", "-f", f"{CFG_DIR}/NODE-A/haproxy.cfg"], "/sbin/init", True),
        (["/x/bin/haproxy", "-db", "-f", f"{CFG_DIR}/NODE-B/haproxy.cfg"], "bash", True),
        # a running Serve's HAProxy is never touched
        (["/x/bin/haproxy", "-f", f"{CFG_DIR}/NODE-A/haproxy.cfg"], "ray::HAProxyManager", False),
        # not Serve's HAProxy, or not HAProxy at all
        (["/usr/sbin/haproxy", "-f", "/etc/haproxy/haproxy.cfg"], "/sbin/init", False),
        (["/usr/bin/python", f"{CFG_DIR}/NODE-A/x"], "/sbin/init", False),
    ],
)
def test_stale_haproxy(tmp_path: Path, argv: list[str], parent: str, stale: bool) -> None:
    _fake(tmp_path, 500, [parent], 0)
    _fake(tmp_path, 501, argv, 500)
    got = [p.pid for p in processes.stale_haproxy(CFG_DIR, proc_dir=tmp_path)]
    assert got == ([501] if stale else [])


@pytest.mark.parametrize(
    ("argv", "ppid", "orphan"),
    [
        (["python", "-m", "app.cli.main", "serve", "c.yaml", "--supervised", "700"], 700, False),
        (["python", "-m", "app.cli.main", "serve", "c.yaml", "--supervised", "700"], 1, True),
        (["python", "-m", "app.cli.main", "serve", "c.yaml", "--supervised", "x"], 700, True),
        (["python", "-m", "app.cli.main", "serve", "c.yaml"], 1, False),  # a supervisor
    ],
)
def test_orphaned_servers(tmp_path: Path, argv: list[str], ppid: int, orphan: bool) -> None:
    _fake(tmp_path, 700, ["switchyard", "serve"], 1)
    _fake(tmp_path, 701, argv, ppid)
    got = [p.pid for p in processes.orphaned_servers(proc_dir=tmp_path)]
    assert got == ([701] if orphan else [])


def test_end_session_stops_every_process_of_the_session_and_nothing_else() -> None:
    # a session leader with a child that ignores SIGTERM, and an outsider
    leader = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"], start_new_session=True
    )
    outsider = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while len(processes.session_members(leader.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = {p.pid for p in processes.session_members(leader.pid)}
        assert leader.pid in members and len(members) == 3
        left = processes.end_session(leader.pid, term_wait_s=0.5)
        assert {p.pid for p in left} == members
        assert leader.wait(timeout=10) == -signal.SIGKILL  # it ignored the SIGTERM
        assert processes.session_members(leader.pid) == []
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()
        leader.kill()


def test_port_free_and_its_holder() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.listen()
    try:
        assert not processes.port_free("127.0.0.1", port)
        assert not processes.port_free("0.0.0.0", port)  # every interface includes it
        assert processes.port_holder(port).startswith(f"pid {os.getpid()} (")
        assert ("127.0.0.1", port, os.getpid()) in processes.listeners({os.getpid()})
        assert processes.listeners({-1}) == []
    finally:
        s.close()
    assert processes.port_free("127.0.0.1", port)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("0.0.0.0", False), ("::", False), ("192.0.2.2", False), ("::ffff:10.0.0.1", False)],
)  # fmt: skip
def test_is_loopback(address: str, loopback: bool) -> None:
    assert processes.is_loopback(address) is loopback
