"""The engine's adapter book: stable ids, one load for concurrent first requests, cold
loads counted and timed, what the engine holds as last seen; the lora: block's checks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from pydantic import ValidationError

from app.engine.lora import AdapterBook, LoraSettings


class FakeEngineCache:
    """vLLM's host-memory adapter cache, reduced to a set of ids (LRU beyond ``size``)."""

    def __init__(self, size: int) -> None:
        self.size, self.ids, self.adds = size, list[int](), 0

    async def held(self) -> list[int]:
        await asyncio.sleep(0)
        return list(self.ids)

    def loader(self, lora_id: int) -> Callable[[], Awaitable[None]]:
        async def load() -> None:
            await asyncio.sleep(0.01)  # a load takes time: concurrent requests overlap it
            self.adds += 1
            self.ids = [*self.ids, lora_id][-self.size :]

        return load


def test_ids_are_stable_positive_and_distinct_per_files() -> None:
    book = AdapterBook()
    assert [book.id_for(n, "/a") for n in ("m:a", "m:b", "m:a")] == [1, 2, 1]
    assert book.id_for("m:a", "/other") == 3  # registered again from other files


def test_concurrent_first_requests_load_once_and_later_ones_are_warm() -> None:
    book, cache = AdapterBook(), FakeEngineCache(size=2)
    ticks = iter(range(100))

    async def one(name: str) -> float | None:
        load = cache.loader(book.id_for(name, "/a"))
        return await book.ensure(name, "/a", cache.held, load, lambda: next(ticks))

    async def scenario() -> list[float | None]:
        first = await asyncio.gather(*(one("m:a") for _ in range(5)))
        return [*first, await one("m:a")]

    loaded = asyncio.run(scenario())
    assert [s for s in loaded if s is not None] == [1] and loaded[-1] is None
    assert (cache.adds, book.loads_total, book.held) == (1, 1, ("m:a",))
    assert book.load_seconds_total == 1  # the clock ticked once around the one load


def test_an_evicted_adapter_is_cold_again() -> None:
    book, cache = AdapterBook(), FakeEngineCache(size=1)

    async def one(name: str) -> bool:
        load = cache.loader(book.id_for(name, "/a"))
        return await book.ensure(name, "/a", cache.held, load, lambda: 0.0) is not None

    async def scenario() -> list[bool]:
        return [await one(n) for n in ("m:a", "m:b", "m:a", "m:a")]

    assert asyncio.run(scenario()) == [True, True, True, False]
    assert book.held == ("m:a",) and book.loads_total == 3


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"max_lora_rank": 12}, "max_lora_rank must be one of"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras must be at least max_loras"),
        ({"max_loras": 0}, "greater than or equal to 1"),
        ({"rank": 8}, "Extra inputs are not permitted"),
    ],
)
def test_the_lora_block_refuses_what_vllm_would_refuse(fields: dict[str, int], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        LoraSettings.model_validate(fields)


def test_the_lora_block_becomes_vllm_engine_arguments() -> None:
    args = LoraSettings(max_loras=2, max_cpu_loras=3, max_lora_rank=8).vllm_args()
    assert args == {"enable_lora": True, "max_loras": 2, "max_cpu_loras": 3, "max_lora_rank": 8}
