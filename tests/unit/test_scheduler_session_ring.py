"""Consistent hashing with bounded loads: stable homes, ~1/N moved, the bound held."""

from __future__ import annotations

from collections import Counter

from app.scheduler.session_ring import SessionRing

REPLICAS = [f"r{i}" for i in range(8)]


def test_keys_spread_and_a_leaving_replica_moves_only_its_keys() -> None:
    ring = SessionRing(virtual_nodes=100, epsilon=0.25)
    ring.set_members(REPLICAS)
    idle = {r: 0.0 for r in REPLICAS}
    homes = {k: ring.owner(f"s{k}", idle) for k in range(4000)}
    counts = Counter(homes.values())
    assert set(counts) == set(REPLICAS) and max(counts.values()) < 2 * 4000 / 8
    ring.set_members(REPLICAS[1:])
    rest = REPLICAS[1:]
    after = {k: ring.owner(f"s{k}", {r: 0.0 for r in rest}) for k in range(4000)}
    moved = [k for k in homes if after[k] != homes[k]]
    assert all(homes[k] == "r0" for k in moved)
    assert abs(len(moved) / 4000 - 1 / 8) < 0.05


def test_a_replica_at_its_bound_passes_the_key_on() -> None:
    ring = SessionRing(virtual_nodes=50, epsilon=0.25)
    ring.set_members(["a", "b"])
    home = ring.owner("s", {"a": 0.0, "b": 0.0})
    other = "b" if home == "a" else "a"
    loads = {home: 3.0, other: 0.0}  # bound = ceil(1.25 * 4 / 2) = 3: home is full
    assert ring.owner("s", loads) == other
    loads = {home: 1.0, other: 0.0}  # bound = ceil(1.25 * 2 / 2) = 2: home takes it
    assert ring.owner("s", loads) == home


def test_only_candidates_on_the_ring_count() -> None:
    ring = SessionRing()
    ring.set_members(["a", "b"])
    assert ring.owner("s", {"c": 0.0}) is None
    assert ring.owner("s", {"b": 0.0, "c": 0.0}) == "b"
