"""Agent sessions end to end, with the official SDK: a whole-session cancel across two
ingress replicas sharing a real Redis ends every call of the session, frees every engine
slot, bills exactly what each call produced and refuses the session's new calls (409);
other tenants cannot see or cancel it (404); a short agentic run shows in the session
metrics and tally once its sessions end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from app.gateway.plan import build_plan
from app.state.records import Limits
from app.state.redis_store import RedisStore
from tests.integration.conftest import ADMIN_TOKEN, SIM_FAST, Deploy, Gateway

MODEL = "sim-session"
SLOW = {"decode_base_s": 0.05, "prefill_s_per_token": 0.0005}
STREAMS = 8
FREED_WITHIN_S = 1.0  # the bound: every engine slot of the session free within 1 s
PROMPT = [{"role": "user", "content": "Plan the next step of the task, in detail."}]


@pytest.fixture(scope="module")
def two_replicas(deploy: Deploy, redis_server_url: str) -> Gateway:
    return deploy(
        "sessions",
        {
            "models": [{"id": MODEL, "engine": "simulated", "simulation": SLOW}],
            "ingress_replicas": 2,
            "gateway": {"sessions": {"cancel_ttl_s": 30}},
        },
        state_url=redis_server_url,
    )


@pytest.fixture(scope="module")
def one_replica(deploy: Deploy) -> Gateway:
    return deploy(
        "sessions-metrics",
        {
            "models": [{"id": "sim-agent", "engine": "simulated", "simulation": SIM_FAST}],
            "gateway": {
                "metrics_tenants": ["agentic"],
                "sessions": {"idle_s": 0.5, "tenant_slo_ms": {"agentic": 60_000}},
            },
        },
    )


def _busy(gw: Gateway) -> int:
    stats = gw.server(MODEL).stats.remote().result()
    return int(stats.running + stats.waiting)


def _wait_busy(gw: Gateway, predicate: Any, deadline_s: float) -> float | None:
    """Seconds until ``predicate(busy)`` holds, or None at the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if predicate(_busy(gw)):
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def _session(gw: Gateway, key: str, session: str, action: str = "") -> httpx.Response:
    url = f"{gw.v1}/sessions/{session}" + (f"/{action}" if action else "")
    method = "POST" if action else "GET"
    return httpx.request(method, url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_cancel_ends_the_whole_session_on_both_replicas(two_replicas: Gateway) -> None:
    gw = two_replicas
    tenant, budget = "agents", 200_000
    created = gw.admin("POST", "/tenants", json={"id": tenant, "limits": {"daily_tokens": budget}})
    assert created.status_code == 201, created.text
    key = gw.new_key(tenant=tenant)
    stranger = gw.new_key(tenant="someone-else")
    session = "agent-run-7"
    before = _busy(gw)
    client = openai.AsyncOpenAI(base_url=gw.v1, api_key=key, max_retries=0)
    headers = {"x-session-id": session}

    async def streamed() -> str:
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=2000, stream=True,
                extra_body={"ignore_eos": True}, extra_headers=headers,
            )  # fmt: skip
            async for _ in stream:
                pass
        except openai.APIError as exc:
            return str(exc.code)
        return "finished"

    async def whole() -> str:
        try:
            await client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=2000,
                extra_body={"ignore_eos": True}, extra_headers=headers,
            )  # fmt: skip
        except openai.ConflictError as exc:
            return str(exc.code)
        return "finished"

    async def run() -> tuple[list[str], float | None, httpx.Response]:
        calls = [asyncio.ensure_future(streamed()) for _ in range(STREAMS)]
        calls.append(asyncio.ensure_future(whole()))
        started = await asyncio.to_thread(_wait_busy, gw, lambda n: n >= before + STREAMS + 1, 30.0)
        assert started is not None, "the session's calls never all reached the engine"
        await asyncio.sleep(0.3)  # every call streams for a while
        cancelled = await asyncio.to_thread(_session, gw, key, session, "cancel")
        freed = await asyncio.to_thread(_wait_busy, gw, lambda n: n <= before, 10.0)
        return list(await asyncio.gather(*calls)), freed, cancelled

    outcomes, freed_s, cancelled = asyncio.run(run())
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert outcomes == ["session_cancelled"] * (STREAMS + 1)
    assert freed_s is not None and freed_s <= FREED_WITHIN_S, f"slots freed after {freed_s}"

    records = gw.records(tenant, STREAMS + 1)
    assert len(records) == STREAMS + 1
    assert {(r["session_id"], r["status"], r["http_status"]) for r in records} == {
        (session, "cancelled", 409)
    }
    assert all(r["completion_tokens"] > 0 for r in records)  # each billed what it produced
    assert len({r["ingress"] for r in records}) == 2  # the cancel reached both replicas

    # The budget holds exactly what the records say, and nothing stays reserved.
    (check,) = build_plan([(f"tenant:{tenant}", Limits(daily_tokens=budget))], time.time()).budgets
    billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)

    async def used() -> tuple[float, float]:
        store = RedisStore(gw.state_url)
        try:
            return await store.budget_used(check.key)
        finally:
            await store.close()

    assert asyncio.run(used()) == (billed, 0)

    # The tally says the same; new calls of the session are refused until the TTL.
    tally = _session(gw, key, session).json()
    assert tally["calls"] == STREAMS + 1 and tally["calls_by_status"] == {"cancelled": 9}
    assert tally["usage"]["total_tokens"] == billed
    with pytest.raises(openai.ConflictError) as refused:
        openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0).chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=4, extra_headers=headers
        )
    assert refused.value.code == "session_cancelled"
    assert "x-session-id" in str(refused.value)
    assert len(gw.records(tenant, STREAMS + 2, deadline_s=1.0)) == STREAMS + 1  # not admitted

    # Another tenant can neither see nor cancel it; an admin can see it.
    for action in ("", "cancel"):
        response = _session(gw, stranger, session, action)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "session_not_found"
    shown = gw.admin("GET", f"/tenants/{tenant}/sessions/{session}", timeout=30)
    assert shown.status_code == 200 and shown.json()["calls"] == STREAMS + 1


