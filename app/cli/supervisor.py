"""The supervisor of ``switchyard serve``: the process a terminal, ``make`` or a service
manager sees. It cleans up before a start, runs the serving process in a session of its
own, and stops that whole session on one signal.

Rule:
- **Before a start**: wait for an orphaned serving process of an earlier run (its
  supervisor gone; it is draining) for at most ``stop_deadline_s``, then end its
  session; stop every stale Serve HAProxy (its manager gone), one line each; then
  every port the config needs must be bindable, else one line naming the port and its
  holder, and exit code 2 — never a stack trace.
- **Serving**: the serving process (Ray's driver, so Ray's GCS, raylet, workers,
  engines and HAProxy) runs in a new session, so the SIGINT a terminal sends to its
  foreground group, or a SIGTERM a supervisor sends to ours, reaches this process
  only; its parent-death signal is SIGTERM, so it drains if this process is killed.
- **Stopping**: the first SIGINT or SIGTERM is passed on as one SIGTERM (the serving
  process drains each application for up to its grace, then shuts Serve and Ray
  down); a second SIGINT (Ctrl-C pressed again) stops at once; repeated SIGTERMs
  (``make`` forwards one of its own) change nothing. ``stop_deadline_s`` after the
  first signal — the config's grace plus ``STOP_MARGIN_S`` — the session is killed.
  Whenever the serving process ends, every process left in its session is ended
  (SIGTERM, SIGKILL after 2 s) and stale HAProxy processes are stopped.
- **Ray gone**: when the serving process started its own Ray and, while no stop was
  asked for, that Ray's GCS or raylet has died under it (``ray stop --force``, the OOM
  killer), nothing can be served or drained any more: unless the serving process
  exits within ``RAY_GONE_WAIT_S``, the session is ended (Ray's driver would wait 60 s
  for its GCS before giving up).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from app.cli import processes

DEFAULT_GRACE_S = 30.0  # app.config.AppArgs.graceful_shutdown_timeout_s's default
# After the grace: the ingress's settlement margin (app.builders.SETTLE_MARGIN_S is
# Ray's bound, rarely used), Serve's and Ray's own shutdown (a few seconds here).
STOP_MARGIN_S = 20.0
PR_SET_PDEATHSIG = 1
EXIT_PORT_TAKEN = 2
RAY_DAEMONS = (b"gcs_server", b"raylet")
WATCH_EVERY_S = 1.0
RAY_GONE_WAIT_S = 5.0  # a serving process that shuts Ray down itself exits within this

Say = Callable[[str], None]


@dataclass(frozen=True)
class ServePlan:
    """What a serve config needs of this machine, read once from the file."""

    host: str = "127.0.0.1"
    port: int = 8000
    grace_s: float = DEFAULT_GRACE_S
    extra_ports: tuple[int, ...] = field(default_factory=tuple)

    @property
    def stop_deadline_s(self) -> float:
        return self.grace_s + STOP_MARGIN_S

    def ports(self) -> list[tuple[str, int]]:
        return [(self.host, self.port), *(("127.0.0.1", p) for p in self.extra_ports)]


def read_plan(config: Path, extra_ports: Sequence[int] = ()) -> ServePlan:
    """The HTTP address and the longest application grace of a Serve config file."""
    doc: dict[str, Any] = yaml.safe_load(config.read_text()) or {}
    http = doc.get("http_options") or {}
    graces = [
        float((a.get("args") or {}).get("graceful_shutdown_timeout_s", DEFAULT_GRACE_S))
        for a in doc.get("applications") or []
    ]
    host = str(http.get("host") or "127.0.0.1")
    return ServePlan(
        host="0.0.0.0" if host in ("", "*") else host,
        port=int(http.get("port") or 8000),
        grace_s=max(graces, default=DEFAULT_GRACE_S),
        extra_ports=tuple(extra_ports),
    )


def clear_the_way(plan: ServePlan, haproxy_dir: str, say: Say) -> int | None:
    """Clean up after earlier runs; None when every port is free, else the exit code."""
    for p in processes.orphaned_servers():
        say(f"waiting up to {plan.stop_deadline_s:.0f} s for an earlier serving process "
            f"(pid {p.pid}) to finish stopping")
        deadline = time.monotonic() + plan.stop_deadline_s
        while time.monotonic() < deadline and Path(f"/proc/{p.pid}").exists():
            time.sleep(0.5)
        for left in processes.end_session(p.sid):
            say(f"stopped pid {left.pid} ({left.command}) left by an earlier run")
    for p in processes.stale_haproxy(haproxy_dir):
        processes.kill([p.pid])
        say(f"stopped HAProxy pid {p.pid} left by an earlier Serve (its manager is gone)")
    deadline = time.monotonic() + 5  # a killed HAProxy releases its ports when reaped
    while processes.stale_haproxy(haproxy_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for host, port in plan.ports():
        if not processes.port_free(host, port):
            say(f"port {port} ({host}) is in use by {processes.port_holder(port)}: stop it, "
                "or serve on another port (http_options.port in the config)")
            return EXIT_PORT_TAKEN
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    def __init__(
        self, plan: ServePlan, haproxy_dir: str, say: Say, own_ray: bool = False
    ) -> None:
        self._plan = plan
        self._own_ray = own_ray  # the serving process starts Ray in its session
        self._haproxy_dir = haproxy_dir
        self._say = say
        self._child: subprocess.Popen[bytes] | None = None
        self._stop_at: float | None = None  # monotonic deadline once stopping
        self._forced = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        child = self._child
        if child is None:
            return
        if self._stop_at is None:
            self._stop_at = time.monotonic() + self._plan.stop_deadline_s
            self._say(f"stopping (signal {signal.Signals(signum).name}): draining for up to "
                      f"{self._plan.grace_s:.0f} s, stopped within "
                      f"{self._plan.stop_deadline_s:.0f} s")
            child.send_signal(signal.SIGTERM)
        elif signum == signal.SIGINT:
            self._say("second Ctrl-C: stopping now")
            self._stop_at = time.monotonic()

    def run(self, argv: Sequence[str], env: dict[str, str]) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._child = subprocess.Popen(
                list(argv), env=env, start_new_session=True, preexec_fn=_die_with_parent
            )
            code = self._wait(self._child)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self._child is not None:
                self._cleanup(self._child.pid)
        return code

    def _ray_gone(self, sid: int, seen: set[bytes]) -> bool:
        """Whether a Ray daemon of the session that was running is gone."""
        names = {
            d for p in processes.session_members(sid) for d in RAY_DAEMONS
            if p.argv and p.argv[0].endswith(d)
        }  # fmt: skip
        gone = bool(seen - names)
        seen |= names
        return gone

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        seen: set[bytes] = set()
        watched_at = time.monotonic()
        while True:
            try:
                code = child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if self._stop_at is not None and now >= self._stop_at:
                    self._forced = True
                    self._say(f"not stopped within {self._plan.stop_deadline_s:.0f} s: "
                              "killing its processes")
                    processes.end_session(child.pid, term_wait_s=0)
                elif self._own_ray and self._stop_at is None and now - watched_at >= WATCH_EVERY_S:
                    watched_at = now
                    if self._ray_gone(child.pid, seen) and not _exits(child, RAY_GONE_WAIT_S):
                        self._forced = True
                        self._say("Ray's GCS or raylet is gone (ray stop?): "
                                  "stopping what is left")
                        processes.end_session(child.pid, term_wait_s=0)
                continue
            if self._forced:
                return 1
            if code < 0 and self._stop_at is None:
                self._say(f"the serving process died ({signal.Signals(-code).name}): "
                          "stopping what it started")
                return 1
            return code

    def _cleanup(self, sid: int) -> None:
        left = processes.end_session(sid)
        if left:
            self._say(f"stopped {len(left)} processes left in the serving session")
        for p in processes.stale_haproxy(self._haproxy_dir):
            processes.kill([p.pid])
            self._say(f"stopped HAProxy pid {p.pid} left by Serve")


def _exits(child: subprocess.Popen[bytes], within_s: float) -> bool:
    try:
        child.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def child_argv(config: Path, address: str | None) -> list[str]:
    """The serving process: this command again, marked with the supervisor's pid."""
    argv = [sys.executable, "-m", "app.cli.main", "serve", str(config)]
    if address:
        argv += ["--address", address]
    return [*argv, processes.SERVER_MARK, str(os.getpid())]
