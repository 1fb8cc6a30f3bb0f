"""Switchyard's replica router on two real vLLM CPU replicas of the tiny model, in
precise mode (the router follows each engine's KV-cache events), judged by what the
engines report — each response's cached prompt tokens come from the engine that
served it — not by the router's belief; a replica killed under it; and per-tenant KV
isolation on a real vLLM engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from ray import serve

from app.config import KvCacheIsolation
from tests.integration.conftest import Deploy, Gateway

APP = "replica-routed"
MODEL = "tiny-routed"
CPU_BLOCK = 128  # vLLM's KV block size on CPU: the router hashes the same blocks


@pytest.fixture(scope="module")
def routed(
    deploy: Deploy, tiny_model_dir: Path, tiny_loras: dict[str, Path]
) -> Iterator[Gateway]:
    gw = deploy(
        APP,
        {
            "models": [
                {
                    "id": MODEL,
                    "source": str(tiny_model_dir),
                    "max_model_len": 512,
                    "kv_cache_memory_bytes": 32 * 1024**2,
                    "max_num_seqs": 4,
                    "num_replicas": 2,
                    "routing": {"prefix": {"mode": "precise", "block_size": CPU_BLOCK}},
                    "lora": {"max_loras": 1, "max_cpu_loras": 2, "max_lora_rank": 8},
                }
            ],
            "gateway": {"kv_cache": {"default": "shared"}},
        },
    )
    body = {"name": "a1", "base": MODEL, "source": str(tiny_loras["a1"])}
    assert gw.admin("POST", "/adapters", json=body, timeout=30).status_code == 201
    yield gw
    serve.delete(APP)  # at most three real engines alive at once


def _ask(gw: Gateway, content: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(cached prompt tokens the engine reported, the replica the route header names)."""
    client = openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=1,
        extra_headers=headers or {},
    )  # fmt: skip
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens > 0
    details = usage.prompt_tokens_details  # absent when nothing was cached
    route = dict(p.split("=", 1) for p in raw.headers["x-switchyard-route"].split("; "))
    return int(details.cached_tokens or 0) if details is not None else 0, route["replica"]


def _context(i: int) -> str:
    """About 280 tokens of the tiny tokenizer: two full CPU KV blocks."""
    return f"Shared document {i}: " + " ".join(f"w{i}x{j}" for j in range(55))


def test_a_shared_prefix_is_served_where_the_engine_holds_it(routed: Gateway) -> None:
    homes = set()
    for i in range(4):
        first_cached, home = _ask(routed, _context(i) + " Question 0?")
        assert first_cached == 0
        homes.add(home)
        for q in range(1, 4):
            cached, replica = _ask(routed, _context(i) + f" Question {q}?")
            assert replica == home
            assert cached >= 2 * CPU_BLOCK  # the engine reused the context's blocks
    assert len(homes) == 2  # new contexts spread over both replicas


def test_the_route_header_says_which_scorer_decided(routed: Gateway) -> None:
    _ask(routed, _context(7) + " first")
    client = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {routed.api_key}"})
    r = client.post(f"{routed.v1}/chat/completions", json={
        "model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": _context(7) + " second"}]})  # fmt: skip
    parts = dict(p.split("=", 1) for p in r.headers["x-switchyard-route"].split("; "))
    assert parts["scorer"] == "prefix"
    assert parts["prefix"] == "2/2"  # both full blocks of the prompt, held by that replica
    assert float(parts["load"]) >= 0
    # the same decisions in Prometheus text, labels bounded (model, scorer)
    assert routed.metric("switchyard_replica_decisions_total", model=MODEL, scorer="prefix") >= 1
    assert routed.metric("switchyard_replica_index_blocks", model=MODEL) >= 2
    assert routed.metric("switchyard_replica_decision_seconds_count", model=MODEL) >= 2


def test_a_session_stays_on_its_replica(routed: Gateway) -> None:
    homes = set()
    for step in range(6):  # unrelated prompts: only the session ties them
        _, replica = _ask(routed, f"step {step}: " + "z" * step, {"x-session-id": "agent-42"})
        homes.add(replica)
    assert len(homes) == 1


def test_an_adapter_is_served_where_an_engine_has_loaded_it(routed: Gateway) -> None:
    """Unrelated short prompts (no prefix to follow, no session): only the adapter ties
    them. Each route header says whether the engine had to load the adapter (its own
    list of loaded adapters, not the router's belief)."""
    client = openai.OpenAI(base_url=routed.v1, api_key=routed.api_key, max_retries=0)
    seen = []
    for i in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model=f"{MODEL}:a1", messages=[{"role": "user", "content": f"q{i} " * (i + 1)}],
            max_tokens=1,
        )  # fmt: skip
        route = dict(p.split("=", 1) for p in raw.headers["x-switchyard-route"].split("; "))
        seen.append((route["replica"], route["cold"], route["scorer"]))
    first_replica = seen[0][0]
    assert seen[0][1] == "true"  # loaded on first use
    assert seen[1:] == [(first_replica, "false", "adapter")] * 5  # then served where held


def _kill(app: str, replica_id: str) -> None:
    """Kill the replica actor whose id the route header named (Ray starts another)."""
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{app}#") and a["name"].endswith(replica_id)
    ]
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)


def _ask_until_served(gw: Gateway, content: str, headers: dict[str, str]) -> tuple[int, str]:
    deadline = time.monotonic() + 180
    while True:
        try:
            return _ask(gw, content, headers)
        except openai.APIStatusError as exc:  # 503 while the dead replica is replaced
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(0.5)


def test_routing_stays_right_when_a_replica_is_killed(routed: Gateway) -> None:
    """The session's replica also holds a context; it is killed: calls keep being
    served by live replicas (the context recomputed, then cached where it now lives)
    and the session settles on one of them. (That the router forgets a replica that
    left is unit-tested: test_scheduler_loop.)"""
    session = {"x-session-id": "agent-kill"}
    _, home = _ask(routed, _context(20) + " before", session)
    assert _ask(routed, _context(20) + " again", session)[1] == home
    _kill(APP, home)
    cached, moved = _ask_until_served(routed, _context(20) + " after", session)
    assert moved != home and cached == 0  # a live replica computed the context afresh
    later = {_ask(routed, _context(20) + f" then {i}", session)[1] for i in range(3)}
    assert later == {moved}
    cached_again, _ = _ask(routed, _context(20) + " once more", session)
    assert cached_again >= 2 * CPU_BLOCK


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
