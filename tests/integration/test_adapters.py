"""LoRA adapters through the gateway, on the real vLLM CPU engine: registered on the
admin API from a directory or the local S3 server, asked for as ``base:adapter`` with
the official SDK, applied (the output changes; the same files from S3 answer the same),
loaded on first use (the route header and the metrics say cold, then warm), private to
a tenant (404 and unlisted for the others), checked at registration, recorded in the
ledger, and gone once removed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from app.models.tiny import build_tiny_lora
from tests.integration.conftest import TENANT, Gateway
from tests.s3_server import upload_folder

BASE = "tiny-llama"
OTHER = "globex"


def client(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=key or gw.api_key, max_retries=0, timeout=120)


def greedy(c: openai.OpenAI, model: str) -> tuple[str, str, str]:
    raw = c.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "the router streams"}],
        temperature=0, max_tokens=8,
    )  # fmt: skip
    answer = raw.parse()
    return answer.choices[0].message.content or "", answer.model, raw.headers["x-switchyard-route"]


@pytest.fixture(scope="module")
def registered(tiny_gateway: Gateway, tiny_loras: dict[str, Path]) -> Gateway:
    for name, tenant in (("a1", None), ("a2", OTHER)):
        body = {"name": name, "base": BASE, "source": str(tiny_loras[name]), "tenant": tenant,
                "price_per_1m_out": 1000.0}  # fmt: skip
        response = tiny_gateway.admin("POST", "/adapters", json=body, timeout=30)
        assert response.status_code == 201, response.text
    return tiny_gateway


def test_an_adapter_answers_as_base_colon_name_and_changes_the_output(registered: Gateway) -> None:
    c = client(registered)
    base_text, base_model, _ = greedy(c, BASE)
    text, model, route = greedy(c, f"{BASE}:a1")
    assert model == f"{BASE}:a1" and base_model == BASE
    assert text != base_text  # the adapter ran on the engine
    assert f"adapter={BASE}:a1; cold=true" in route and f"model={BASE}" in route
    again, _, route = greedy(c, f"{BASE}:a1")
    assert again == text and f"adapter={BASE}:a1; cold=false" in route  # held: no load
    assert registered.metric("switchyard_adapter_requests_total", model=BASE, cold="true") == 1
    assert registered.metric("switchyard_adapter_requests_total", model=BASE, cold="false") == 1
    assert registered.metric("switchyard_adapter_load_seconds_count", model=BASE) == 1
    assert registered.metric("switchyard_adapter_load_seconds_sum", model=BASE) > 0
    records = registered.records(TENANT, expected=3)
    ours = [r for r in records if r.get("adapter") == f"{BASE}:a1"]
    assert len(ours) == 2 and all(r["model_requested"] == f"{BASE}:a1" for r in ours)
    # the adapter's own output price (1000 $/1M) is what the ledger charged
    assert all(r["cost_usd"] >= r["completion_tokens"] * 1000 / 1e6 for r in ours)


def test_a_private_adapter_does_not_exist_for_other_tenants(registered: Gateway) -> None:
    mine, theirs = client(registered), client(registered, registered.new_key(OTHER))
    with pytest.raises(openai.NotFoundError) as refused:
        greedy(mine, f"{BASE}:a2")
    assert refused.value.code == "model_not_found"
    listed = {m.id: m for m in mine.models.list().data}
    assert f"{BASE}:a1" in listed and f"{BASE}:a2" not in listed
    assert listed[f"{BASE}:a1"].model_extra["parent"] == BASE  # type: ignore[index]
    assert {f"{BASE}:a1", f"{BASE}:a2"} <= {m.id for m in theirs.models.list().data}
    text, model, _ = greedy(theirs, f"{BASE}:a2")
    assert model == f"{BASE}:a2" and text


def test_the_same_adapter_from_object_storage_answers_the_same(
    registered: Gateway, s3_endpoint: str, tiny_loras: dict[str, Path]
) -> None:
    upload_folder(s3_endpoint, tiny_loras["a1"], "switchyard-adapters", "tiny/a1")
    body = {"name": "a1-s3", "base": BASE, "source": "s3://switchyard-adapters/tiny/a1"}
    response = registered.admin("POST", "/adapters", json=body, timeout=60)
    assert response.status_code == 201, response.text
    assert response.json()["s3_endpoint_url"] == s3_endpoint  # the gateway's setting
    c = client(registered)
    from_s3, model, _ = greedy(c, f"{BASE}:a1-s3")
    assert model == f"{BASE}:a1-s3" and from_s3 == greedy(c, f"{BASE}:a1")[0]
    missing = {"name": "gone", "base": BASE, "source": "s3://switchyard-adapters/none"}
    response = registered.admin("POST", "/adapters", json=missing, timeout=60)
    assert response.status_code == 400
    assert "no adapter_config.json under the prefix" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "big", "rank": 16}, "exceeds the pool's max_lora_rank 8"),
        ({"name": "a1"}, "exists already"),
        ({"name": "x", "base": "nope"}, "not a model this gateway serves"),
        ({"name": "bad:name"}, "use 1-64 letters"),
        ({"name": "empty", "source": "/nonexistent/adapter"}, "not a directory"),
    ],
)
def test_registration_refuses_what_cannot_be_served(
    registered: Gateway, tmp_path: Path, body: dict[str, object], message: str
) -> None:
    rank = int(body.pop("rank", 8))  # type: ignore[call-overload]
    source = build_tiny_lora(tmp_path / "adapter", seed=9, rank=rank)
    payload = {"base": BASE, "source": str(source), **body}
    response = registered.admin("POST", "/adapters", json=payload, timeout=30)
    assert response.status_code in (400, 409), response.text
    assert message in response.json()["error"]["message"]


def test_a_removed_adapter_is_not_found(
    registered: Gateway, tiny_loras: dict[str, Path]
) -> None:
    body = {"name": "a3", "base": BASE, "source": str(tiny_loras["a3"])}
    assert registered.admin("POST", "/adapters", json=body, timeout=30).status_code == 201
    c = client(registered)
    assert greedy(c, f"{BASE}:a3")[1] == f"{BASE}:a3"
    assert registered.admin("DELETE", f"/adapters/{BASE}:a3", timeout=30).status_code == 200
    with pytest.raises(openai.NotFoundError):
        greedy(c, f"{BASE}:a3")
    assert registered.admin("DELETE", f"/adapters/{BASE}:a3", timeout=30).status_code == 404
