"""Layer 1 for one replica: what it builds at start-up, so the first requests pay nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import GatewayArgs
from app.engine import factory
from app.engine.factory import SimulatedEngineConfig
from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
from app.observability.metrics import GatewayMetrics


def test_prompt_tokenizers_are_built_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a tokenizer on the first request stalled the loop long enough for the
    concurrent requests' store calls to time out; they are built in the constructor."""
    built: list[str] = []
    real = factory.build_tokenizer

    def counting(config: SimulatedEngineConfig) -> object:
        built.append(config.served_name)
        return real(config)

    monkeypatch.setattr("app.gateway.gatekeeper.build_tokenizer", counting)
    engines = {m: SimulatedEngineConfig(served_name=m) for m in ("a", "b")}
    config = GatewayConfig(
        args=GatewayArgs(), state_url=f"sqlite:///{tmp_path / 's.db'}", tokenizers=engines
    )
    gatekeeper = Gatekeeper(config, GatewayMetrics(["a", "b"]), replica="r")
    assert sorted(built) == ["a", "b"]
    assert gatekeeper.tokenizer("a") is gatekeeper.tokenizer("a")
    assert gatekeeper.tokenizer("nope") is None and gatekeeper.tokenizer(None) is None
    assert sorted(built) == ["a", "b"]  # nothing built on use
