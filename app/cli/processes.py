"""What an earlier ``switchyard serve`` may have left on this machine, and who holds a
port: read from ``/proc`` and the kernel's socket tables, so a new start can clean up
after any stop — a Ctrl-C, a SIGKILL, ``ray stop --force`` — before it binds anything.

- **Stale HAProxy**: Serve's HAProxy (``haproxy -f <config dir>/<node id>/haproxy.cfg``)
  whose parent is no longer a live ``ray::HAProxyManager``, whatever its node id. A
  HAProxy that its manager still owns belongs to a running Serve and is never touched.
- **Orphaned server**: the serving process of an earlier ``switchyard serve``
  (``SERVER_MARK`` and its supervisor's pid on its command line) whose parent is no
  longer that supervisor. It stops by itself
  (its parent-death signal is SIGTERM); a new start waits for it, then ends its session.
- **Session**: every process the serving process started, Ray's daemons, workers,
  engines and HAProxy included, shares its session id; ending the session ends them all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

PROC = Path("/proc")
HAPROXY_MANAGER = b"HAProxyManager"
SERVER_MARK = "--supervised"  # then the supervisor's pid, on a serving process's command line


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    argv: tuple[bytes, ...]
    zombie: bool = False

    @property
    def command(self) -> str:
        return " ".join(a.decode(errors="replace") for a in self.argv)[:120]


def _read(entry: Path) -> Proc | None:
    try:
        argv = tuple(a for a in (entry / "cmdline").read_bytes().split(b"\0") if a)
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        return Proc(int(entry.name), int(fields[1]), int(fields[3]), argv, fields[0] == "Z")
    except (OSError, IndexError, ValueError):
        return None


def processes(proc_dir: Path = PROC) -> Iterator[Proc]:
    for entry in proc_dir.iterdir():
        if entry.name.isdigit() and (p := _read(entry)) is not None:
            yield p


def _argv(pid: int, proc_dir: Path) -> tuple[bytes, ...]:
    p = _read(proc_dir / str(pid)) if pid > 0 else None
    return p.argv if p is not None else ()


def stale_haproxy(config_dir: str, proc_dir: Path = PROC) -> list[Proc]:
    """Serve HAProxy processes (their config under ``config_dir``) whose manager is gone."""
    marker = config_dir.rstrip("/").encode() + b"/"
    found = []
    for p in processes(proc_dir):
        if not p.argv or not p.argv[0].endswith(b"haproxy"):
            continue
        if not any(a.startswith(marker) for a in p.argv[1:]):
            continue
        if not any(HAPROXY_MANAGER in a for a in _argv(p.ppid, proc_dir)):
            found.append(p)
    return found


def orphaned_servers(proc_dir: Path = PROC) -> list[Proc]:
    """Serving processes of earlier ``switchyard serve`` runs whose supervisor is gone."""
    mark, found = SERVER_MARK.encode(), []
    for p in processes(proc_dir):
        if p.pid == os.getpid() or mark not in p.argv[:-1]:
            continue
        supervisor = p.argv[p.argv.index(mark) + 1]
        if not supervisor.isdigit() or int(supervisor) != p.ppid:
            found.append(p)
    return found


def session_members(sid: int, proc_dir: Path = PROC) -> list[Proc]:
    """The live processes of session ``sid`` (a zombie holds nothing but its pid)."""
    return [
        p for p in processes(proc_dir) if p.sid == sid and p.pid != os.getpid() and not p.zombie
    ]


def kill(pids: list[int], sig: int = signal.SIGKILL) -> list[int]:
    done = []
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
            done.append(pid)
    return done


def end_session(sid: int, term_wait_s: float = 2.0, proc_dir: Path = PROC) -> list[Proc]:
    """SIGTERM every process of session ``sid``, SIGKILL what is left after
    ``term_wait_s``; returns the processes that were still there."""
    left = session_members(sid, proc_dir)
    if not left:
        return []
    kill([p.pid for p in left], signal.SIGTERM)
    deadline = time.monotonic() + term_wait_s
    while time.monotonic() < deadline and session_members(sid, proc_dir):
        time.sleep(0.1)
    kill([p.pid for p in session_members(sid, proc_dir)], signal.SIGKILL)
    return left


# ---- ports ---------------------------------------------------------------------------


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (as the server will bind it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_holder(port: int) -> str:
    """Who listens on ``port`` (any address): ``pid N (command)``, or why it is unknown."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return "another process (run as its owner or root to see which)"
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                return "a process of another user"
            p = _read(PROC / str(c.pid))
            return f"pid {c.pid} ({p.command if p else '?'})"
    return "a socket that is not listening (maybe still closing)"


def listeners(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket of ``pids``."""
    out = []
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids and c.laddr:
            out.append((str(c.laddr.ip), int(c.laddr.port), int(c.pid)))
    return sorted(out)


def is_loopback(address: str) -> bool:
    address = address.removeprefix("::ffff:")
    return address == "::1" or address.startswith("127.")
