"""The session book of one ingress replica on a real SQLite store shared by two
replicas: refusals after a cancel, cancels reaching the other replica's calls through
the feed, idle sessions observed once into bounded metrics, failure policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.config import SessionsConfig
from app.observability.metrics import GatewayMetrics
from app.sessions.book import SessionBook, SessionCancelled
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    SessionKey,
    SettleRequest,
    StoreUnavailable,
)
from app.state.records import LedgerRecord
from app.state.redis_store import RedisStore
from app.state.sqlite_store import SqliteStore


class Replica:
    """One replica's book, with the calls it cancelled."""

    def __init__(self, path: Path, config: SessionsConfig, tenants: tuple[str, ...] = ()) -> None:
        self.store = SqliteStore(path)
        self.metrics = GatewayMetrics(["m"], tenants=tenants)
        self.cancelled: list[SessionKey] = []
        self.live = True  # the replica has a live session call
        self.book = SessionBook(
            self.store, config, self.metrics, cancel_calls=self._cancel,
            has_session_calls=lambda: self.live, store_timeout_s=0.5,
        )  # fmt: skip

    def _cancel(self, key: SessionKey) -> int:
        self.cancelled.append(key)
        return 2

    def value(self, name: str, **labels: str) -> float:
        got = self.metrics.tenant_registry.get_sample_value(name, labels)
        return 0.0 if got is None else got


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    config = SessionsConfig(idle_s=0.4, cancel_ttl_s=30, slo_ms=60_000)
    one = Replica(tmp_path / "s.db", config, tenants=("acme",))
    two = Replica(tmp_path / "s.db", config, tenants=("acme",))
    yield one, two
    for r in (one, two):
        await r.book.stop()
        await r.store.close()


async def record(store: SqliteStore, session: str, start: float, end: float) -> None:
    rec = LedgerRecord(
        request_id=f"{session}-{start}", session_id=session, tenant="acme",
        model_requested="m", endpoint="chat", status="ok", http_status=200,
        prompt_tokens=7, completion_tokens=3, e2e_s=end - start, started_at=start, ended_at=end,
    )  # fmt: skip
    await store.settle(SettleRequest(AdmitRequest(rec.request_id), AdmitResult(True), 10, 0, rec))


async def test_a_cancel_reaches_the_other_replicas_calls_and_refuses_new_ones(
    replicas: tuple[Replica, Replica],
) -> None:
    one, two = replicas
    two.book.start()
    await asyncio.sleep(0.2)  # its feed reader has its cursor
    await one.book.admit("acme", "s1")
    assert not await one.book.cancel("globex", "s1")  # another tenant has no such session
    assert await one.book.cancel("acme", "s1")
    assert one.cancelled == [SessionKey("acme", "s1")]  # its own calls at once
    deadline = time.monotonic() + 2.0
    while not two.cancelled and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert two.cancelled == [SessionKey("acme", "s1")]  # the other's through the feed
    assert two.book.cancelled_here(SessionKey("acme", "s1"))
    with pytest.raises(SessionCancelled) as refused:
        await two.book.admit("acme", "s1")
    assert refused.value.session_id == "s1"
    with pytest.raises(SessionCancelled) as stored:  # the store says so too
        await SessionBook(two.store, one.book.config, two.metrics, cancel_calls=lambda k: 0).admit(
            "acme", "s1"
        )
    assert stored.value.until is not None and stored.value.until > time.time() + 25
    await two.book.admit("globex", "s1")  # the same id in another tenant is untouched
    assert one.value("switchyard_session_cancels_total", tenant="acme") == 1
    assert two.value("switchyard_session_cancelled_calls_total", tenant="acme") == 2


async def _wait_cancelled(r: Replica, seconds: float) -> list[SessionKey]:
    deadline = time.monotonic() + seconds
    while not r.cancelled and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return r.cancelled


async def test_an_idle_replica_reads_no_feed_and_catches_up_when_a_session_call_starts(
    replicas: tuple[Replica, Replica],
) -> None:
    one, two = replicas
    two.live = False
    two.book.start()
    await asyncio.sleep(0.2)  # its cursor is taken at start-up, idle or not
    await one.book.admit("acme", "s1")
    assert await one.book.cancel("acme", "s1")
    assert await _wait_cancelled(two, 1.0) == []  # idle: the feed is not read
    two.live = True  # a session call started: the cancel made meanwhile is read
    assert await _wait_cancelled(two, 2.0) == [SessionKey("acme", "s1")]


async def test_tally_is_per_tenant(replicas: tuple[Replica, Replica]) -> None:
    one, _ = replicas
    assert await one.book.tally("acme", "s1") is None
    now = time.time()
    await record(one.store, "s1", now - 3, now - 2)
    await record(one.store, "s1", now - 2, now)
    t = await one.book.tally("acme", "s1")
    assert t is not None and (t.calls, t.prompt_tokens, t.completion_tokens) == (2, 14, 6)
    assert t.wall_s == pytest.approx(3.0) and t.slo_ms == 60_000
    assert await one.book.tally("globex", "s1") is None


async def test_idle_sessions_are_observed_once_across_replicas(
    replicas: tuple[Replica, Replica],
) -> None:
    one, two = replicas
    now = time.time()
    await record(one.store, "agent-1", now - 5, now - 4.0)
    await record(one.store, "agent-1", now - 4, now - 2.5)  # 2.5 s, within the SLO
    await record(one.store, "agent-2", now - 3, now - 2.0)
    await asyncio.sleep(0.1)
    closed = await asyncio.gather(one.book.close_idle(), two.book.close_idle())
    assert sorted(closed) == [0, 2]  # both sessions, each claimed by one replica
    total = {
        name: one.value(name, tenant="acme") + two.value(name, tenant="acme")
        for name in (
            "switchyard_session_calls_count",
            "switchyard_session_calls_sum",
            "switchyard_session_duration_seconds_sum",
        )
    }
    assert total["switchyard_session_calls_count"] == 2
    assert total["switchyard_session_calls_sum"] == 3
    assert total["switchyard_session_duration_seconds_sum"] == pytest.approx(3.5, abs=1e-3)
    met = one.value("switchyard_sessions_total", tenant="acme", slo="met") + two.value(
        "switchyard_sessions_total", tenant="acme", slo="met"
    )
    assert met == 2
    assert await one.book.close_idle() == 0  # once


async def test_an_unlisted_tenant_is_counted_as_other(tmp_path: Path) -> None:
    r = Replica(tmp_path / "s.db", SessionsConfig(idle_s=0.1))
    now = time.time()
    await record(r.store, "s", now - 2, now - 1)
    assert await r.book.close_idle() == 1
    assert r.value("switchyard_sessions_total", tenant="other", slo="none") == 1
    await r.store.close()


@pytest.mark.parametrize(("fail_open", "refused"), [(True, False), (False, True)])
async def test_store_failure_follows_the_gateway_policy(fail_open: bool, refused: bool) -> None:
    store = RedisStore("redis://127.0.0.1:9/0", timeout_s=0.2)  # nothing listens there
    metrics = GatewayMetrics(["m"])
    book = SessionBook(
        store, SessionsConfig(), metrics, cancel_calls=lambda k: 0, fail_open=fail_open
    )
    try:
        if refused:
            with pytest.raises(StoreUnavailable):
                await book.admit("acme", "s")
        else:
            await book.admit("acme", "s")  # served unchecked
        failures = metrics.registry.get_sample_value(
            "switchyard_state_store_failures_total", {"op": "session"}
        )
        assert failures == 1
    finally:
        await store.close()
