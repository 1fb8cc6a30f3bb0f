"""SQLite is a single-node state store: refuse to start an ingress replica on a second
node against the same SQLite URL.

Rule: each ingress replica that opens a ``sqlite://`` store records its Ray node id
under a key derived from the store URL in Ray's cluster-wide key-value store (the GCS).
A replica on another node finds a different node id recorded; if that node is still
alive, the replica fails at start-up with a clear error (its SQLite file would be a
different file, so limits, budgets and the ledger would split). A recorded node that is
no longer alive is replaced (the deployment moved). Redis URLs are never checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable


class SqliteOnSeveralNodes(RuntimeError):
    """An ingress replica on a second node would open its own copy of the SQLite store."""


def _key(state_url: str) -> bytes:
    return b"switchyard:sqlite-node:" + hashlib.sha256(state_url.encode()).hexdigest().encode()


def check_single_node(
    state_url: str,
    node_id: str,
    get: Callable[[bytes], bytes | None],
    put: Callable[[bytes, bytes], object],
    alive_nodes: Callable[[], Iterable[str]],
) -> None:
    """Record this replica's node for ``state_url`` or raise ``SqliteOnSeveralNodes``."""
    if not state_url.startswith("sqlite"):
        return
    key = _key(state_url)
    recorded = get(key)
    other = None if recorded is None else recorded.decode()
    if other is not None and other != node_id and other in set(alive_nodes()):
        raise SqliteOnSeveralNodes(
            f"the state store {state_url} is SQLite, a single-node store, and an ingress "
            f"replica on node {other[:12]} already uses it; this replica runs on node "
            f"{node_id[:12]}. Use Redis (SWITCHYARD_STATE_URL=redis://…) on a cluster, or "
            "keep every ingress replica on one node."
        )
    put(key, node_id.encode())


def check_in_ray(state_url: str) -> None:
    """``check_single_node`` against the running Ray cluster (inside a replica)."""
    import ray
    from ray.experimental import internal_kv

    def put(key: bytes, value: bytes) -> object:
        return internal_kv._internal_kv_put(key, value, overwrite=True)

    def alive() -> list[str]:
        return [str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")]

    check_single_node(
        state_url,
        ray.get_runtime_context().get_node_id(),
        internal_kv._internal_kv_get,
        put,
        alive,
    )
