"""A client that goes away makes the engine abort its request: the engine's running
count returns to where it was within 1 s and the abort counters move."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Gateway

ABORT_DEADLINE_S = 1.0  # the acceptance bound of the walking-skeleton issue


def _busy(stats: Any) -> int:
    return int(stats.running + stats.waiting)


def _wait_until(predicate: Any, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def _left(gw: Gateway, model: str) -> float:
    return gw.metric("switchyard_requests_total", model=model, status="499")


def _assert_aborted(
    gw: Gateway, model: str, before: Any, aborts_before: float, left_before: float
) -> None:
    handle = gw.server(model)
    settled = _wait_until(
        lambda: _busy(handle.stats.remote().result()) == _busy(before), ABORT_DEADLINE_S
    )
    after = handle.stats.remote().result()
    assert settled, f"engine still busy: {after}"
    assert after.aborted_total == before.aborted_total + 1
    assert _wait_until(
        lambda: gw.metric("switchyard_requests_aborted_total", model=model) == aborts_before + 1,
        5.0,
    )
    assert _left(gw, model) == left_before + 1  # answered as 499 (client closed request)


def _started(gw: Gateway, model: str, before: Any) -> bool:
    handle = gw.server(model)
    return _wait_until(lambda: _busy(handle.stats.remote().result()) > _busy(before), 10.0)


@pytest.mark.parametrize(
    ("gateway", "model"), [("sim_gateway", "sim-slow"), ("tiny_gateway", "tiny-llama")]
)
def test_disconnect_mid_stream_aborts(
    request: pytest.FixtureRequest, gateway: str, model: str
) -> None:
    gw: Gateway = request.getfixturevalue(gateway)
    handle = gw.server(model)
    before = handle.stats.remote().result()
    aborts = gw.metric("switchyard_requests_aborted_total", model=model)
    left = _left(gw, model)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "tell a long story"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", gw.v1 + "/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data:"):
                seen += 1
            if seen >= 3:
                break
        assert seen == 3
    _assert_aborted(gw, model, before, aborts, left)


def test_disconnect_before_first_token_aborts(sim_gateway: Gateway) -> None:
    model = "sim-slow"  # 2 ms per prompt token: ~3 s of prefill for this prompt
    handle = sim_gateway.server(model)
    before = handle.stats.remote().result()
    aborts = sim_gateway.metric("switchyard_requests_aborted_total", model=model)
    left = _left(sim_gateway, model)
    body = {"model": model, "prompt": "word " * 1500, "max_tokens": 5, "stream": True}
    client = httpx.Client(timeout=60)
    with client.stream("POST", sim_gateway.v1 + "/completions", json=body):
        assert _started(sim_gateway, model, before)
        # leave without reading a byte: the stream is closed here
    client.close()
    _assert_aborted(sim_gateway, model, before, aborts, left)


def test_non_streaming_client_timeout_aborts(sim_gateway: Gateway) -> None:
    model = "sim-slow"  # 50 ms per step: 200 tokens take ~10 s
    handle = sim_gateway.server(model)
    before = handle.stats.remote().result()
    aborts = sim_gateway.metric("switchyard_requests_aborted_total", model=model)
    left = _left(sim_gateway, model)
    body = {"model": model, "prompt": "hello", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim_gateway.v1 + "/completions", json=body, timeout=1.0)
    _assert_aborted(sim_gateway, model, before, aborts, left)
