"""The replica scheduler loop: prefix affinity, load balance winning over affinity past
the imbalance thresholds, new prefixes spreading (no death spiral), pending prefills
avoided, session stickiness, tie-breaks by request id, and what the decision says
decided."""

from __future__ import annotations

from collections import Counter

import pytest

from app.engine.kv_events import BlockRemoved, BlockStored
from app.scheduler.blocks import chain_hashes
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.plugins.picker import pick
from app.scheduler.state import RoutedRequest

REPLICAS = ["r0", "r1", "r2", "r3"]


def req(key: str, tokens: list[int] | None = None, *, session: str | None = None,
        salt: str | None = None, block: int = 4) -> RoutedRequest:  # fmt: skip
    ids = tokens or []
    return RoutedRequest(key, chain_hashes(ids, block, salt), len(ids), session)


def scheduler(**routing: object) -> Scheduler:
    s = Scheduler(ReplicaRouting.model_validate({"prefix": {"block_size": 4}, **routing}))
    s.set_replicas(REPLICAS)
    return s


def test_a_repeated_prefix_goes_where_it_went_before() -> None:
    s = scheduler()
    context = list(range(64))
    first = s.decide(req("a", [*context, 900]), REPLICAS)
    s.routed("ray-a", req("a", [*context, 900]), first.replica)
    s.completed("ray-a")
    again = s.decide(req("b", [*context, 901, 902]), REPLICAS)
    assert again.replica == first.replica
    assert (again.scorer, again.matched_blocks, again.prompt_blocks) == ("prefix", 16, 16)
    assert again.header().startswith(f"replica={first.replica}; scorer=prefix; prefix=16/16")


def test_a_salt_keeps_tenants_apart_in_the_index() -> None:
    s = scheduler()
    context = list(range(64))
    first = s.decide(req("a", context, salt="tenant-a"), REPLICAS)
    s.routed("ray-a", req("a", context, salt="tenant-a"), first.replica)
    other = s.decide(req("b", context, salt="tenant-b"), REPLICAS)
    assert other.matched_blocks == 0 and other.scorer != "prefix"


def test_new_prefixes_spread_instead_of_piling_onto_the_least_loaded() -> None:
    s = scheduler()
    placed = Counter()
    for i in range(40):  # 40 distinct prompts arriving together (nothing completes)
        r = req(f"k{i}", [i * 1000 + t for t in range(32)])
        d = s.decide(r, REPLICAS)
        s.routed(f"ray-{i}", r, d.replica)
        placed[d.replica] += 1
    assert set(placed) == set(REPLICAS)
    assert max(placed.values()) - min(placed.values()) <= 1  # booking at selection spreads


def test_balance_wins_over_affinity_past_both_thresholds() -> None:
    s = scheduler(load={"abs_threshold": 3.5, "rel_threshold": 1.5})
    hot = list(range(64))
    d = s.decide(req("h0", hot), REPLICAS)
    owner = d.replica
    for i in range(4):  # pile four in-flight requests on the prefix's owner, decoding
        s.routed(f"ray-h{i}", req(f"h{i}", hot), owner)
        s.first_token(f"h{i}")
    d = s.decide(req("h9", hot), REPLICAS)
    assert d.replica != owner and d.scorer == "load:imbalance"
    s.completed("ray-h0")  # 3 in flight (+ 3 × 64 / 512 tokens): 3.375, not above 3.5
    d = s.decide(req("h10", hot), REPLICAS)
    assert d.replica == owner and d.scorer == "prefix"


def test_a_new_prompt_avoids_a_replica_still_prefilling_until_its_first_token() -> None:
    # r0 and r1 each run one request; r0's has not had its first token yet
    s = scheduler(scorers={"load": 1.0, "prefill": 1.0})
    for key, replica in (("a", "r0"), ("b", "r1")):
        s.routed(f"ray-{key}", req(key, list(range(100, 132))), replica)
    s.first_token("b")
    s.set_replicas(["r0", "r1"])
    d = s.decide(req("c", list(range(200, 232))), ["r0", "r1"])
    assert (d.replica, d.scorer) == ("r1", "prefill")
    s.first_token("a")  # both decoding now: a tie, broken by the request id
    d = s.decide(req("c", list(range(200, 232))), ["r0", "r1"])
    assert d.scorer == "tiebreak"
    s.routed("ray-d", req("d", list(range(300, 332))), "r1")
    d = s.decide(req("e", list(range(400, 432))), ["r0", "r1"])
    assert (d.replica, d.scorer) == ("r0", "prefill")
    s.completed("ray-d", "d")  # it ended before its first token (an error): not pending
    d = s.decide(req("e", list(range(400, 432))), ["r0", "r1"])
    assert d.scorer == "tiebreak"


