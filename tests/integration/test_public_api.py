"""Layer 1 over real HTTP: credentials → tenant, 401 vs 403, rate limits with OpenAI's
headers, budget caps that stop a stream cleanly, and one ledger record per admitted
request (aborted ones included) — on the simulated engine, through Ray Serve."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import Gateway

CHAT = "/chat/completions"
HELLO = [{"role": "user", "content": "Say hello to the budget."}]


def _post(gw: Gateway, key: str | None, body: dict[str, Any], **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(gw.v1 + CHAT, json=body, headers=headers, timeout=60)


def test_sdk_with_a_key_is_served_and_billed_to_its_tenant(sim_gateway: Gateway) -> None:
    key = sim_gateway.new_key(tenant="sdk-tenant", team="t1", user="u1")
    client = openai.OpenAI(base_url=sim_gateway.v1, api_key=key, max_retries=0)
    out = client.chat.completions.create(model="sim-chat", messages=HELLO, max_tokens=5)
    assert out.usage is not None and out.usage.completion_tokens <= 5
    (record,) = sim_gateway.records("sdk-tenant", 1)
    assert (record["tenant"], record["team"], record["user"]) == ("sdk-tenant", "t1", "u1")
    assert record["completion_tokens"] == out.usage.completion_tokens
    assert record["prompt_tokens"] == out.usage.prompt_tokens
    assert record["status"] == "ok" and record["model_served"] == "sim-chat"


@pytest.mark.parametrize(
    ("case", "headers", "status"),
    [
        ("garbage bearer", {"Authorization": "Bearer not-a-key"}, 401),
        ("basic scheme", {"Authorization": "Basic dXNlcjpwdw=="}, 401),
        ("unknown key id", {"x-api-key": "sk-sy-000000000000_" + "A" * 43}, 401),
        ("fake jwt", {"Authorization": "Bearer eyJhbGciOiJub25lIn0.e30."}, 401),
    ],
)
def test_bad_credentials_are_401_and_never_anonymous(
    sim_gateway: Gateway, case: str, headers: dict[str, str], status: int
) -> None:
    response = _post(sim_gateway, None, {"model": "sim-chat", "messages": HELLO}, **headers)
    assert response.status_code == status, case
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert "not-a-key" not in error["message"]


def test_revoked_key_and_disabled_tenant_are_403(sim_gateway: Gateway) -> None:
    body = {"model": "sim-chat", "messages": HELLO, "max_tokens": 2}
    revoked = sim_gateway.new_key(tenant="t-revoked")
    assert _post(sim_gateway, revoked, body).status_code == 200
    key_id = revoked.split("_")[0].removeprefix("sk-sy-")
    assert sim_gateway.admin("POST", f"/keys/{key_id}/revoke").status_code == 200
    refused = _post(sim_gateway, revoked, body)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"

    disabled = sim_gateway.new_key(tenant="t-disabled")
    patch = sim_gateway.admin("PATCH", "/tenants/t-disabled", json={"disabled": True})
    assert patch.status_code == 200
    assert _post(sim_gateway, disabled, body).status_code == 403


def test_rpm_limit_answers_429_with_openai_headers(sim_gateway: Gateway) -> None:
    key = sim_gateway.new_key(tenant="t-rpm", rpm=3)
    body = {"model": "sim-chat", "messages": HELLO, "max_tokens": 2}
    answers = [_post(sim_gateway, key, body) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers[:3]] == ["2", "1", "0"]
    assert all(a.headers["x-ratelimit-limit-requests"] == "3" for a in answers)
    refused = answers[3]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(sim_gateway.records("t-rpm", 3)) == 3  # the refused one is not admitted


def test_budget_caps_a_stream_and_then_refuses(sim_gateway: Gateway) -> None:
    # The prompt is ~15 tokens; 60 tokens of budget leave an allowance of ~45 < 100.
    key = sim_gateway.new_key(tenant="t-budget", daily_tokens=60)
    client = openai.OpenAI(base_url=sim_gateway.v1, api_key=key, max_retries=0)
    stream = client.chat.completions.create(
        model="sim-chat",
        messages=HELLO,
        max_tokens=100,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].choices[0].finish_reason == "length"
    assert finals[-1].choices[0].model_extra == {"stop_reason": "budget_exhausted"}
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens + usage.completion_tokens == 60
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="sim-chat", messages=HELLO, max_tokens=100)
    assert refused.value.code == "insufficient_quota"
    (record,) = sim_gateway.records("t-budget", 1)
    assert record["prompt_tokens"] + record["completion_tokens"] == 60


def test_every_admitted_request_has_one_ledger_record(sim_gateway: Gateway) -> None:
    """Completed, aborted and engine-refused requests: one record each, with the
    tokens the engine reported."""
    key = sim_gateway.new_key(tenant="t-ledger")
    client = openai.OpenAI(base_url=sim_gateway.v1, api_key=key, max_retries=0, timeout=60)
    served = []
    for i in range(6):
        out = client.chat.completions.create(
            model="sim-chat", messages=HELLO, max_tokens=4 + i, extra_body={"ignore_eos": True}
        )
        assert out.usage is not None
        served.append(out.usage.completion_tokens)
    aborted = 0
    for _ in range(2):  # a client that leaves mid-stream
        body = {"model": "sim-slow", "messages": HELLO, "max_tokens": 200, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.stream("POST", sim_gateway.v1 + CHAT, json=body, headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and '"content"' in line:
                    aborted += 1
                    break
    # Over the context window: refused before admission, so no record (one rule,
    # budgets or not).
    too_long = {"model": "sim-chat", "prompt": "word " * 5000, "max_tokens": 5}
    refused = httpx.post(
        sim_gateway.v1 + "/completions", json=too_long, headers={"x-api-key": key}, timeout=60
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    # Admitted, then refused by the engine (a token id outside its vocabulary): a record.
    out_of_vocab = {"model": "sim-chat", "prompt": [1, 2**31 - 1], "max_tokens": 5}
    refused = httpx.post(
        sim_gateway.v1 + "/completions", json=out_of_vocab, headers={"x-api-key": key}, timeout=60
    )
    assert refused.status_code == 400, refused.text
    assert "vocabulary" in refused.json()["error"]["message"]
    records = sim_gateway.records("t-ledger", 9)
    assert len(records) == 9 and aborted == 2
    assert len({r["request_id"] for r in records}) == 9
    by_status: dict[str, list[Any]] = {}
    for r in records:
        by_status.setdefault(r["status"], []).append(r)
    assert sorted(r["completion_tokens"] for r in by_status["ok"]) == sorted(served)
    assert len(by_status["client_closed"]) == 2
    assert all(0 < r["completion_tokens"] < 200 for r in by_status["client_closed"])
    assert [r["http_status"] for r in by_status["rejected_by_engine"]] == [400]
    summary = sim_gateway.admin("GET", "/usage", params={"tenant": "t-ledger"}).json()["data"]
    assert sum(row["requests"] for row in summary) == 9


def test_model_list_needs_a_valid_credential_too(sim_gateway: Gateway) -> None:
    listed = httpx.get(sim_gateway.v1 + "/models", headers={"x-api-key": sim_gateway.api_key})
    assert listed.status_code == 200 and "sim-chat" in listed.text
    refused = httpx.get(sim_gateway.v1 + "/models", headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
