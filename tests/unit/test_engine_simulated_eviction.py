"""Eviction policies of the simulated prefix cache: victims on hand-made cache states."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from app.engine.kv_events import BlockRemoved, KvEvent
from app.engine.simulated import SimulationProfile
from app.engine.simulated_cache import PrefixCache
from app.engine.simulated_eviction import (
    EVICTION_POLICIES,
    Candidate,
    EvictionName,
    EvictionPolicy,
    EvictionWeights,
    Lru,
    PaidFirst,
    Weighted,
    make_policy,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chain(name: str, n: int) -> list[bytes]:
    """``n`` block hashes of one chain (distinct per name)."""
    return [f"{name}{i}".encode() for i in range(n)]


PAID = frozenset({"paid"})
# (name, blocks, owner, inserted at): inserted oldest first.
STATE = [
    ("old_free_mid", 3, "free", 0.0),
    ("paid_long", 5, "paid", 1.0),
    ("free_short", 1, "free", 2.0),
    ("paid_short", 1, "paid", 3.0),
]


def build(
    policy_name: EvictionName, weights: EvictionWeights | None = None
) -> tuple[PrefixCache, Clock]:
    clock = Clock()
    policy = make_policy(policy_name, weights=weights, paid=PAID, block_size=16)
    cache = PrefixCache(sum(n for _, n, _, _ in STATE), policy=policy, clock=clock)
    for name, n, owner, at in STATE:
        clock.now = at
        cache.insert(chain(name, n), owner=owner)
    clock.now = 10.0
    return cache, clock


@pytest.mark.parametrize(
    ("policy", "weights", "victim"),
    [
        ("lru", None, b"old_free_mid2"),
        ("largest_first", None, b"paid_long4"),
        ("cheapest_recompute_first", None, b"free_short0"),  # ties: the LRU one
        ("paid_first", None, b"old_free_mid2"),
        ("weighted", EvictionWeights(idle=1, size=0, recompute_inverse=0, priority_inverse=0),
         b"old_free_mid2"),
        ("weighted", EvictionWeights(idle=0, size=1, recompute_inverse=0, priority_inverse=0),
         b"paid_long4"),
        ("weighted", EvictionWeights(idle=0, size=0, recompute_inverse=1, priority_inverse=0),
         b"free_short0"),
        ("weighted", EvictionWeights(idle=0, size=0, recompute_inverse=0, priority_inverse=1),
         b"old_free_mid2"),
        # Seed weights: old_free_mid scores 0.775, paid_long 0.517 (see the next test).
        ("weighted", None, b"old_free_mid2"),
    ],
)  # fmt: skip
def test_each_policy_evicts_the_expected_tail(
    policy: EvictionName, weights: EvictionWeights | None, victim: bytes
) -> None:
    cache, _ = build(policy, weights)
    cache.insert(chain("new", 1), owner="free")  # one over capacity: one eviction
    assert cache.evictions == 1
    assert victim not in cache
    assert len(cache) == cache.capacity_blocks
    # Only a tail went: every other chain still hits in full.
    name = victim.decode().rstrip("0123456789")
    n = next(k for nm, k, _, _ in STATE if nm == name)
    assert cache.lookup(chain(name, n)) == n - 1


def test_weighted_scores_are_the_seed_formula() -> None:
    cache, clock = build("weighted")
    policy = Weighted(EvictionWeights(), PAID, block_size=16)
    cands = cache.candidates()
    assert [c.block for c in cands] == [b"old_free_mid2", b"paid_long4", b"free_short0",
                                        b"paid_short0"]  # fmt: skip
    scores = policy.scores(cands, clock.now)
    # idle 10, 9, 8, 7 -> 1, 2/3, 1/3, 0; size 3, 5, 1, 1 -> 0.5, 1, 0, 0;
    # recompute inverse 0.5, 0, 1, 1; priority inverse 1, 0, 1, 0.
    expected = [
        0.40 * 1 + 0.25 * 0.5 + 0.20 * 0.5 + 0.15,
        0.40 * 2 / 3 + 0.25,
        0.40 / 3 + 0.20 + 0.15,
        0.20,
    ]
    assert scores == pytest.approx(expected)


def removed_into(out: list[bytes]) -> Callable[[list[KvEvent]], None]:
    def listen(events: list[KvEvent]) -> None:
        out.extend(
            h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes
            if isinstance(h, bytes)
        )  # fmt: skip

    return listen


@pytest.mark.parametrize("seed", range(5))
def test_weighted_idle_only_is_lru(seed: int) -> None:
    """Weights (1, 0, 0, 0) evict exactly what the LRU cache evicts, in the same order."""
    rng = random.Random(seed)
    idle_only = EvictionWeights(idle=1, size=0, recompute_inverse=0, priority_inverse=0)
    clock = Clock()
    removed: list[list[bytes]] = [[], []]
    lru = PrefixCache(12, on_events=removed_into(removed[0]), clock=clock)
    weighted = PrefixCache(
        12, on_events=removed_into(removed[1]), clock=clock,
        policy=make_policy("weighted", weights=idle_only),
    )  # fmt: skip
    for step in range(200):
        clock.now = float(step // 3)  # ties in time too
        hashes = chain(f"c{rng.randrange(8)}-", rng.randrange(1, 6))
        look = rng.random() < 0.5
        for cache in (lru, weighted):
            if look:
                cache.lookup(hashes)
            cache.insert(hashes, owner="free")
    assert removed[0] == removed[1]
    assert lru.lru_order() == weighted.lru_order()
    assert lru.evictions == weighted.evictions > 0


def test_lru_object_matches_the_default_path() -> None:
    plain, with_obj = PrefixCache(6), PrefixCache(6, policy=Lru())
    for name, n in [("a", 3), ("b", 2), ("a", 3), ("c", 4), ("d", 2), ("b", 2)]:
        for cache in (plain, with_obj):
            cache.insert(chain(name, n))
    assert plain.lru_order() == with_obj.lru_order()


@dataclass
class Spy:
    """Records what a policy was offered and what it chose."""

    inner: EvictionPolicy
    seen: list[tuple[list[Candidate], bytes]] = field(default_factory=list)
    name: str = "spy"

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        out = self.inner.victim(candidates, now)
        self.seen.append((list(candidates), out))
        return out


def test_paid_first_never_evicts_paid_while_free_is_evictable() -> None:
    rng = random.Random(3)
    spy = Spy(PaidFirst(PAID))
    cache = PrefixCache(20, policy=spy)
    for _ in range(300):
        owner = "paid" if rng.random() < 0.4 else "free"
        cache.insert(chain(f"{owner}{rng.randrange(10)}-", rng.randrange(1, 5)), owner=owner)
    assert len(spy.seen) == cache.evictions > 50
    owner_of = {c.block: c.owner for cands, _ in spy.seen for c in cands}
    paid_victims = 0
    for cands, victim in spy.seen:
        if owner_of[victim] == "paid":
            paid_victims += 1
            assert all(c.owner == "paid" for c in cands)
        else:  # LRU within the free class
            assert victim == next(c.block for c in cands if c.owner == "free")
    assert paid_victims > 0  # the case was exercised


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_capacity_is_never_exceeded(policy: EvictionName) -> None:
    rng = random.Random(11)
    cache = PrefixCache(16, policy=make_policy(policy, paid=PAID, block_size=16), clock=Clock())
    for _ in range(400):
        owner = rng.choice(["paid", "free"])
        hashes = chain(f"{owner}{rng.randrange(12)}-", rng.randrange(1, 24))  # some > cache
        if rng.random() < 0.5:
            cache.lookup(hashes)
        cache.insert(hashes, owner=owner)
        assert len(cache) <= 16
        # Tails only: every cached block's parent is cached too (no unreachable block).
        cached = set(cache.lru_order())
        for h in cached:
            name, i = h.decode().rsplit("-", 1)
            assert i == "0" or f"{name}-{int(i) - 1}".encode() in cached
    assert cache.evictions > 0


def test_candidate_is_a_plain_record() -> None:
    c = Candidate(b"x", 2, 1.0, None, 0)
    assert (c.blocks, c.owner, c.lru_rank) == (2, None, 0)


def test_profile_selects_and_validates_the_policy() -> None:
    profile = SimulationProfile.model_validate(
        {
            "eviction": "weighted",
            "eviction_weights": {"idle": 1, "size": 0, "recompute_inverse": 0,
                                 "priority_inverse": 0},
            "eviction_paid_salts": ["s1"],
        }
    )  # fmt: skip
    assert profile.eviction_weights.idle == 1
    assert profile.eviction_paid_salts == frozenset({"s1"})
    assert SimulationProfile().eviction == "lru"
    with pytest.raises(ValidationError):
        SimulationProfile(eviction="mru")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SimulationProfile.model_validate({"eviction_weights": {"idle": 1, "hotness": 2}})
    with pytest.raises(ValidationError):
        EvictionWeights(idle=0, size=0, recompute_inverse=0, priority_inverse=0)
    with pytest.raises(ValidationError):
        EvictionWeights(idle=-1)
