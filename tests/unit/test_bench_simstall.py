"""The simulated server's stall rule (app.bench.simstall), without HTTP: a stall holds
waiters until it ends, and a later stall extends it, never shortens it."""

from __future__ import annotations

import asyncio
import time

from app.bench.simstall import Stall


async def test_no_stall_does_not_wait() -> None:
    stall = Stall()
    assert stall.remaining() == 0
    await asyncio.wait_for(stall.wait(), 0.05)
    assert stall.start(0) == 0  # a zero stall holds nothing
    await asyncio.wait_for(stall.wait(), 0.05)


async def test_stall_holds_waiters_until_it_ends() -> None:
    stall = Stall()
    started = time.monotonic()
    assert 0 < stall.start(0.1) <= 0.1
    await asyncio.gather(stall.wait(), stall.wait())  # one shared event releases all
    assert time.monotonic() - started >= 0.1
    assert stall.remaining() == 0


async def test_later_stall_extends_never_shortens() -> None:
    stall = Stall()
    stall.start(0.2)
    until = stall.until
    assert stall.start(0.05) > 0.1 and stall.until == until  # shorter: unchanged
    started = time.monotonic()
    assert stall.start(0.3) > 0.2 and stall.until > until  # longer: extended
    await stall.wait()
    assert time.monotonic() - started >= 0.29
