"""The fair queue of a saturated pool (app.fairness.queue): slots, bands, VTC order,
shedding and its reasons, cancellation, Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.protocol import EngineLoad
from app.fairness.queue import PoolQueue, QueueSettings, Shed, Ticket
from app.fairness.token_caps import TokenCaps
from app.state.records import Priority


async def _settle() -> None:
    """Let every hand-off finish (a granted slot reaches its waiter in a few turns)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _enter(q: PoolQueue, tenant: str, band: Priority = "standard", prompt: int = 10,
                 share: float = 1.0, output: int = 0,
                 ) -> tuple[Ticket, asyncio.Task[None]]:  # fmt: skip
    ticket = q.ticket(tenant, band, prompt, share, output)
    task = asyncio.create_task(ticket.wait())
    await _settle()
    return ticket, task


async def _serve_in_turn(q: PoolQueue, tickets: list[tuple[str, Ticket]]) -> list[str]:
    """Let one request finish at a time; the names in the order they got their slot."""
    order: list[str] = []
    running = [(n, t) for n, t in tickets if t.started is not None]
    while running:
        name, ticket = running.pop(0)
        order.append(name)
        ticket.leave(0)
        await _settle()
        running += [(n, t) for n, t in tickets
                    if t.started is not None and not t.left and (n, t) not in running]  # fmt: skip
    return order


async def test_under_the_cap_a_request_starts_at_once_and_over_it_waits() -> None:
    q = PoolQueue(cap=2)
    a, ta = await _enter(q, "a")
    _, tb = await _enter(q, "a")
    c, tc = await _enter(q, "a")
    assert ta.done() and tb.done() and not tc.done()
    assert (q.running, q.waiting()) == (2, 1)
    a.leave()
    await _settle()
    assert tc.done() and c.started is not None
    assert (q.running, q.waiting()) == (2, 0)
    a.leave()  # twice changes nothing
    assert q.running == 2


async def test_a_flooding_tenant_is_interleaved_with_a_light_one_by_counter() -> None:
    """Cap 1, 10 prompt tokens each: A1 runs, A2..A6 then B1, B2 wait. B arrives lifted to
    A's counter; ties go to the earlier arrival. FIFO would be A1..A6, B1, B2."""
    q = PoolQueue(cap=1)
    tickets = []
    for name in ("A1", "A2", "A3", "A4", "A5", "A6", "B1", "B2"):
        ticket, _ = await _enter(q, name[0])
        tickets.append((name, ticket))
    order = await _serve_in_turn(q, tickets)
    assert order == ["A1", "A2", "B1", "A3", "B2", "A4", "A5", "A6"]
    # 6 requests of 10 weighted tokens; B's 2 on top of the 10 it was lifted to
    assert (q.counter("A"), q.counter("B")) == (60, 30)


@pytest.mark.parametrize(
    ("shares", "want"),
    [
        ({"A": 1.0, "B": 1.0}, ["A0", "A1", "B1", "A2", "B2", "A3", "B3", "B4"]),
        # B's share 3: its counter grows a third as fast, so it runs three for A's one
        ({"A": 1.0, "B": 3.0}, ["A0", "A1", "B1", "B2", "B3", "A2", "B4", "A3"]),
    ],
)
async def test_shares_weight_the_order(shares: dict[str, float], want: list[str]) -> None:
    q = PoolQueue(cap=1)
    tickets = []
    for name in ("A0", "A1", "A2", "A3", "B1", "B2", "B3", "B4"):
        ticket, _ = await _enter(q, name[0], share=shares[name[0]])
        tickets.append((name, ticket))
    assert await _serve_in_turn(q, tickets) == want


async def test_output_tokens_charged_at_the_end_move_a_tenant_back() -> None:
    q = PoolQueue(cap=1, settings=QueueSettings(input_weight=1, output_weight=2))
    a, _ = await _enter(q, "A", prompt=10)
    b, _ = await _enter(q, "B", prompt=10)
    a2, _ = await _enter(q, "A", prompt=10)
    a.leave(output_tokens=100)  # A: 10 + 200
    await _settle()
    assert b.started is not None and a2.started is None
    assert a.service == 210 and q.counter("A") == 210


async def test_a_higher_band_goes_first_whatever_the_counters() -> None:
    q = PoolQueue(cap=1)
    first, _ = await _enter(q, "A")
    batch, _ = await _enter(q, "B", band="batch")
    standard, _ = await _enter(q, "B", band="standard")
    interactive, _ = await _enter(q, "A", band="interactive")
    order = await _serve_in_turn(
        q, [("first", first), ("batch", batch), ("standard", standard), ("inter", interactive)]
    )
    assert order == ["first", "inter", "standard", "batch"]


