"""This ingress replica's queue per pool (app.fairness.pools): caps from the pool's slots
and replicas over the ingress replicas, and following a changed pool."""

from __future__ import annotations

import asyncio

from app.fairness.pools import FairQueues
from app.fairness.queue import PoolQueue, QueueSettings, Ticket
from app.fairness.token_caps import TokenCaps
from app.state.records import Priority


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _enter(q: PoolQueue, tenant: str, band: Priority = "standard"
                 ) -> tuple[Ticket, asyncio.Task[None]]:  # fmt: skip
    ticket = q.ticket(tenant, band, 10)
    task = asyncio.create_task(ticket.wait())
    await _settle()
    return ticket, task


async def test_fair_queues_cap_a_pool_by_its_slots_over_the_ingress_replicas() -> None:
    made: list[str] = []
    fq = FairQueues(ingress_replicas=3, on_new=lambda pool, q: made.append(pool))
    assert fq.of("upstream", None) is None
    q = fq.of("chat", 8)
    assert q is not None and q.cap == 3  # ceil(8 / 3)
    assert fq.of("chat", 8) is q and made == ["chat"]
    await _enter(q, "A")
    await _enter(q, "A")
    await _enter(q, "A")
    _, waiting = await _enter(q, "A")
    assert not waiting.done()
    assert fq.of("chat", 12) is q and q.cap == 4  # more slots: the waiter starts
    await _settle()
    assert waiting.done()


def test_fair_queues_set_a_pools_token_caps_from_its_replicas_and_follow_changes() -> None:
    settings = QueueSettings(max_prefill_tokens=1000, max_kv_tokens=10_000)
    fq = FairQueues(settings, ingress_replicas=2)
    q = fq.of("chat", 16, replicas=2)
    assert q is not None and q.tokens.caps == TokenCaps(1000, 10_000)
    assert fq.of("chat", 32, replicas=4) is q and q.tokens.caps == TokenCaps(2000, 20_000)
    plain = FairQueues().of("chat", 16, replicas=2)
    assert plain is not None and plain.tokens.caps == TokenCaps()  # none set: no caps


async def test_the_headroom_follows_the_cap_when_the_pool_changes() -> None:
    fq = FairQueues(ingress_replicas=1)
    q = fq.of("chat", 20)
    assert q is not None and q.headroom == 1
    assert fq.of("chat", 60) is q and q.headroom == 3
