"""``app.gateway.resend``: journaled settlements are re-sent until the store takes
them — a pass stops at the first failure (that entry goes to the back), a drain keeps
trying for its deadline and leaves the rest pending, a store answer wakes the loop."""

from __future__ import annotations

import asyncio

import pytest

from app.gateway.journal import Backoff, SettleJournal
from app.gateway.resend import Resender
from app.state.protocol import SettleRequest, StoreUnavailable
from tests.unit.test_gateway_journal import simple


class Store:
    """Takes settlements once ``up``; refuses ``refuse`` of them first."""

    def __init__(self, up: bool = True, refuse: int = 0) -> None:
        self.up, self.refuse = up, refuse
        self.taken: list[str] = []

    async def settle(self, s: SettleRequest) -> bool:
        if not self.up or self.refuse > 0:
            self.refuse -= 1
            raise StoreUnavailable("down")
        self.taken.append(s.admit.request_id)
        return True


def resender(store: Store, pending: list[int]) -> Resender:
    return Resender(
        SettleJournal(None, "r"), store.settle, 0.5, Backoff(initial_s=0.01, max_s=0.05),
        pending.append, lambda: None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("up", "refuse", "taken", "left"),
    [
        (True, 0, ["a", "b", "c"], 0),  # the store answers: everything written, in order
        (True, 1, ["b", "c", "a"], 0),  # the first refusal sends "a" to the back
        (False, 0, [], 3),  # down for the whole drain: all kept
    ],
)
async def test_drain_writes_what_the_store_takes_and_keeps_the_rest(
    up: bool, refuse: int, taken: list[str], left: int
) -> None:
    store, pending = Store(up, refuse), []
    r = resender(store, pending)
    for rid in ("a", "b", "c"):
        await r.add(simple(rid), StoreUnavailable("down"))
    await r.drain(0.3)
    assert store.taken == taken
    assert len(r.journal) == left and pending[-1] == left
    await r.close()


async def test_the_loop_sends_once_the_store_answers_again() -> None:
    store, pending = Store(up=False), []
    r = resender(store, pending)
    await r.add(simple("x"), StoreUnavailable("down"))  # starts the background loop
    await asyncio.sleep(0.05)
    assert store.taken == [] and len(r.journal) == 1
    store.up = True
    r.store_answered()
    for _ in range(100):
        if not r.journal:
            break
        await asyncio.sleep(0.01)
    assert store.taken == ["x"] and pending[-1] == 0
    await r.close()