async def test_a_tenant_past_its_fair_part_of_the_queue_gets_429_over_share() -> None:
    q = PoolQueue(cap=1, settings=QueueSettings(max_waiting=5))
    await _enter(q, "A")  # runs
    await _enter(q, "A")
    await _enter(q, "A")  # A alone waits 2: the whole queue is its part
    _, alone = await _enter(q, "A")
    assert not alone.done()  # 3 waiting, no one else: not over its share
    await _enter(q, "B")
    _, over = await _enter(q, "A")  # A's part with B waiting: ceil(5 × 1/2) = 3, it has 3
    with pytest.raises(Shed) as shed:
        await over
    assert (shed.value.status, shed.value.reason) == (429, "over_share")
    _, b2 = await _enter(q, "B")  # B has 1 waiting of its 3
    assert not b2.done()
    assert q.shed == {("standard", "over_share"): 1}


async def test_a_full_queue_sheds_batch_first_then_the_arrival_with_503() -> None:
    q = PoolQueue(cap=1, settings=QueueSettings(max_waiting=2))
    await _enter(q, "A")  # runs
    _, old_batch = await _enter(q, "A", band="batch")
    _, new_batch = await _enter(q, "B", band="batch")
    _, standard = await _enter(q, "C")  # full: takes the newest batch waiter's place
    assert new_batch.done() and not old_batch.done() and not standard.done()
    with pytest.raises(Shed) as evicted:
        await new_batch
    assert (evicted.value.status, evicted.value.reason) == (503, "pool_full")
    _, batch_arrival = await _enter(q, "D", band="batch")  # full again: a batch arrival goes
    with pytest.raises(Shed):
        await batch_arrival
    _, evicts = await _enter(q, "E")  # evicts the old batch waiter
    with pytest.raises(Shed):
        await old_batch
    _, nothing_left = await _enter(q, "F")  # no batch left to shed: the arrival itself
    with pytest.raises(Shed) as full:
        await nothing_left
    assert full.value.reason == "pool_full" and full.value.band == "standard"
    assert not standard.done() and not evicts.done()
    assert q.shed == {("batch", "pool_full"): 3, ("standard", "pool_full"): 1}


async def test_a_wait_past_max_wait_s_is_503_queue_timeout() -> None:
    q = PoolQueue(cap=1, settings=QueueSettings(max_wait_s=0.05))
    await _enter(q, "A")
    ticket, waiting = await _enter(q, "B")
    with pytest.raises(Shed) as shed:
        await waiting
    assert (shed.value.status, shed.value.reason) == (503, "queue_timeout")
    assert q.waiting() == 0 and ticket.started is None
    assert ticket.note(shed.value).shed == "queue_timeout"


async def test_a_cancelled_waiter_leaves_the_queue_and_a_cancelled_starter_its_slot() -> None:
    q = PoolQueue(cap=1)
    running, _ = await _enter(q, "A")
    gone, gone_task = await _enter(q, "B")
    nxt, nxt_task = await _enter(q, "C")
    gone_task.cancel()
    await _settle()
    assert q.waiting() == 1
    running.leave()
    await _settle()
    assert nxt_task.done() and gone.started is None and nxt.started is not None
    # granted and cancelled in the same turn: the slot goes back
    late, late_task = await _enter(q, "D")
    nxt.leave()  # grants D's future ...
    late_task.cancel()  # ... as its client leaves
    with pytest.raises(asyncio.CancelledError):
        await late_task
    assert late.left and q.running == 0


async def test_retry_after_grows_with_the_queue_and_is_at_least_one_second() -> None:
    clock = [0.0]
    q = PoolQueue(2, QueueSettings(headroom=0), clock=lambda: clock[0])  # both slots open
    a, _ = await _enter(q, "A")
    clock[0] = 4.0
    a.leave()  # held 4 s: the mean hold moves from 1 s toward it
    assert q.retry_after_s() == pytest.approx((0 + 1) / 2 * 1.3)
    for _ in range(6):
        await _enter(q, "B")
    assert q.waiting() == 4
    assert q.retry_after_s() == pytest.approx((4 + 1) / 2 * 1.3)
    assert Shed("pool_full", "standard", 0.2).retry_after_s == 1


def test_a_pool_needs_a_slot() -> None:
    with pytest.raises(ValueError):
        PoolQueue(cap=0)


async def test_the_headroom_is_kept_for_a_tenant_under_its_part_not_for_the_flood() -> None:
    """Cap 20, headroom round(0.05 × 20) = 1. With B active, A's fair part is 10: A fills
    19 slots, its next waits; B's next takes the last slot at once, though A waits."""
    q = PoolQueue(cap=20)
    assert q.headroom == 1
    await _enter(q, "B")
    flood = [await _enter(q, "A") for _ in range(19)]
    assert [t.done() for _, t in flood] == [True] * 18 + [False]
    b2, b2_task = await _enter(q, "B")
    assert b2_task.done() and b2.started is not None
    assert (q.running, q.waiting()) == (20, 1)