def test_a_short_agentic_run_shows_in_the_session_metrics(one_replica: Gateway) -> None:
    gw = one_replica
    key = gw.new_key(tenant="agentic")
    client = openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0)
    for step in range(4):  # planner → tool → tool → answer, one session
        client.chat.completions.create(
            model="sim-agent", messages=[{"role": "user", "content": f"step {step}"}],
            max_tokens=8, extra_headers={"x-session-id": "run-1"},
        )  # fmt: skip
    for step in range(2):  # a session whose own SLO (1 ms) cannot be met
        client.chat.completions.create(
            model="sim-agent", messages=[{"role": "user", "content": f"step {step}"}],
            max_tokens=8,
            extra_headers={"x-session-id": "run-2", "x-switchyard-session-slo-ms": "1"},
        )  # fmt: skip
    live = _session(gw, key, "run-1").json()
    assert (live["status"], live["calls"], live["slo"]["verdict"]) == ("open", 4, "pending")
    assert _session(gw, key, "run-2").json()["slo"] == {"target_ms": 1.0, "verdict": "missed"}

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def metric(name: str, **labels: str) -> float:
        text = httpx.get(gw.root + "/metrics", headers=auth, timeout=10).text
        total = 0.0
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            series, _, label_text = head.partition("{")
            if series == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

    deadline = time.monotonic() + 15
    while metric("switchyard_session_calls_count", tenant="agentic") < 2:
        assert time.monotonic() < deadline, "the sessions never ended"
        time.sleep(0.1)
    assert metric("switchyard_session_calls_sum", tenant="agentic") == 6
    assert metric("switchyard_sessions_total", tenant="agentic", slo="met") == 1
    assert metric("switchyard_sessions_total", tenant="agentic", slo="missed") == 1
    assert metric("switchyard_session_duration_seconds_count", tenant="agentic") == 2
    ended = _session(gw, key, "run-1").json()
    assert (ended["status"], ended["slo"]) == ("ended", {"target_ms": 60000.0, "verdict": "met"})
    run_1 = [r for r in gw.records("agentic", 6) if r["session_id"] == "run-1"]
    assert ended["usage"]["completion_tokens"] == sum(r["completion_tokens"] for r in run_1)
    assert ended["wall_time_s"] == pytest.approx(  # rounded to the microsecond
        max(r["ended_at"] for r in run_1) - min(r["started_at"] for r in run_1), abs=1e-6
    )
    public = httpx.get(gw.root + "/metrics", timeout=10).text
    assert "switchyard_session" not in public  # tenant families need the admin token
