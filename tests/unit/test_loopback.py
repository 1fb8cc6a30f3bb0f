"""A replica's inter-deployment gRPC server binds loopback on a single-machine Ray."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from ray.serve._private import replica

from app import loopback


@pytest.mark.parametrize(
    ("address", "expected"),
    [("[::]:0", "127.0.0.1:0"), ("[::]:9000", "127.0.0.1:9000"), ("10.0.0.1:5", "10.0.0.1:5")],
)
def test_loopback_address(address: str, expected: str) -> None:
    assert loopback.loopback_address(address) == expected


def test_ray_binds_the_replica_grpc_server_on_every_interface() -> None:
    """The call the patch rewrites: if Ray changes it, revisit app/loopback.py."""
    source = inspect.getsource(replica.Replica._on_initialized)
    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in source


@pytest.mark.parametrize(("env", "patched"), [("0", True), ("1", False), (None, False)])
def test_patch_only_on_a_single_machine_ray(
    monkeypatch: pytest.MonkeyPatch, env: str | None, patched: bool
) -> None:
    calls: list[str] = []

    def original(server: Any, address: str) -> int:
        calls.append(address)
        return 1234

    monkeypatch.setattr(replica, "add_port_to_grpc_server", original)
    if env is None:
        monkeypatch.delenv(loopback.SINGLE_MACHINE_ENV, raising=False)
    else:
        monkeypatch.setenv(loopback.SINGLE_MACHINE_ENV, env)
    assert loopback.bind_replica_grpc_to_loopback() is patched
    assert loopback.bind_replica_grpc_to_loopback() is patched  # twice: wrapped once
    assert replica.add_port_to_grpc_server(object(), "[::]:0") == 1234
    assert calls == ["127.0.0.1:0" if patched else "[::]:0"]
