"""The approximate prefix index: leading matches only, LRU bound per replica."""

from __future__ import annotations

from app.scheduler.blocks import chain_hashes
from app.scheduler.prefix_index import PrefixIndex


def chain(start: int, blocks: int) -> list[int]:
    return list(chain_hashes(list(range(start, start + 4 * blocks)), 4))


def test_a_match_counts_leading_blocks_and_stops_at_the_first_miss() -> None:
    index = PrefixIndex(max_blocks=100)
    a = chain(0, 6)
    index.insert("r0", a[:4])
    assert index.match("r0", a) == 4
    assert index.match("r1", a) == 0
    assert index.match("r0", chain(1, 6)) == 0  # another prompt from its first token
    index.insert("r0", [a[5]])  # a later block alone does not extend the run
    assert index.match("r0", a) == 4


def test_the_oldest_blocks_go_first_when_a_replica_is_full() -> None:
    index = PrefixIndex(max_blocks=5)
    old, new = chain(0, 3), chain(100, 3)
    index.insert("r0", old)
    index.insert("r0", old[:1])  # touched: the first block is the newest of old's now
    index.insert("r0", new)
    assert index.size("r0") == 5
    assert index.match("r0", new) == 3
    assert index.match("r0", old) == 2  # its tail went first: the head survived


def test_a_replica_that_leaves_is_forgotten() -> None:
    index = PrefixIndex(max_blocks=10)
    index.insert("r0", chain(0, 2))
    index.insert("r1", chain(0, 3))
    index.drop("r0")
    assert index.size() == 3 and index.replicas() == ["r1"]


def test_match_all_walks_once_for_every_candidate() -> None:
    index = PrefixIndex(max_blocks=100)
    a = chain(0, 8)
    index.insert("r0", a)
    index.insert("r1", a[:3])
    index.insert("r2", chain(500, 8))
    assert index.match_all(a, ["r0", "r1", "r2", "r3"]) == {"r0": 8, "r1": 3, "r2": 0, "r3": 0}
    assert index.match_all([], ["r0"]) == {"r0": 0}


def test_the_total_size_follows_inserts_evictions_removals_and_drops() -> None:
    index = PrefixIndex(max_blocks=5)
    index.insert("a", [1, 2, 3])
    index.insert("b", [1, 2])
    index.insert("a", [3, 4, 5, 6, 7])  # 7 distinct on a: two evicted
    index.remove("a", [7, 99])
    index.remove("ghost", [1])
    assert index.size() == index.size("a") + index.size("b") == 4 + 2
    index.drop("b")
    assert index.size() == index.size("a") == 4
    assert index.match_all([1, 2], ["a", "b"]) == {"a": 0, "b": 0}  # 1, 2 went first
