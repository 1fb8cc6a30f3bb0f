"""Gateway metrics across ingress replicas (app.observability.board): one scrape shows
every replica's series labelled with its replica, histograms aggregate exactly with
``sum by (le)``, stale replicas drop out, and tenant families stay behind the token."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from app.observability import board
from app.observability.board import MetricsBoard, Snapshot
from app.observability.metrics import GatewayMetrics


def replica(name: str, requests: int, ttfts: list[float]) -> GatewayMetrics:
    m = GatewayMetrics(["a"], tenants=["acme"], replica=name)
    for _ in range(requests):
        m.requests.labels("a", "chat", "200").inc()
    for t in ttfts:
        m.ttft.labels("a").observe(t)
    m.tenant_tokens.labels("acme", "prompt").inc(7)
    return m


def samples(text: bytes, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == name
    }


def test_one_scrape_shows_every_replica_once_labelled_with_it() -> None:
    one, two = replica("r1", 3, [0.01, 0.3]), replica("r2", 5, [0.02])
    text = one.render(others=[two.snapshot(), one.snapshot()])  # its own stale copy ignored
    got = samples(text, "switchyard_requests_total")
    base = (("endpoint", "chat"), ("model", "a"))
    assert got == {
        (*base, ("replica", "r1"), ("status", "200")): 3.0,
        (*base, ("replica", "r2"), ("status", "200")): 5.0,
    }
    # Histograms stay per replica; summed by le they are the fleet's distribution.
    buckets: dict[str, float] = defaultdict(float)
    for labels, value in samples(text, "switchyard_time_to_first_token_seconds_bucket").items():
        buckets[dict(labels)["le"]] += value
    assert (buckets["0.01"], buckets["0.02"], buckets["0.32"], buckets["+Inf"]) == (1, 2, 3, 3)


def test_tenant_families_of_other_replicas_only_with_the_token() -> None:
    one, two = replica("r1", 1, []), replica("r2", 1, [])
    public = one.render(others=[two.snapshot()])
    assert b"tenant=" not in public and b'replica="r2"' in public
    full = samples(one.render(True, [two.snapshot()]), "switchyard_tenant_tokens_total")
    assert {dict(k)["replica"] for k in full} == {"r1", "r2"}


def test_the_board_keeps_the_latest_snapshot_per_replica_and_forgets_stale_ones() -> None:
    b = MetricsBoard()
    b.put(Snapshot("r1", 100.0, (), ()))
    b.put(Snapshot("r2", 100.0, (), ()))
    b.put(Snapshot("r1", 110.0, (), ()))
    assert sorted((s.replica, s.at) for s in b.snapshots(now=111.0)) == [
        ("r1", 110.0),
        ("r2", 100.0),
    ]
    late = 100.0 + board.STALE_S + 1
    assert [s.replica for s in b.snapshots(now=late)] == ["r1"]  # r2 stopped pushing
    assert [s.replica for s in b.snapshots(now=111.0)] == ["r1"]  # and is forgotten


def test_a_snapshot_survives_pickling_as_ray_sends_it() -> None:
    import pickle

    s = replica("r1", 2, [0.05]).snapshot()
    back = pickle.loads(pickle.dumps(s))
    text = GatewayMetrics(["a"], replica="r0").render(others=[back])
    assert samples(text, "switchyard_requests_total")[
        (("endpoint", "chat"), ("model", "a"), ("replica", "r1"), ("status", "200"))
    ] == 2.0
