"""An ingress replica on a SQLite store records its Ray node for that store in Ray's
cluster key-value store (the check that refuses a second node reads it)."""

from __future__ import annotations

import ray
from ray import serve
from ray.experimental import internal_kv

from app.api.single_node import _key
from tests.integration.conftest import Deploy
from tests.integration.streams import slow_sim


def test_the_ingress_records_its_node_for_its_sqlite_store(deploy: Deploy) -> None:
    gw = deploy("onenode", {"models": [slow_sim("onenode-sim")]})
    assert gw.state_url.startswith("sqlite:")
    recorded = internal_kv._internal_kv_get(_key(gw.state_url))
    alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert recorded is not None and recorded.decode() in alive
    serve.delete("onenode")
