"""``app.api.drain_signal``: the callbacks run when Ray starts stopping the replica,
before Ray's own drain, once; a failing callback does not stop the shutdown."""

from __future__ import annotations

from typing import Any

import pytest
from ray.serve._private import replica

from app.api import drain_signal


@pytest.fixture
def ray_stop(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ray's stop replaced by one that records it ran; a fresh install of the hook."""
    seen: list[str] = []

    async def original(self: Any) -> str:
        seen.append("ray drain")
        return "stopped"

    monkeypatch.setattr(replica.Replica, "_perform_graceful_shutdown", original)
    monkeypatch.setattr(drain_signal, "_installed", None)
    monkeypatch.setattr(drain_signal, "_callbacks", [])
    return seen


async def test_callbacks_run_before_rays_drain_and_only_once(ray_stop: list[str]) -> None:
    assert drain_signal.on_drain(lambda: ray_stop.append("ingress grace"))
    assert drain_signal.on_drain(lambda: ray_stop.append("second"))
    assert await replica.Replica._perform_graceful_shutdown(object()) == "stopped"
    assert ray_stop == ["ingress grace", "second", "ray drain"]
    await replica.Replica._perform_graceful_shutdown(object())
    assert ray_stop[3:] == ["ray drain"]


async def test_a_failing_callback_is_logged_and_the_stop_goes_on(
    ray_stop: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    drain_signal.on_drain(broken)
    drain_signal.on_drain(lambda: ray_stop.append("after"))
    await replica.Replica._perform_graceful_shutdown(object())
    assert ray_stop == ["after", "ray drain"]
    assert "a drain callback failed" in caplog.text


def test_without_the_ray_method_it_reports_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(replica.Replica, "_perform_graceful_shutdown")
    monkeypatch.setattr(drain_signal, "_installed", None)
    monkeypatch.setattr(drain_signal, "_callbacks", [])
    assert drain_signal.on_drain(lambda: None) is False
    assert drain_signal._callbacks == []
