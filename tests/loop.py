"""A test helper: how often the event loop turned while an awaitable ran. Work done on
the loop (a long parse, a tokenizer) lets it turn not at all; work on a thread lets it
turn freely — a count, not a timing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def turns_during(awaitable: Awaitable[T]) -> tuple[T, int]:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = ticks
    try:
        result = await awaitable
    finally:
        during = ticks - start
        done.set()
        await task
    return result, during