def test_a_session_sticks_to_its_replica_and_moves_only_when_it_leaves() -> None:
    s = scheduler(scorers={"session": 1.0, "load": 0.1})
    homes = {}
    for k in range(200):
        d = s.decide(req(f"q{k}", session=f"acme|s{k}"), REPLICAS)
        homes[k] = d.replica
        again = s.decide(req(f"q{k}-2", session=f"acme|s{k}"), REPLICAS)
        assert again.replica == d.replica  # idle pool: always home
    s.set_replicas(REPLICAS[:3])  # r3 leaves
    after = {k: s.decide(req(f"m{k}", session=f"acme|s{k}"), REPLICAS[:3]).replica
             for k in range(200)}  # fmt: skip
    moved = [k for k in range(200) if after[k] != homes[k]]
    assert all(homes[k] == "r3" for k in moved)  # only r3's sessions moved
    assert 0.1 < len(moved) / 200 < 0.4  # about 1/4 of them


def test_ties_break_by_request_id_not_replica_order() -> None:
    s = scheduler(scorers={"load": 1.0})
    winners = Counter(s.decide(req(f"t{i}"), REPLICAS).replica for i in range(400))
    assert set(winners) == set(REPLICAS)
    assert min(winners.values()) > 60  # near 100 each, not all on r0
    d = s.decide(req("same"), REPLICAS)
    again = s.decide(req("same"), list(reversed(REPLICAS)))  # the order offered
    assert (d.replica, d.ranking[:2], d.scorer) == (again.replica, again.ranking[:2], again.scorer)
    assert d.scorer == "tiebreak"


def test_one_candidate_and_a_replica_that_left() -> None:
    s = scheduler()
    context = list(range(64))
    s.routed("ray-a", req("a", context), "r2")
    assert s.decide(req("b", context), ["r1"]).scorer == "only"
    s.set_replicas(["r0", "r1", "r3"])  # r2 left: its index entries are gone
    assert s.ctx.index.size("r2") == 0 and s.ctx.book.in_flight("r2") == 0
    with pytest.raises(ValueError):
        s.decide(req("c"), [])


@pytest.mark.parametrize(
    ("routing", "error"),
    [
        ({"scorers": {"magic": 1.0}}, "unknown scorers"),
        ({"scorers": {"load": -1.0}}, ">= 0"),
        ({"prefix": {"mode": "exact"}}, "approximate"),
        ({"session": {"epsilon": 0}}, "greater than 0"),
        ({"bogus": 1}, "Extra inputs"),
    ],
)
def test_bad_routing_blocks_are_refused(routing: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ReplicaRouting.model_validate(routing)


def test_precise_mode_follows_what_engines_report_not_only_what_it_sent() -> None:
    """Another router sent a context to r2: this one learns it from r2's engine events,
    and forgets it when the engine evicts it."""
    s = scheduler(prefix={"block_size": 4, "mode": "precise"})
    context = list(range(64))
    engine_hashes = [f"e{i}" for i in range(16)]
    stored = BlockStored(block_hashes=engine_hashes, parent_block_hash=None,  # type: ignore[arg-type]
                         token_ids=context, block_size=4)  # fmt: skip
    s.engine_events("r2", [stored])
    there = s.decide(req("a", [*context, 7]), REPLICAS)
    assert (there.replica, there.scorer, there.matched_blocks) == ("r2", "prefix", 16)
    s.engine_events("r2", [BlockRemoved(block_hashes=engine_hashes)])  # type: ignore[arg-type]
    assert s.decide(req("b", [*context, 7]), REPLICAS).matched_blocks == 0
    s.engine_events("r1", [stored])
    s.forget("r1")  # a replica that left takes its translations along
    assert s.decide(req("c", [*context, 7]), REPLICAS).matched_blocks == 0


@pytest.mark.parametrize(
    ("totals", "winner", "runner_up"),
    [
        ([0.1, 0.9, 0.5, 0.2], 1, 2),  # no tie: highest, then the best of the rest
        ([0.3, 0.3 + 1e-12, 0.1], None, None),  # a tie within 1e-9: the hash decides both
        ([0.7], 0, None),
    ],
)
def test_the_picker_names_winner_and_runner_up_and_offers_the_rest_as_given(
    totals: list[float], winner: int | None, runner_up: int | None
) -> None:
    ids = [f"r{i}" for i in range(len(totals))]
    order = pick("req-1", ids, totals)
    assert sorted(order) == list(range(len(ids)))  # every candidate once
    if winner is not None:
        assert order[0] == winner
    if runner_up is not None:
        assert order[1] == runner_up
    if winner is None:  # tied: the same two win whatever the order offered
        flipped = pick("req-1", list(reversed(ids)), list(reversed(totals)))
        assert [ids[i] for i in order[:2]] == [list(reversed(ids))[i] for i in flipped[:2]]
    assert order[2:] == sorted(order[2:])  # the rest as offered
