"""What the ingress reads of its replica routers (app.scheduler.views)."""

from __future__ import annotations

from app.scheduler.blocks import chain_hashes
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest
from app.scheduler.views import best_prefix_tokens, in_flight, register, scheduler_of

IDS = tuple(range(100))


def routed(key: str, ids: tuple[int, ...] = IDS) -> RoutedRequest:
    return RoutedRequest(key, chain_hashes(ids, 16), len(ids))


def scheduler(name: str) -> Scheduler:
    s = Scheduler(ReplicaRouting.model_validate({"prefix": {"block_size": 16}}))
    s.set_replicas(["r0", "r1", "r2"])
    register(name, s)
    return s


def test_unknown_deployments_know_nothing() -> None:
    assert scheduler_of("nobody") is None
    assert best_prefix_tokens("nobody", routed("a")) == 0
    assert in_flight("nobody") is None


def test_the_best_replicas_leading_match_in_tokens() -> None:
    s = scheduler("views-prefix")
    s.routed("x", routed("x", IDS[:48]), "r1")  # 3 blocks of 16 on r1
    s.routed("y", routed("y", IDS[:16]), "r2")  # 1 block on r2
    assert best_prefix_tokens("views-prefix", routed("q")) == 48
    other = tuple(range(500, 600))
    assert best_prefix_tokens("views-prefix", routed("z", other)) == 0


def test_in_flight_follows_the_bookings_and_the_replicas() -> None:
    s = scheduler("views-load")
    s.routed("a", routed("a"), "r0")
    s.routed("b", routed("b"), "r0")
    s.routed("c", routed("c"), "r2")
    assert in_flight("views-load") == [2, 0, 1]
    s.completed("a")
    s.forget("r2")
    assert in_flight("views-load") == [1, 0]


def test_a_first_token_told_by_the_ingress_ends_the_pending_prefill() -> None:
    from app.scheduler.views import first_token

    s = scheduler("views-prefill")
    s.routed("ray-a", routed("a"), "r0")
    s.routed("ray-b", routed("b", tuple(range(500, 540))), "r1")
    assert s.ctx.prefill.pending(["r0", "r1", "r2"]) == [100, 40, 0]
    first_token("views-prefill", "a")
    first_token("views-prefill", "a")  # once
    first_token("nobody", "b")  # a deployment this process never routed to: nothing
    assert s.ctx.prefill.pending(["r0", "r1", "r2"]) == [0, 40, 0]
    assert in_flight("views-prefill") == [1, 1, 0]  # the bookings stay until completion
