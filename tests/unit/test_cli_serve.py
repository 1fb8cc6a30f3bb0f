"""`switchyard serve`: a SIGTERM drains every application before Serve shuts down."""

from __future__ import annotations

import signal
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
    }
