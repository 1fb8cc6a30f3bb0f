"""A router's KV-event feed over real ZMQ sockets: a replica's simulated engine
publishes what its prefix cache stores, in vLLM's framing, and the router's feed
delivers it, translated into the prompt's own block hashes; gaps are counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from app.engine.factory import SimulatedEngineConfig
from app.engine.kv_events import BlockStored, KvEvent, KvEventBatch, encode_batch
from app.engine.kv_publisher import ZmqKvPublisher
from app.engine.simulated import SimulationProfile
from app.scheduler import kv_feed
from app.scheduler.blocks import chain_hashes
from app.scheduler.kv_events import Translator
from app.scheduler.kv_feed import KvEventFeed
from app.serving.llm_server import LLMServer, free_port
from tests.request_helpers import inference

PROFILE = SimulationProfile(
    max_model_len=512, prefill_s_per_token=0.0, decode_base_s=0.0, block_size=16
)  # fmt: skip


@pytest.fixture
def feed() -> Iterator[KvEventFeed]:
    f = KvEventFeed()
    yield f
    f.close()


def _wait(feed: KvEventFeed, seconds: float = 5.0) -> list[tuple[str, list[KvEvent]]]:
    deadline = time.monotonic() + seconds
    got: list[tuple[str, list[KvEvent]]] = []
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
        got = feed.drain()
    return got


def _root(n: int) -> BlockStored:
    return BlockStored(block_hashes=[n], parent_block_hash=None, token_ids=[n], block_size=1)


def test_batches_arrive_in_order_and_gaps_are_counted(feed: KvEventFeed) -> None:
    port = free_port()
    pub = ZmqKvPublisher(port)
    try:
        feed.follow("r0", f"tcp://127.0.0.1:{port}")
        got: list[tuple[str, list[KvEvent]]] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:  # ZMQ's slow joiner: until heard
            pub.publish([_root(0)])
            got = _wait(feed, 0.1)
        assert got[0][0] == "r0" and isinstance(got[0][1][0], BlockStored)
        lost_before = feed.lost
        pub.seq += 3  # three batches that never reach the subscriber
        pub.publish([_root(1)])
        pub.publish([_root(2)])
        got = _wait(feed)
        while len(got) < 2:
            got += _wait(feed)
        assert [e[1][0].block_hashes for e in got[-2:]] == [[1], [2]]  # type: ignore[union-attr]
        assert feed.lost - lost_before == 3
        feed.unfollow("r0")
        assert feed.following("r0") is None and feed.followed() == []
    finally:
        pub.close()


async def test_a_replica_advertises_its_engine_events_and_the_router_reads_the_prompt(
    feed: KvEventFeed,
) -> None:
    server = await LLMServer.create(
        SimulatedEngineConfig(served_name="sim", profile=PROFILE, publish_kv_events=True),
        warm=False,
    )
    try:
        endpoint = server.record_routing_stats()["kv_events"]
        assert endpoint.startswith("tcp://")
        feed.follow("r0", endpoint)
        await asyncio.sleep(0.3)  # let the subscription reach the publisher
        ids = tuple(range(1, 70))  # four full 16-token blocks
        request = replace(inference("a", prompt_token_ids=ids, max_tokens=1), cache_salt="acme")
        async for _ in server.generate(request):
            pass
        got = await asyncio.to_thread(_wait, feed)
        translator = Translator(PROFILE.block_size)
        stored = [h for _, events in got for h in translator.apply(events).stored]
        assert stored == list(chain_hashes(ids, PROFILE.block_size, "acme"))
    finally:
        await server.shutdown()


async def test_without_precise_routing_a_replica_advertises_nothing() -> None:
    server = await LLMServer.create(SimulatedEngineConfig(served_name="sim"), warm=False)
    try:
        assert server.record_routing_stats() == {}
    finally:
        await server.shutdown()


def test_an_undrained_feed_keeps_the_newest_batches_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_feed, "MAX_READY", 3)
    feed = KvEventFeed()
    next_seq: dict[str, int] = {}
    for n in range(5):
        payload = encode_batch(KvEventBatch(ts=0.0, events=[_root(n)]))
        feed._receive("r0", [b"", n.to_bytes(8, "big"), payload], next_seq)
    kept = [events[0].block_hashes for _, events in feed.drain()]  # type: ignore[union-attr]
    assert kept == [[2], [3], [4]] and feed.dropped == 2 and feed.lost == 0
