"""The simulated server's stall rule (app.bench.simstall), without HTTP, in virtual
time (app.bench.virtual_time): a stall holds waiters until it ends, exactly, and a
later stall extends it, never shortens it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from app.bench.simstall import Stall
from app.bench.virtual_time import VirtualTime


async def _until_done(vt: VirtualTime, work: Awaitable[object]) -> None:
    task = asyncio.ensure_future(work)
    while not task.done():
        await vt.run(task.done)
    await task


async def test_no_stall_does_not_wait() -> None:
    vt = VirtualTime()
    stall = Stall(vt, vt.sleep)
    assert stall.remaining() == 0
    await _until_done(vt, stall.wait())
    assert stall.start(0) == 0  # a zero stall holds nothing
    await _until_done(vt, stall.wait())
    assert vt.now == 0.0


async def test_stall_holds_waiters_until_it_ends() -> None:
    vt = VirtualTime()
    stall = Stall(vt, vt.sleep)
    assert stall.start(0.1) == 0.1
    await _until_done(vt, asyncio.gather(stall.wait(), stall.wait()))  # one event, all
    assert vt.now == 0.1
    assert stall.remaining() == 0


async def test_later_stall_extends_never_shortens() -> None:
    vt = VirtualTime()
    stall = Stall(vt, vt.sleep)
    stall.start(0.2)
    until = stall.until
    assert stall.start(0.05) == 0.2 and stall.until == until  # shorter: unchanged
    assert stall.start(0.3) == 0.3 and stall.until == 0.3  # longer: extended
    await _until_done(vt, stall.wait())
    assert vt.now == 0.3
