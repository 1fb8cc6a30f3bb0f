"""Adapter affinity in the replica scheduler: requests follow the replicas holding
their adapter (from stats or recent sends), a new adapter abstains, full holders open
the pool, a hot adapter warms a second replica instead of pinning one, and a prompt's
blocks are keyed per adapter; the placement's rate and memory."""

from __future__ import annotations

from collections import Counter

from app.scheduler.adapter_placement import RATE_TAU_S, AdapterPlacement
from app.scheduler.blocks import adapter_of, chain_hashes, routing_salt
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest

REPLICAS = ["r0", "r1", "r2", "r3"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scheduler(clock: Clock, **adapter: object) -> Scheduler:
    s = Scheduler(ReplicaRouting.model_validate({"prefix": {"block_size": 4}, "adapter": adapter}))
    s.ctx.adapters = AdapterPlacement(s.config.adapter.recent_s, clock)
    s.set_replicas(REPLICAS)
    return s


def req(key: str, adapter: str | None, tokens: int = 0) -> RoutedRequest:
    ids = list(range(tokens))
    hashes = chain_hashes(ids, 4, routing_salt(None, adapter))
    return RoutedRequest(key, hashes, len(ids), None, adapter)


def send(s: Scheduler, key: str, adapter: str | None, *, done: bool = True) -> str:
    r = req(key, adapter)
    d = s.decide(r, REPLICAS)
    s.routed(f"ray-{key}", r, d.replica)
    if done:
        s.completed(f"ray-{key}")
    return d.replica


def test_requests_follow_the_replica_that_holds_their_adapter() -> None:
    clock = Clock()
    s = scheduler(clock)
    s.ctx.adapters.report("r2", ["m:a"])  # from r2's routing stats
    assert {send(s, f"k{i}", "m:a") for i in range(6)} == {"r2"}
    d = s.decide(req("x", "m:a"), REPLICAS)
    assert d.scorer == "adapter"


def test_a_recent_send_counts_until_stats_would_have_said_so() -> None:
    clock = Clock()
    s = scheduler(clock, recent_s=5.0)
    first = send(s, "a", "m:new")  # nobody holds it: the scorer abstains, load decides
    assert send(s, "b", "m:new") == first  # it was just loaded there
    clock.now = 6.0  # past recent_s, and the stats do not list it: it may be gone
    assert s.ctx.adapters.holders("m:new", REPLICAS) == set()


def test_full_holders_open_the_pool() -> None:
    clock = Clock()
    s = scheduler(clock, saturated_in_flight=2, hot_rps=1000.0)
    s.ctx.adapters.report("r1", ["m:a"])
    placed = [send(s, f"k{i}", "m:a", done=False) for i in range(6)]
    assert placed[:2] == ["r1", "r1"]  # until r1 has 2 in flight
    assert set(placed[2:]) - {"r1"}  # then others take it (and load it)


def test_a_hot_adapter_warms_a_second_replica_instead_of_pinning_one() -> None:
    clock = Clock()
    hot = scheduler(clock, hot_rps=0.5, min_replicas=2)
    hot.ctx.adapters.report("r0", ["m:hot"])
    placed = Counter()
    for i in range(40):  # 40 requests in 4 s: 10/s, far above 0.5/s
        clock.now = i * 0.1
        placed[send(hot, f"k{i}", "m:hot")] += 1
    assert len(placed) >= 2 and placed["r0"] < 40
    pinned = scheduler(Clock(), hot_rps=1e6)  # never hot: it stays where it is
    pinned.ctx.adapters.report("r0", ["m:hot"])
    assert {send(pinned, f"k{i}", "m:hot") for i in range(40)} == {"r0"}


def test_prefixes_are_keyed_per_adapter() -> None:
    assert chain_hashes(range(8), 4, routing_salt("t", "m:a")) != chain_hashes(
        range(8), 4, routing_salt("t", "m:b")
    )
    assert routing_salt("t", None) == "t"
    assert adapter_of("m:a@3") == "m:a" and adapter_of(None) is None


def test_the_rate_decays_and_a_dropped_replica_holds_nothing() -> None:
    clock = Clock()
    p = AdapterPlacement(10.0, clock)
    for _ in range(20):
        p.routed("r0", "m:a")
    assert abs(p.rate("m:a") - 20 / RATE_TAU_S) < 1e-9
    clock.now = RATE_TAU_S
    assert abs(p.rate("m:a") - 20 / RATE_TAU_S / 2.718281828) < 1e-3
    p.report("r1", ["m:a"])
    assert p.holders("m:a", ["r0", "r1"]) == {"r0", "r1"}
    p.drop("r0")
    p.drop("r1")
    assert p.holders("m:a", ["r0", "r1"]) == set()
