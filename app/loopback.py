"""A replica's inter-deployment gRPC server on loopback when Ray runs on one machine.

Ray Serve 2.60 starts each replica's gRPC server for deployment-handle calls on every
interface (``ray/serve/_private/replica.py``: ``add_port_to_grpc_server(self._server,
"[::]:0")``), plaintext unless Ray's TLS is on, and has no knob for the address. When
``switchyard serve`` starts its own single-machine Ray (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
=0``: the node's address is 127.0.0.1, so peers dial 127.0.0.1 and nothing else), that
server is bound to 127.0.0.1 instead: ``bind_replica_grpc_to_loopback()``, called first
in every deployment's constructor (Ray starts the server after the constructor
returns), swaps the address of exactly that call in this process. On a multi-node
cluster it does nothing (peers on other nodes need the node's address; there the
NetworkPolicies of ``k8s/`` admit Ray's ports only from the cluster's own Ray pods).
``tests/unit/test_loopback.py`` fails if Ray's call changes shape.
"""

from __future__ import annotations

import os
from typing import Any

SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
ANY_ADDRESS = "[::]:"


def single_machine() -> bool:
    return os.environ.get(SINGLE_MACHINE_ENV) == "0"


def loopback_address(address: str) -> str:
    return (
        "127.0.0.1:" + address[len(ANY_ADDRESS) :] if address.startswith(ANY_ADDRESS) else address
    )


def bind_replica_grpc_to_loopback() -> bool:
    """Patch this process's replica module; True when its gRPC server binds loopback."""
    if not single_machine():
        return False
    from ray.serve._private import replica

    original = getattr(replica, "add_port_to_grpc_server")  # noqa: B009 (not re-exported)
    if getattr(original, "switchyard_loopback", False):
        return True

    def add_port(server: Any, address: str) -> int:
        return int(original(server, loopback_address(address)))

    add_port.switchyard_loopback = True  # type: ignore[attr-defined]
    setattr(replica, "add_port_to_grpc_server", add_port)  # noqa: B010
    return True
