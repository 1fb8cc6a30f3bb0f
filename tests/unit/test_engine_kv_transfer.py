"""The KV connector settings and the connector's own counters (app.engine.kv_transfer)."""

from __future__ import annotations

import os

import pytest

from app.engine.kv_transfer import (
    ConnectorCounters,
    KvConnector,
    compute_cores,
    set_side_channel,
)


def test_counters_add_up_what_each_scheduler_report_lists() -> None:
    c = ConnectorCounters()
    c.observe({"transfer_duration": [0.01, 0.03], "bytes_transferred": [1000, 3000],
               "num_failed_transfers": [], "num_kv_expired_reqs": [1]})  # fmt: skip
    c.observe({"transfer_duration": [0.02], "bytes_transferred": [500],
               "num_failed_transfers": [1]})  # fmt: skip
    c.observe({})
    extra = c.as_extra()
    assert extra["kv_transfers_total"] == 3 and extra["kv_transfer_bytes_total"] == 4500
    assert extra["kv_transfer_seconds_total"] == pytest.approx(0.06)
    assert (extra["kv_transfer_failures_total"], extra["kv_expired_total"]) == (1, 1)


@pytest.mark.parametrize(("on_gpu", "device"), [(False, "cpu"), (True, "cuda")])
def test_vllm_config_per_device_with_a_fresh_engine_id(on_gpu: bool, device: str) -> None:
    k = KvConnector(kv_lease_s=12, extra_config={"backends": ["UCX"]})
    a, b = k.vllm_config("decode", on_gpu), k.vllm_config("decode", on_gpu)
    assert (a.kv_connector, a.kv_role, a.kv_buffer_device) == ("NixlConnector", "kv_both", device)
    assert a.kv_connector_extra_config == {"kv_lease_duration": 12, "backends": ["UCX"]}
    assert a.engine_id.startswith("decode-") and a.engine_id != b.engine_id
    assert KvConnector(buffer_device="cpu").vllm_config("p", True).kv_buffer_device == "cpu"


def test_the_side_channel_is_set_for_the_next_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "1")  # restored after the test
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "before")
    set_side_channel("10.0.0.7", 20123)
    assert os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    assert os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "20123"


@pytest.mark.parametrize(
    ("nodes", "bind"),
    [([[0, 1]], "0"), ([[0, 1, 2, 3], [4, 5, 6, 7]], "0,1,2,4,5,6"), ([[0]], None)],
)
def test_model_threads_stay_off_the_cores_nixl_reserves(
    nodes: list[list[int]], bind: str | None
) -> None:
    assert compute_cores(nodes) == bind
