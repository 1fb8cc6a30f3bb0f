"""The supervisor: the plan read from a serve config, the clean-up before a start, and a
stop on one signal, on a stand-in serving process (a shell script in its own session)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.cli import processes, supervisor
from app.cli.supervisor import ServePlan, Supervisor, clear_the_way, read_plan


@pytest.mark.parametrize(
    ("text", "plan"),
    [
        ("applications: []\n", ServePlan()),
        ("http_options: {host: 0.0.0.0, port: 9000}\napplications:\n"
         "  - args: {graceful_shutdown_timeout_s: 5}\n  - args: {}\n",
         ServePlan(host="0.0.0.0", port=9000, grace_s=30.0)),
        ("http_options: {port: 8100}\napplications:\n  - args: {graceful_shutdown_timeout_s: 45}\n",
         ServePlan(port=8100, grace_s=45.0)),
    ],
)  # fmt: skip
def test_read_plan(tmp_path: Path, text: str, plan: ServePlan) -> None:
    (tmp_path / "c.yaml").write_text(text)
    assert read_plan(tmp_path / "c.yaml") == plan
    assert plan.stop_deadline_s == plan.grace_s + supervisor.STOP_MARGIN_S


def test_clear_the_way_names_the_holder_of_every_needed_port() -> None:
    said: list[str] = []
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        port = s.getsockname()[1]
        plan = ServePlan(port=port)
        assert clear_the_way(plan, "/nonexistent-haproxy-dir", said.append) == 2
        assert len(said) == 1 and f"port {port} (127.0.0.1) is in use by pid" in said[0]
        said.clear()
        other = ServePlan(port=0, extra_ports=(port,))  # HAProxy's side ports too
        assert clear_the_way(other, "/nonexistent-haproxy-dir", said.append) == 2
        assert f"port {port}" in said[0]
    finally:
        s.close()
    said.clear()
    assert clear_the_way(ServePlan(port=port), "/nonexistent-haproxy-dir", said.append) is None
    assert said == []


# A serving process stand-in: it starts a helper in its session (as Ray's daemons are)
# and stops DRAIN seconds after a SIGTERM (or never, with DRAIN = never).
CHILD = """
import signal, subprocess, sys, time
subprocess.Popen(["sleep", "300"])
drain = sys.argv[1]
def term(*_):
    if drain == "never":
        return
    time.sleep(float(drain))
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(0.1)
"""


def _run(
    drain: str, signals: list[tuple[float, int]], grace_s: float
) -> tuple[int, float, list[str]]:
    said: list[str] = []
    sup = Supervisor(ServePlan(grace_s=grace_s), "/nonexistent-haproxy-dir", said.append)
    started = time.monotonic()

    def send() -> None:
        for at, sig in signals:
            time.sleep(max(0.0, started + at - time.monotonic()))
            sup._on_signal(sig, None)

    sender = threading.Thread(target=send)
    sender.start()
    code = sup.run([sys.executable, "-c", CHILD, drain], env={"PATH": "/usr/bin:/bin"})
    sender.join()
    return code, time.monotonic() - started, said


@pytest.fixture
def short_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "STOP_MARGIN_S", 1.0)


def _session_left() -> None:
    assert not [p for p in processes.processes() if b"300" in p.argv and b"sleep" in p.argv[0]]


@pytest.mark.parametrize(
    ("drain", "signals", "code", "lines"),
    [
        # one SIGTERM or Ctrl-C: passed on once, the child drains and exits 0
        ("0.5", [(1.0, signal.SIGTERM)], 0, ["stopping (signal SIGTERM)"]),
        ("0.5", [(1.0, signal.SIGINT)], 0, ["stopping (signal SIGINT)"]),
        # make forwards a SIGTERM of its own: a repeat changes nothing
        ("0.5", [(1.0, signal.SIGTERM), (1.1, signal.SIGTERM)], 0, ["stopping (signal SIGTERM)"]),
        # a second Ctrl-C stops at once
        ("never", [(1.0, signal.SIGINT), (1.5, signal.SIGINT)], 1,
         ["stopping (signal SIGINT)", "second Ctrl-C: stopping now", "not stopped within"]),
        # a serving process that does not stop is killed at the deadline (grace + margin)
        ("never", [(1.0, signal.SIGTERM)], 1, ["stopping (signal SIGTERM)", "not stopped within"]),
    ],
)  # fmt: skip
def test_stop_on_one_signal(
    short_margin: None, drain: str, signals: list[tuple[float, int]], code: int, lines: list[str]
) -> None:
    got, took, said = _run(drain, signals, grace_s=1.0)
    assert got == code, said
    for want, line in zip(lines, said, strict=False):
        assert line.startswith(want), said
    assert took < 1.0 + 2.0 + 4.0  # first signal + deadline (grace 1 + margin 1) + kill
    _session_left()


def test_a_serving_process_that_dies_is_reported_and_its_session_ended() -> None:
    said: list[str] = []
    sup = Supervisor(ServePlan(), "/nonexistent-haproxy-dir", said.append)
    script = "import os, signal, subprocess; subprocess.Popen(['sleep', '300']); " \
             "os.kill(os.getpid(), signal.SIGKILL)"
    assert sup.run([sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin"}) == 1
    assert said[0] == "the serving process died (SIGKILL): stopping what it started"
    _session_left()


def test_the_serving_process_drains_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the supervisor: the serving process gets its parent-death SIGTERM."""
    mark = tmp_path / "drained"
    code = f"""
import signal, sys, time
from app.cli.supervisor import Supervisor, ServePlan
child = "import signal, sys, time\\n" \\
        "done = lambda *_: (open({str(mark)!r}, 'w').close(), sys.exit(0))\\n" \\
        "signal.signal(signal.SIGTERM, done)\\n" \\
        "print('up', flush=True)\\nwhile True: time.sleep(0.1)"
Supervisor(ServePlan(), "/x", print).run([sys.executable, "-c", child], env={{}})
"""
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert sup.stdout is not None and sup.stdout.readline().strip() == "up"
    sup.kill()
    sup.wait()
    deadline = time.monotonic() + 10
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists()


def test_a_run_whose_ray_daemon_dies_is_stopped_at_once(tmp_path: Path) -> None:
    """`ray stop --force` under a run: its GCS gone, the session is ended (Ray's driver
    itself would wait 60 s). The stand-in GCS is a copy of `sleep` named gcs_server."""
    gcs = tmp_path / "gcs_server"
    gcs.write_bytes(Path("/bin/sleep").read_bytes())
    gcs.chmod(0o700)
    said: list[str] = []
    sup = Supervisor(ServePlan(), "/nonexistent-haproxy-dir", said.append, own_ray=True)
    script = f"import subprocess, time; subprocess.Popen([{str(gcs)!r}, '2']); time.sleep(300)"
    started = time.monotonic()
    assert sup.run([sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin"}) == 1
    assert said[0] == "Ray's GCS or raylet is gone (ray stop?): stopping what is left"
    assert time.monotonic() - started < 60