async def test_alone_a_tenant_may_use_every_slot_but_batch_never_the_headroom() -> None:
    q = PoolQueue(cap=20)
    alone = [await _enter(q, "A") for _ in range(20)]
    assert all(t.done() for _, t in alone)
    batch = PoolQueue(cap=20)
    flood = [await _enter(batch, "X", band="batch") for _ in range(20)]
    assert [t.done() for _, t in flood] == [True] * 19 + [False]


async def test_a_tenant_that_just_left_still_counts_for_the_headroom() -> None:
    """B's request ended a moment ago: A may not take the headroom as if alone."""
    clock = [0.0]
    q = PoolQueue(cap=20, clock=lambda: clock[0])
    b, _ = await _enter(q, "B")
    b.leave()
    flood = [await _enter(q, "A") for _ in range(20)]
    assert [t.done() for _, t in flood] == [True] * 19 + [False]
    clock[0] = 10.0  # two mean holds (1 s each) later B is forgotten
    late = PoolQueue(cap=20, clock=lambda: clock[0])
    b, _ = await _enter(late, "B")
    b.leave()
    clock[0] = 13.0
    assert all(t.done() for _, t in [await _enter(late, "A") for _ in range(20)])


@pytest.mark.parametrize(("sigmas", "batch_slots", "c_at_once"),
                         [(None, 5, False), (1.0, 4, True), (2.0, 2, True)])  # fmt: skip
async def test_the_free_slots_kept_grow_with_the_light_demand(
    sigmas: float | None, batch_slots: int, c_at_once: bool
) -> None:
    """Cap 10, headroom 1. B has held 4 slots for 100 s (D = 4): batch may start only while
    more than R = max(1, round(4 + z·2) − 4) stay free. Of 6 free slots batch takes 5 with
    the fixed headroom, 4 at z = 1 (R = 2), 2 at z = 2 (R = 4). B's next request starts
    at once in each; a new light tenant C's then finds a slot only where R was above 1."""
    clock = [0.0]
    q = PoolQueue(10, QueueSettings(headroom_sigmas=sigmas), clock=lambda: clock[0])
    for _ in range(4):
        await _enter(q, "B")
    clock[0] = 100.0
    flood = [await _enter(q, "X", band="batch") for _ in range(6)]
    assert sum(t.done() for _, t in flood) == batch_slots
    _, b5 = await _enter(q, "B")
    _, c1 = await _enter(q, "C")
    assert b5.done() and c1.done() == c_at_once


async def test_a_full_queue_of_one_tenant_makes_room_for_another_with_429_to_the_flood() -> None:
    """A alone filled the queue (no one else waited, so no over_share yet). B arrives: A
    is past its part (ceil(3 × 1/2) = 2 < 3), so A's newest waiter is shed with 429."""
    q = PoolQueue(cap=1, settings=QueueSettings(max_waiting=3))
    await _enter(q, "A")  # runs
    flood = [await _enter(q, "A") for _ in range(3)]
    _, b = await _enter(q, "B")
    assert [t.done() for _, t in flood] == [False, False, True] and not b.done()
    with pytest.raises(Shed) as shed:
        await flood[2][1]
    assert (shed.value.status, shed.value.reason) == (429, "over_share")
    _, a_again = await _enter(q, "A")  # now A is over its part on arrival
    with pytest.raises(Shed):
        await a_again
    assert q.shed == {("standard", "over_share"): 2}


class _Clock:
    """Virtual time for the engine caps' staleness: ``sleep`` returns once ``advance``
    has moved the clock past its end."""

    def __init__(self) -> None:
        self.now = 0.0
        self._moved = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self._moved.clear()
            await self._moved.wait()

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        self._moved.set()
        await _settle()


FULL = EngineLoad(running=4, waiting=3, kv_cache_usage=0.5)
ROOMY = EngineLoad(running=2, waiting=0, kv_cache_usage=0.5)


async def test_full_engines_hold_the_cap_at_what_runs_and_a_leave_lets_one_in() -> None:
    counted: list[str] = []
    q = PoolQueue(cap=4)
    q.engines.on_count = counted.append
    a, _ = await _enter(q, "A")
    a.observe("r1", FULL)  # its first delta: the engine is full
    _, tb = await _enter(q, "B")
    _, tc = await _enter(q, "C")
    assert (q.running, q.waiting()) == (1, 2) and not tb.done()  # 3 slots free, held
    a.leave()
    await _settle()
    assert tb.done() and not tc.done() and (q.running, q.waiting()) == (1, 1)
    q.observe("r1", FULL)  # still full: the hold stays
    assert q.engines.counts == {"held": 1, "stale": 0} and counted == ["held"]
    q.observe("r1", ROOMY)  # room again: everything under the cap starts
    await _settle()
    assert tc.done() and (q.running, q.waiting()) == (2, 0)


