"""Switchyard's replica router on two replicas of one model, judged by what the engines
report (each response's cached prompt tokens come from the engine that served it), not
by the router's belief; and per-tenant KV isolation on a real vLLM engine."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from app.config import KvCacheIsolation
from tests.integration.conftest import Deploy, Gateway

MODEL = "sim-routed"
BLOCK = 16
SIM = {"prefill_s_per_token": 0.0001, "decode_base_s": 0.002, "block_size": BLOCK}


@pytest.fixture(scope="module")
def routed(deploy: Deploy) -> Gateway:
    return deploy(
        "replica-routed",
        {
            "models": [
                {
                    "id": MODEL,
                    "engine": "simulated",
                    "simulation": SIM,
                    "num_replicas": 2,
                    "routing": {"prefix": {"block_size": BLOCK}},
                }
            ],
            "gateway": {"kv_cache": {"default": "shared"}},
        },
    )


def _ask(gw: Gateway, content: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(cached prompt tokens the engine reported, the replica part of the route header)."""
    client = openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2,
        extra_headers=headers or {},
    )  # fmt: skip
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens > 0
    details = usage.prompt_tokens_details  # absent when nothing was cached
    route = raw.headers["x-switchyard-route"]
    replica = next(p for p in route.split("; ") if p.startswith("replica="))
    return int(details.cached_tokens or 0) if details is not None else 0, replica


def _context(i: int) -> str:
    return f"Shared document {i}: " + " ".join(f"w{i}x{j}" for j in range(300))


def test_a_shared_prefix_is_served_where_the_engine_holds_it(routed: Gateway) -> None:
    for i in range(3):
        first_cached, home = _ask(routed, _context(i) + " Question 0?")
        assert first_cached == 0
        for q in range(1, 5):
            cached, replica = _ask(routed, _context(i) + f" Question {q}?")
            assert replica == home
            assert cached >= 200  # the engine reused the context's blocks: it held them


def test_the_route_header_says_which_scorer_decided(routed: Gateway) -> None:
    _ask(routed, _context(7) + " first")
    client = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {routed.api_key}"})
    r = client.post(f"{routed.v1}/chat/completions", json={
        "model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": _context(7) + " second"}]})  # fmt: skip
    parts = dict(p.split("=", 1) for p in r.headers["x-switchyard-route"].split("; "))
    assert parts["scorer"] == "prefix"
    matched, blocks = (int(x) for x in parts["prefix"].split("/"))
    assert blocks > 10 and matched >= blocks - 2
    assert float(parts["load"]) >= 0


def test_a_session_stays_on_its_replica(routed: Gateway) -> None:
    homes = set()
    for step in range(6):  # unrelated prompts: only the session ties them
        _, replica = _ask(routed, f"step {step}: " + "z" * step, {"x-session-id": "agent-42"})
        homes.add(replica)
    assert len(homes) == 1


def _cached(gw: Gateway, key: str, content: str, **extra: Any) -> int:
    client = openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0)
    out = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": content}], max_tokens=1,
        extra_body=extra,
    )  # fmt: skip
    details: Any = out.usage.prompt_tokens_details if out.usage else None
    return int(details.cached_tokens or 0) if details is not None else 0


def test_tenants_never_share_cached_blocks_on_a_real_engine(tiny_gateway: Gateway) -> None:
    """vLLM's cache_salt, derived from the tenant (isolated by default): the same prompt
    hits the cache for its own tenant only."""
    prompt = "Isolation check. " + " ".join(f"t{j}" for j in range(80))  # ~300 tokens
    alice = tiny_gateway.new_key(tenant="kv-alice")
    bob = tiny_gateway.new_key(tenant="kv-bob")
    assert _cached(tiny_gateway, alice, prompt) == 0
    assert _cached(tiny_gateway, alice, prompt) >= 128  # one full CPU KV block at least
    # the same prompt, another tenant — even one sending alice's salt (its scheme is
    # public): the gateway replaces any client salt with the caller's own
    alice_salt = KvCacheIsolation().salt("kv-alice")
    assert _cached(tiny_gateway, bob, prompt, cache_salt=alice_salt) == 0
    assert _cached(tiny_gateway, bob, prompt) >= 128
