"""Every bad input and failure answers in the one OpenAI error shape with the right
status (table-driven over raw HTTP, since the SDK would hide the details)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Gateway

CHAT = "/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]


def _assert_shape(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


CASES: list[tuple[str, str, str, Any, int, str | None, str | None]] = [
    # (case, method, path, json-or-bytes, status, param, code)
    ("invalid json", "POST", CHAT, b"{not json", 400, None, "invalid_json"),
    ("json array", "POST", CHAT, b"[1, 2]", 400, None, "invalid_json"),
    ("missing messages", "POST", CHAT, {"model": "sim-chat"}, 400, "messages", "invalid_value"),
    (
        "bad temperature",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": OK_MESSAGES, "temperature": 7},
        400,
        "temperature",
        "invalid_value",
    ),
    (
        "bad role",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
        "invalid_value",
    ),
    (
        "n above the cap",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": OK_MESSAGES, "n": 129},
        400,
        "n",
        "invalid_value",
    ),
    (
        "a documented parameter that cannot be honoured",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": OK_MESSAGES, "logprobs": True},
        400,
        "logprobs",
        "invalid_value",
    ),
    (
        "unknown field",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": OK_MESSAGES, "bogus": 1},
        400,
        "bogus",
        "invalid_value",
    ),
    (
        "unknown model",
        "POST",
        CHAT,
        {"model": "no-such-model", "messages": OK_MESSAGES},
        404,
        "model",
        "model_not_found",
    ),
    (
        "context too long",
        "POST",
        CHAT,
        {"model": "sim-chat", "messages": OK_MESSAGES, "max_tokens": 4000},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        "completion context too long",
        "POST",
        "/completions",
        {"model": "sim-chat", "prompt": "word " * 3000, "max_tokens": 1},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "embedding from a chat model",
        "POST",
        "/embeddings",
        {"model": "sim-chat", "input": "x"},
        400,
        "model",
        "model_not_supported_for_endpoint",
    ),
    (
        "chat to an embedding model",
        "POST",
        CHAT,
        {"model": "sim-embed", "messages": [{"role": "user", "content": "x"}]},
        400,
        "model",
        "model_not_supported_for_endpoint",
    ),
    ("wrong method", "GET", CHAT, None, 405, None, "method_not_allowed"),
    ("unknown path", "GET", "/nothing-here", None, 404, None, "not_found"),
]


@pytest.mark.parametrize(
    ("case", "method", "path", "payload", "status", "param", "code"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_error_cases(
    sim_gateway: Gateway,
    case: str,
    method: str,
    path: str,
    payload: Any,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    kwargs: dict[str, Any] = {}
    if isinstance(payload, bytes):
        kwargs["content"] = payload
        kwargs["headers"] = {"content-type": "application/json"}
    elif payload is not None:
        kwargs["json"] = payload
    response = httpx.request(method, sim_gateway.v1 + path, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    error = _assert_shape(response)
    assert error["param"] == param
    assert error["code"] == code


def test_body_over_limit_is_413(sim_gateway: Gateway) -> None:
    # The sim gateway is configured with a 64 KiB limit.
    big = {"model": "sim-chat", "messages": [{"role": "user", "content": "x" * 70_000}]}
    response = httpx.post(sim_gateway.v1 + CHAT, json=big, timeout=30)
    assert response.status_code == 413
    assert _assert_shape(response)["code"] == "request_too_large"


def test_chunked_body_over_limit_is_413(sim_gateway: Gateway) -> None:
    def body() -> Any:
        for _ in range(100):
            yield b"x" * 1024

    response = httpx.post(sim_gateway.v1 + CHAT, content=body(), timeout=30)
    assert response.status_code == 413


def test_a_saturated_model_sheds_with_503_and_retry_after(sim_gateway: Gateway) -> None:
    """sim-one-slot runs one sequence; the ingress queues three more (the sim gateway's
    fairness.max_waiting); a fifth is shed: 503 pool_full with Retry-After, and a
    ledger record that says so."""
    holding = {
        "model": "sim-one-slot",
        "messages": OK_MESSAGES,
        "max_tokens": 16,
        "ignore_eos": True,
    }
    handle = sim_gateway.server("sim-one-slot")
    results: list[int] = []

    def hold() -> None:
        results.append(httpx.post(sim_gateway.v1 + CHAT, json=holding, timeout=60).status_code)

    def state() -> tuple[int, int, float]:
        stats = handle.stats.remote().result()
        waiting = sim_gateway.metric(
            "switchyard_queue_waiting", pool="sim-one-slot", band="standard"
        )
        return int(stats.running), int(stats.waiting), waiting

    def wait_for(want: tuple[int, int, float]) -> None:
        for _ in range(500):
            if state() == want:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"never reached {want}: {state()}")

    shed_before = sim_gateway.metric(
        "switchyard_queue_shed_total", model="sim-one-slot", reason="pool_full"
    )
    threads = [threading.Thread(target=hold) for _ in range(4)]
    for queued, thread in enumerate(threads):
        thread.start()
        wait_for((1, 0, queued))  # the first runs, the others wait at the ingress
    refused = httpx.post(sim_gateway.v1 + CHAT, json=holding, timeout=60)
    for t in threads:
        t.join()
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    error = _assert_shape(refused)
    assert (error["type"], error["code"]) == ("server_error", "pool_full")
    assert "band=standard" in refused.headers["x-switchyard-route"]
    assert results == [200] * 4
    params = {"request_id": refused.headers["x-request-id"], "group": "records"}
    for _ in range(200):  # settled just after the response
        found = sim_gateway.admin("GET", "/usage", params=params, timeout=30).json()["data"]
        if found:
            break
        threading.Event().wait(0.05)
    assert [(r["status"], r["http_status"]) for r in found] == [("shed", 503)]
    after = sim_gateway.metric(
        "switchyard_queue_shed_total", model="sim-one-slot", reason="pool_full"
    )
    assert after == shed_before + 1


def test_errors_are_counted_with_bounded_labels(sim_gateway: Gateway) -> None:
    before = sim_gateway.metric("switchyard_requests_total", model="other", status="404")
    httpx.post(sim_gateway.v1 + CHAT, json={"model": "user-chosen-x1", "messages": OK_MESSAGES})
    after = sim_gateway.metric("switchyard_requests_total", model="other", status="404")
    assert after == before + 1
    assert "user-chosen-x1" not in httpx.get(sim_gateway.root + "/metrics").text
