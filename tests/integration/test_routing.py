"""Model selection through Ray Serve with a routes file: every response explains its
route, tenants and long outputs go to their pools, a dead first pool falls back without
double billing, and editing the routes file under load fails no request."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.local_redis import free_port
from tests.integration.conftest import SIM_FAST, Deploy, Gateway

HELLO = [{"role": "user", "content": "route me"}]
ROUTES = """
pools:
  main:   {kind: local, model: sim-main}
  spare:  {kind: local, model: sim-spare}
  spec:   {kind: local, model: sim-spec}
  dead:   {kind: openai, base_url: "http://127.0.0.1:DEAD_PORT/v1", model: gone,
           connect_timeout_s: 1}
models:
  chat:
    pool: main
    profile: {max_context: 2048, input_per_1m: 1, output_per_1m: 2}
    tenants: {vip: spare}
    draft: {pool: spare, min_output_tokens: 1024}
  long:
    pool: main
    profile: {max_context: 2048}
    draft: {pool: spec, min_output_tokens: 16, min_acceptance: 0.4}
  flaky:
    pool: dead
    profile: {max_context: 2048}
    fallbacks: [spare]
aliases:
  mini: chat
  auto: {policy: {candidates: [chat], cost_ceiling_usd: 1.0}}
fallback: {max_attempts: 3, total_timeout_s: 10}
"""


def _route(response: httpx.Response) -> dict[str, str]:
    header = response.headers["x-switchyard-route"]
    return dict(part.split("=", 1) for part in header.split("; "))


@pytest.fixture(scope="module")
def routes_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("routes") / "routes.yaml"
    path.write_text(ROUTES.replace("DEAD_PORT", str(free_port())))
    return path


@pytest.fixture(scope="module")
def routed(deploy: Deploy, routes_path: Path) -> Gateway:
    sim = {"engine": "simulated", "simulation": SIM_FAST}
    return deploy(
        "routed",
        {
            "models": [
                {"id": "sim-main", **sim},
                {"id": "sim-spare", **sim},
                # a speculative pool whose drafts are mostly rejected (acceptance ~0.03)
                {"id": "sim-spec", "engine": "simulated",
                 "simulation": {**SIM_FAST, "spec_tokens": 4, "spec_acceptance": 0.1}},
            ],
            "routes_file": str(routes_path),
            "route_refresh_s": 0.2,
            "gateway": {"anonymous_tenant": "anonymous"},
        },
    )


def _chat(gw: Gateway, model: str, key: str | None = None, **body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    payload = {"model": model, "messages": HELLO, "max_tokens": 4, **body}
    return httpx.post(gw.v1 + "/chat/completions", json=payload, headers=headers, timeout=60)


@pytest.mark.parametrize(
    ("model", "tenant", "max_tokens", "expected"),
    [
        ("chat", None, 4, {"model": "chat", "pool": "main", "step": "default"}),
        ("mini", None, 4, {"model": "chat", "pool": "main", "step": "default", "via": "alias"}),
        ("chat", "vip", 4, {"model": "chat", "pool": "spare", "step": "tenant"}),
        ("chat", None, 1025, {"model": "chat", "pool": "spare", "step": "speculative"}),
    ],
)
def test_each_response_explains_its_route(
    routed: Gateway, model: str, tenant: str | None, max_tokens: int, expected: dict[str, str]
) -> None:
    key = routed.new_key(tenant=tenant) if tenant else None
    response = _chat(routed, model, key, max_tokens=max_tokens)
    assert response.status_code == 200, response.text
    route = _route(response)
    assert {k: route.get(k) for k in expected} == expected
    assert route["attempts"] == "1"
    assert response.json()["model"] == "chat"


def test_a_speculative_pool_with_low_acceptance_is_held_off_and_says_so(
    routed: Gateway,
) -> None:
    """The draft pool's engine reports its drafts (simulated: 4 tokens a step, each kept
    with probability 0.1); once the gateway has measured 256 draft tokens its acceptance
    is far below the floor of 0.4, and long requests go to the model's own pool, the
    header and the ledger saying why."""
    key = routed.new_key(tenant="spec-t")
    routes = []
    for _ in range(12):
        response = _chat(routed, "long", key, max_tokens=100)
        assert response.status_code == 200, response.text
        routes.append(_route(response))
        if routes[-1]["speculative"].startswith("off"):
            break
    first, last = routes[0], routes[-1]
    assert (first["pool"], first["step"], first["speculative"]) == (
        "spec", "speculative", "unmeasured"
    )
    assert (last["pool"], last["step"]) == ("main", "default"), routes
    measured = float(last["speculative"].split("acceptance ")[1].split(" <")[0])
    assert measured < 0.1 and last["speculative"].endswith("< 0.40)")
    records = routed.records("spec-t", expected=len(routes))
    got = sorted((r["pool"], r["route_step"]) for r in records)
    assert got == [("main", "default")] + [("spec", "speculative")] * (len(routes) - 1)


def test_a_dead_pool_falls_back_and_bills_once(routed: Gateway) -> None:
    key = routed.new_key(tenant="fallback-t")
    response = _chat(routed, "flaky", key)
    assert response.status_code == 200, response.text
    route = _route(response)
    assert (route["pool"], route["step"], route["first"], route["attempts"]) == (
        "spare", "fallback", "default", "2"
    )
    records = routed.records("fallback-t")
    assert [(r["pool"], r["route_step"], r["attempts"]) for r in records] == [
        ("spare", "fallback", 2)
    ]
    assert routed.metric("switchyard_route_fallbacks_total", reason="upstream_connect") >= 1


def test_a_policy_alias_explains_its_class_and_honours_the_quality_floor(
    routed: Gateway,
) -> None:
    picked = _chat(routed, "auto")
    assert picked.status_code == 200, picked.text
    route = _route(picked)
    assert (route["model"], route["via"]) == ("chat", "policy")
    assert route["class"] == "prompt=short|output=short|difficulty=easy"
    headers = {"x-switchyard-quality-floor": "0.9"}
    refused = httpx.post(
        routed.v1 + "/chat/completions",
        json={"model": "auto", "messages": HELLO, "max_tokens": 4},
        headers=headers,
        timeout=30,
    )
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "no_route_fits"
    assert "chat (quality" in refused.json()["error"]["message"]
    bad = httpx.post(
        routed.v1 + "/chat/completions",
        json={"model": "auto", "messages": HELLO},
        headers={"x-switchyard-quality-floor": "high"},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-switchyard-quality-floor"


def test_unknown_model_is_404_with_openai_shape(routed: Gateway) -> None:
    response = _chat(routed, "no-such-model")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_hot_reload_under_load_fails_no_request(routed: Gateway, routes_path: Path) -> None:
    """~50 requests/s for a few seconds while `chat` moves from pool main to spare."""

    async def load(stop: asyncio.Event, codes: list[int], pools: list[str]) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while not stop.is_set():
                r = await http.post(
                    routed.v1 + "/chat/completions",
                    json={"model": "chat", "messages": HELLO, "max_tokens": 2},
                )
                codes.append(r.status_code)
                if r.status_code == 200:
                    pools.append(_route(r)["pool"])
                await asyncio.sleep(0.02)

    async def run() -> tuple[list[int], list[str]]:
        stop, codes, pools = asyncio.Event(), [], []  # type: ignore[var-annotated]
        workers = [asyncio.create_task(load(stop, codes, pools)) for _ in range(4)]
        await asyncio.sleep(1.5)
        original = routes_path.read_text()
        routes_path.write_text(original.replace("    pool: main\n", "    pool: spare\n", 1))
        st = routes_path.stat()
        os.utime(routes_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*workers)
        routes_path.write_text(original)  # back for other tests
        return codes, pools

    codes, pools = asyncio.run(run())
    assert len(codes) > 50 and set(codes) == {200}
    assert pools[0] == "main" and pools[-1] == "spare"  # the reload took effect
    assert pools.index("spare") > 0 and "main" not in pools[pools.index("spare") + 5 :]
