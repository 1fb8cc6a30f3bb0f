"""The vLLM general plugin that requests AMX permission in every vLLM process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from importlib.metadata import entry_points
from pathlib import Path

import psutil
import pytest

from app.engine import vllm_plugin


def test_the_plugin_is_registered_for_vllm() -> None:
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "switchyard"]
    assert ep.load() is vllm_plugin.setup_process


@pytest.mark.parametrize(("supported", "granted", "warned"), [
    (True, True, False), (True, False, True), (False, False, False),
])
def test_request_amx(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    supported: bool,
    granted: bool,
    warned: bool,
) -> None:
    import torch

    asked: list[bool] = []
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: supported)
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: asked.append(True) or granted)
    vllm_plugin.request_amx()
    assert asked == ([True] if supported else [])
    assert ("refused" in caplog.text) is warned


def test_a_failure_never_breaks_engine_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    def boom() -> bool:
        raise OSError("no arch_prctl")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", boom)
    vllm_plugin.request_amx()
    assert "could not request AMX permission" in caplog.text


def _grandchild(pid_file: str) -> None:  # runs in a spawned process
    import time

    from app.engine.vllm_plugin import die_with_parent

    assert die_with_parent()
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)


def _child(pid_file: str) -> None:  # runs in a spawned process; starts the grandchild
    import time

    ctx = multiprocessing.get_context("spawn")
    ctx.Process(target=_grandchild, args=(pid_file,), daemon=False).start()
    time.sleep(60)


def test_a_child_dies_with_its_parent(tmp_path: Path) -> None:
    """What ``ray stop --force`` does to a replica: SIGKILL. Its engine processes follow."""
    pid_file = tmp_path / "grandchild.pid"
    ctx = multiprocessing.get_context("spawn")
    parent = ctx.Process(target=_child, args=(str(pid_file),))
    parent.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert psutil.pid_exists(grandchild)
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != "zombie":
        assert time.monotonic() < deadline, "the grandchild outlived its parent"
        time.sleep(0.05)


def test_not_a_multiprocessing_child_changes_nothing() -> None:
    assert vllm_plugin.die_with_parent() is False
