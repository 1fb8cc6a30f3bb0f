"""The arms of ``benchmarks.replica_routing``: the replica choices it compares, each
given the request (its prompt token ids, its session) and the replicas' names, told
when a request is done, and (precise arms) fed the engines' KV events as they
happen. The baselines are re-stated here from their sources; ``Ours`` and
``TwoIngress`` run ``app.scheduler`` itself."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.engine.kv_events import KvEvent
from app.scheduler.blocks import chain_hashes
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.prefix_index import PrefixIndex
from app.scheduler.state import RoutedRequest


class Arm(Protocol):
    name: str

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str: ...

    def done(self, req: SimRequest, replica: str) -> None: ...


@dataclass(frozen=True)
class SimRequest:
    rid: str
    tokens: tuple[int, ...]
    session: str | None = None  # agentic workload: the session the call belongs to


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str:
        return replicas[next(self._next) % len(replicas)]

    def done(self, req: SimRequest, replica: str) -> None:
        pass


class LeastLoaded:
    """Power of two choices on in-flight requests (Ray Serve's default router)."""

    name = "least-loaded"

    def __init__(self, seed: int = 3) -> None:
        self._rng = random.Random(seed)
        self.in_flight: dict[str, int] = {}

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str:
        a, b = self._rng.sample(list(replicas), 2)
        pick = a if self.in_flight.get(a, 0) <= self.in_flight.get(b, 0) else b
        self.in_flight[pick] = self.in_flight.get(pick, 0) + 1
        return pick

    def done(self, req: SimRequest, replica: str) -> None:
        self.in_flight[replica] -= 1


class PrefixAffinityBaseline:
    """Ray Serve LLM's PrefixCacheAffinityRouter, 2.60 defaults, on 16-token blocks."""

    name = "prefix-affinity-baseline"

    def __init__(self) -> None:
        self.tree = PrefixIndex(max_blocks=10**9)  # do_eviction=False
        self.size: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str:
        hashes = chain_hashes(req.tokens, 16)
        matched = self.tree.match_all(hashes, replicas)
        best = max(matched.values())
        if hashes and best / len(hashes) >= 0.1:  # match_rate_threshold
            pool = [r for r in replicas if matched[r] == best]
        else:
            low = min(self.size.get(r, 0) for r in replicas)
            pool = [r for r in replicas if self.size.get(r, 0) == low]
        pick = min(pool, key=lambda r: self.in_flight.get(r, 0))
        self.tree.insert(pick, hashes)
        self.size[pick] = self.tree.size(pick)
        self.in_flight[pick] = self.in_flight.get(pick, 0) + 1
        return pick

    def done(self, req: SimRequest, replica: str) -> None:
        self.in_flight[replica] -= 1


class Ours:
    """``app.scheduler`` with default weights: approximate mode on 64-token blocks, or
    precise mode on the engines' 128-token blocks, following their KV events."""

    def __init__(self, replicas: Sequence[str], mode: str = "approximate") -> None:
        self.precise = mode == "precise"
        self.block = 128 if self.precise else 64
        self.name = "ours precise" if self.precise else "ours"
        config = {"prefix": {"block_size": self.block, "mode": mode}}
        self.scheduler = Scheduler(ReplicaRouting.model_validate(config))
        self.scheduler.set_replicas(replicas)
        self.decide_ns: list[int] = []

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str:
        started = time.perf_counter_ns()
        hashes = chain_hashes(req.tokens, self.block)
        routed = RoutedRequest(req.rid, hashes, len(req.tokens), req.session)
        d = self.scheduler.decide(routed, replicas)
        self.scheduler.routed(req.rid, routed, d.replica)
        self.decide_ns.append(time.perf_counter_ns() - started)
        return d.replica

    def done(self, req: SimRequest, replica: str) -> None:
        self.scheduler.completed(req.rid)

    def engine_events(self, replica: str, events: list[KvEvent]) -> None:
        if self.precise:
            self.scheduler.engine_events(replica, events)


class TwoIngress:
    """``ours`` in two ingress replicas: each request reaches one of two independent
    routers (as Ray's proxy spreads requests), each with its own index and load book;
    in precise mode both follow every engine's events."""

    def __init__(self, replicas: Sequence[str], mode: str = "approximate") -> None:
        self.routers = (Ours(replicas, mode), Ours(replicas, mode))
        self.name = f"{self.routers[0].name}, 2 ingress replicas"
        self._next = itertools.count()
        self._by_request: dict[str, Ours] = {}

    def choose(self, req: SimRequest, replicas: Sequence[str]) -> str:
        router = self.routers[next(self._next) % 2]
        self._by_request[req.rid] = router
        return router.choose(req, replicas)

    def done(self, req: SimRequest, replica: str) -> None:
        self._by_request.pop(req.rid).done(req, replica)

    def engine_events(self, replica: str, events: list[KvEvent]) -> None:
        for router in self.routers:
            router.engine_events(replica, events)


def make_arms(replicas: Sequence[str]) -> list[Arm]:
    return [RoundRobin(), LeastLoaded(), PrefixAffinityBaseline(), Ours(replicas),
            TwoIngress(replicas), Ours(replicas, "precise"),
            TwoIngress(replicas, "precise")]  # fmt: skip


ARMS = ("round-robin", "least-loaded", "prefix-affinity-baseline", "ours",
        "ours, 2 ingress replicas", "ours precise", "ours precise, 2 ingress replicas")  # fmt: skip
