"""Prefix cache of the simulated engine: chained block hashes and LRU order."""

from __future__ import annotations

import pytest

from app.engine.kv_events import BlockRemoved, BlockStored, KvEvent
from app.engine.simulated_cache import PrefixCache, block_hashes
from app.scheduler.blocks import chain_hashes
from app.scheduler.kv_events import Translator


@pytest.mark.parametrize(
    ("num_tokens", "block_size", "expected_blocks"),
    [(0, 4, 0), (3, 4, 0), (4, 4, 1), (11, 4, 2), (12, 4, 3), (5, 1, 5)],
)
def test_block_hashes_cover_only_full_blocks(
    num_tokens: int, block_size: int, expected_blocks: int
) -> None:
    assert len(block_hashes(list(range(num_tokens)), block_size)) == expected_blocks


def test_block_hash_names_the_whole_prefix() -> None:
    base = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    shared_head = block_hashes([1, 2, 3, 4, 9, 9, 9, 9], 4)
    other_head = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)

    assert base == block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)  # deterministic
    assert shared_head[0] == base[0]
    assert shared_head[1] != base[1]
    # Same second block, different first block: a different chain.
    assert other_head[1] != base[1]
    # The same block content at another position hashes differently.
    assert block_hashes([5, 6, 7, 8], 4)[0] != base[1]


def test_block_hashes_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)


def test_lookup_counts_only_the_leading_run() -> None:
    cache = PrefixCache(capacity_blocks=10)
    cache.insert([b"h0", b"h1", b"h2"])

    assert cache.lookup([b"h0", b"h1", b"h2", b"h3"]) == 3
    assert cache.lookup([b"h0", b"x1", b"h2"]) == 1
    assert cache.lookup([b"x0", b"h1", b"h2"]) == 0
    assert cache.lookup([]) == 0


# Each operation: ("insert" | "lookup", chain); expected LRU order, oldest first.
_LRU_CASES = {
    "insert keeps a chain's head most recent": (
        3,
        [("insert", [b"a0", b"a1"])],
        [b"a1", b"a0"],
    ),
    "oldest chain evicted tail first": (
        3,
        [("insert", [b"a0", b"a1"]), ("insert", [b"b0", b"b1"])],
        [b"a0", b"b1", b"b0"],
    ),
    "lookup hit refreshes": (
        3,
        [
            ("insert", [b"a0"]),
            ("insert", [b"b0"]),
            ("insert", [b"c0"]),
            ("lookup", [b"a0"]),
            ("insert", [b"d0"]),
        ],
        [b"c0", b"a0", b"d0"],
    ),
    "lookup miss does not refresh": (
        2,
        [
            ("insert", [b"a0"]),
            ("insert", [b"b0"]),
            ("lookup", [b"x0", b"a0"]),
            ("insert", [b"c0"]),
        ],
        [b"b0", b"c0"],
    ),
    "chain longer than capacity keeps its head": (
        3,
        [("insert", [b"a0", b"a1", b"a2", b"a3", b"a4"])],
        [b"a2", b"a1", b"a0"],
    ),
    "re-insert refreshes": (
        2,
        [("insert", [b"a0"]), ("insert", [b"b0"]), ("insert", [b"a0"])],
        [b"b0", b"a0"],
    ),
    "capacity zero caches nothing": (0, [("insert", [b"a0"])], []),
}


@pytest.mark.parametrize(
    ("capacity", "operations", "expected_order"),
    list(_LRU_CASES.values()),
    ids=list(_LRU_CASES),
)
def test_lru_order(
    capacity: int,
    operations: list[tuple[str, list[bytes]]],
    expected_order: list[bytes],
) -> None:
    cache = PrefixCache(capacity_blocks=capacity)
    for op, chain in operations:
        if op == "insert":
            cache.insert(chain)
        else:
            cache.lookup(chain)

    assert cache.lru_order() == expected_order
    assert len(cache) == len(expected_order)


def test_partly_evicted_chain_still_hits_on_its_prefix() -> None:
    cache = PrefixCache(capacity_blocks=4)
    chain_a = block_hashes(list(range(12)), 4)  # 3 blocks
    chain_b = block_hashes(list(range(100, 108)), 4)  # 2 blocks
    cache.insert(chain_a)
    cache.insert(chain_b)  # evicts chain_a's last block

    assert cache.evictions == 1
    assert chain_a[2] not in cache
    assert cache.lookup(chain_a) == 2
    assert cache.lookup(chain_b) == 2


def test_negative_capacity_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixCache(capacity_blocks=-1)


def test_the_cache_reports_stored_and_evicted_blocks_as_vllm_does() -> None:
    events: list[KvEvent] = []
    cache = PrefixCache(3, on_events=events.extend)
    ids = list(range(12))
    hashes = block_hashes(ids, 4, "salt")
    cache.insert(hashes[:2], ids, 4, "salt")
    cache.insert(hashes, ids, 4, "salt")  # one more block: only it is new
    stored_root, stored_tail = events
    assert isinstance(stored_root, BlockStored) and isinstance(stored_tail, BlockStored)
    assert (stored_root.block_hashes, stored_root.parent_block_hash) == (hashes[:2], None)
    assert stored_root.token_ids == ids[:8] and stored_root.extra_keys == [("salt",), None]
    assert (stored_tail.block_hashes, stored_tail.parent_block_hash) == ([hashes[2]], hashes[1])
    assert stored_tail.token_ids == ids[8:] and stored_tail.extra_keys == [None]
    events.clear()
    other = block_hashes([50, 51, 52, 53], 4)
    cache.insert(other, [50, 51, 52, 53], 4)  # full: the oldest block (the tail) goes
    assert isinstance(events[1], BlockRemoved) and events[1].block_hashes == [hashes[2]]


def test_a_router_translating_the_events_knows_the_prompts_chain() -> None:
    events: list[KvEvent] = []
    cache = PrefixCache(100, on_events=events.extend)
    ids = list(range(40))
    cache.insert(block_hashes(ids, 8, "t"), ids, 8, "t")
    assert Translator(8).apply(events).stored == list(chain_hashes(ids, 8, "t"))