async def test_a_hold_without_newer_reports_lapses_after_stale_s_and_is_counted() -> None:
    """Fail open: nothing of this replica's runs or ends, the engines' reports age out,
    and the waiters start on the slots alone."""
    clock = _Clock()
    q = PoolQueue(cap=3, settings=QueueSettings(engine_stale_s=5.0), clock=clock, sleep=clock.sleep)
    a, _ = await _enter(q, "A")
    a.observe("r1", FULL)
    _, tb = await _enter(q, "B")
    await clock.advance(4.0)
    assert not tb.done()
    await clock.advance(1.5)
    assert tb.done() and q.running == 2
    assert q.engines.counts == {"held": 1, "stale": 1}


# ---- token caps ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caps", "prompts", "outputs", "started"),
    [
        # no caps: the slots alone (cap 8) decide
        (TokenCaps(), [100, 100, 100], [50, 50, 50], 3),
        # prefill 150: the first (100) is below, the second (200 pending) closes it
        (TokenCaps(prefill=150), [100, 100, 100], [0, 0, 0], 2),
        # prefill 100: the first request's 100 already reaches it
        (TokenCaps(prefill=100), [100, 100, 100], [0, 0, 0], 1),
        # KV 400: 150 reserved, then 300, then 450 ≥ 400 closes it
        (TokenCaps(kv=400), [100, 100, 100], [50, 50, 50], 3),
        (TokenCaps(kv=300), [100, 100, 100], [50, 50, 50], 2),
        # a request larger than the cap still starts on an idle pool
        (TokenCaps(prefill=10, kv=10), [500, 1], [500, 1], 1),
    ],
)
async def test_token_caps_let_a_request_start_only_below_them(
    caps: TokenCaps, prompts: list[int], outputs: list[int], started: int
) -> None:
    q = PoolQueue(cap=8, tokens=caps)
    tasks = [
        (await _enter(q, "A", prompt=p, output=o))[1] for p, o in zip(prompts, outputs, strict=True)
    ]
    assert sum(t.done() for t in tasks) == started
    assert (q.running, q.waiting()) == (started, len(prompts) - started)


async def test_a_first_token_ends_the_prefill_wait_and_a_leave_the_kv_reservation() -> None:
    q = PoolQueue(cap=8, tokens=TokenCaps(prefill=100, kv=500))
    a, _ = await _enter(q, "A", prompt=100, output=100)
    b, tb = await _enter(q, "B", prompt=100, output=100)
    assert not tb.done() and (q.tokens.pending_prefill, q.tokens.reserved_kv) == (100, 200)
    a.first_token()  # A's prompt is prefilled: B starts
    await _settle()
    assert tb.done() and (q.tokens.pending_prefill, q.tokens.reserved_kv) == (100, 400)
    a.first_token()  # once
    assert q.tokens.pending_prefill == 100
    b.first_token()
    c, tc = await _enter(q, "C", prompt=100, output=100)  # 400 reserved: below 500
    _, td = await _enter(q, "D", prompt=100, output=100)  # C's prefill and 600 KV: closed
    assert tc.done() and not td.done()
    c.first_token()  # the prefill opens; the KV (600 ≥ 500) does not
    await _settle()
    assert not td.done()
    a.leave(100)  # a leave returns its reservation (its prefill was counted off already)
    await _settle()
    assert td.done() and (q.running, q.tokens.pending_prefill, q.tokens.reserved_kv) == (
        3,
        100,
        600,
    )


async def test_a_request_that_leaves_before_its_first_token_returns_its_prefill() -> None:
    q = PoolQueue(cap=8, tokens=TokenCaps(prefill=50))
    a, _ = await _enter(q, "A", prompt=80)
    _, tb = await _enter(q, "B", prompt=80)
    assert not tb.done()
    a.leave()  # failed or cancelled before any token
    await _settle()
    assert tb.done() and q.tokens.pending_prefill == 80


@pytest.mark.parametrize(
    ("headroom", "cap", "kept"),
    [
        (0.05, 20, 1),  # round(1.0)
        (0.05, 60, 3),
        (0.05, 8, 1),  # round(0.4) = 0: at least one
        (0.05, 1, 0),  # a single slot is never kept back
        (0.0, 20, 0),  # off
        (0.5, 8, 4),
    ],
)
def test_the_headroom_is_a_share_of_the_cap_and_at_least_one_slot(
    headroom: float, cap: int, kept: int
) -> None:
    assert PoolQueue(cap, QueueSettings(headroom=headroom)).headroom == kept
