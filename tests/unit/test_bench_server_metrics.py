"""app.bench.server_metrics: Prometheus text produced by prometheus_client itself (metric
names as vLLM exports them), Prometheus-style quantile interpolation checked against
hand-computed values, interval deltas, and scraping a tiny in-process server."""

from __future__ import annotations

import math
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.bench.server_metrics import (
    Hist,
    Snapshot,
    delta,
    histogram_quantile,
    parse,
    scrape,
)

INF = math.inf
BUCKETS = (0.1, 0.5, 1.0, 5.0)


class FakeVLLM:
    """vLLM-named metrics in a private registry, two engines as a DP deployment has."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "q", labels, buckets=BUCKETS, registry=self.registry
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "p",
            labels,
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.queries = Counter("vllm:prefix_cache_queries", "q", labels, registry=self.registry)
        self.hits = Counter("vllm:prefix_cache_hits", "h", labels, registry=self.registry)
        # like vLLM's create_metric_per_engine: every engine's series exists from the start
        for metric in (self.queue, self.prefill, self.queries, self.hits):
            for engine in ("0", "1"):
                metric.labels("m", engine)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # 20 observations: 10 in (0.1, 0.5], 10 in (0.5, 1.0]
        (0.50, {0.1: 0, 0.5: 10, 1.0: 20, INF: 20}, 0.5),  # rank 10: top of (0.1, 0.5]
        (0.25, {0.1: 0, 0.5: 10, 1.0: 20, INF: 20}, 0.3),  # rank 5: 0.1 + 0.4 * 5/10
        (0.75, {0.1: 0, 0.5: 10, 1.0: 20, INF: 20}, 0.75),  # rank 15: 0.5 + 0.5 * 5/10
        (0.99, {0.1: 0, 0.5: 10, 1.0: 20, INF: 20}, 0.99),  # rank 19.8: 0.5 + 0.5 * 9.8/10
        (0.25, {1.0: 4, 2.0: 8, INF: 8}, 0.5),  # lowest bucket starts at 0: 0 + 1 * 2/4
        (0.95, {1.0: 4, 2.0: 8, INF: 8}, 1.9),  # rank 7.6: 1 + 1 * 3.6/4
        (0.50, {1.0: 1, 2.0: 2, INF: 10}, 2.0),  # rank 5 in +Inf: highest finite bound
        (0.25, {-1.0: 2, INF: 4}, -1.0),  # lowest bound <= 0: the bound itself
        (0.50, {0.1: 5, 0.5: 5, 1.0: 10, INF: 10}, 0.1),  # rank 5 reached at 0.1
        (0.50, {INF: 0}, None),  # no observations
        (0.50, {INF: 5}, None),  # only +Inf: nothing to interpolate
        (0.50, {0.1: 1, 0.5: 2}, None),  # no +Inf bucket: not a histogram
        (0.50, {}, None),
    ],
)
def test_histogram_quantile(q: float, buckets: dict[float, float], expected: float | None) -> None:
    got = histogram_quantile(q, buckets)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_parse_real_text_sums_label_sets() -> None:
    vllm = FakeVLLM()
    for v in (0.05, 0.3, 0.3):
        vllm.queue.labels("m", "0").observe(v)
    for v in (0.7, 2.0):
        vllm.queue.labels("m", "1").observe(v)
    vllm.queries.labels("m", "0").inc(100)
    vllm.queries.labels("m", "1").inc(50)
    vllm.hits.labels("m", "0").inc(60)
    vllm.hits.labels("m", "1").inc(15)
    snap = parse(vllm.text())
    q = snap.histograms["queue_time"]
    assert q.count == 5
    assert q.sum == pytest.approx(3.35)
    assert q.buckets == {0.1: 1, 0.5: 3, 1.0: 4, 5.0: 5, INF: 5}
    assert snap.counters == {"prefix_cache_queries": 150, "prefix_cache_hits": 75}
    # exported (all zero) but never observed
    assert snap.histograms["prefill_time"].count == 0
    assert "decode_time" not in snap.histograms


def test_parse_keeps_only_bounds_every_label_set_has() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:request_queue_time_seconds histogram",
            'vllm:request_queue_time_seconds_bucket{engine="0",le="0.1"} 1',
            'vllm:request_queue_time_seconds_bucket{engine="0",le="1.0"} 2',
            'vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf"} 2',
            'vllm:request_queue_time_seconds_count{engine="0"} 2',
            'vllm:request_queue_time_seconds_sum{engine="0"} 0.6',
            'vllm:request_queue_time_seconds_bucket{engine="1",le="1.0"} 3',
            'vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf"} 4',
            'vllm:request_queue_time_seconds_count{engine="1"} 4',
            'vllm:request_queue_time_seconds_sum{engine="1"} 9.0',
            "",
        ]
    )
    q = parse(text).histograms["queue_time"]
    assert q.buckets == {1.0: 5, INF: 6}
    assert (q.count, q.sum) == (6, pytest.approx(9.6))


def test_delta_over_the_window() -> None:
    vllm = FakeVLLM()
    vllm.queue.labels("m", "0").observe(4.0)  # before the window
    vllm.queries.labels("m", "0").inc(1000)
    vllm.hits.labels("m", "0").inc(1000)
    before = parse(vllm.text())
    for v in (0.2, 0.2, 0.4, 0.4):
        vllm.queue.labels("m", "0").observe(v)
    for v in (0.6, 0.8, 0.8, 0.9):
        vllm.queue.labels("m", "1").observe(v)
    vllm.queries.labels("m", "1").inc(200)
    vllm.hits.labels("m", "1").inc(50)
    out = delta(before, parse(vllm.text()))
    assert set(out) == {"queue_time", "prefill_time", "prefix_cache"}
    q = out["queue_time"]
    assert q["count"] == 8
    assert q["mean"] == pytest.approx(4.3 / 8)
    # window buckets: 0.1: 0, 0.5: 4, 1.0: 8, 5.0: 8, +Inf: 8
    assert q["p50"] == pytest.approx(0.5)  # rank 4
    assert q["p95"] == pytest.approx(0.5 + 0.5 * (7.6 - 4) / 4)
    assert q["p99"] == pytest.approx(0.5 + 0.5 * (7.92 - 4) / 4)
    assert out["prefill_time"] == {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    assert out["prefix_cache"] == {"queries": 200, "hits": 50, "hit_rate": 0.25}


def test_delta_after_a_server_restart_uses_the_new_totals() -> None:
    before = Snapshot(
        histograms={"queue_time": Hist({1.0: 90, INF: 100}, sum=50.0, count=100)},
        counters={"prefix_cache_queries": 500.0, "prefix_cache_hits": 100.0},
    )
    after = Snapshot(
        histograms={"queue_time": Hist({1.0: 2, INF: 4}, sum=6.0, count=4)},
        counters={"prefix_cache_queries": 10.0, "prefix_cache_hits": 5.0},
    )
    out = delta(before, after)
    assert out["queue_time"]["count"] == 4
    assert out["queue_time"]["mean"] == pytest.approx(1.5)
    assert out["queue_time"]["p50"] == pytest.approx(1.0)
    assert out["prefix_cache"] == {"queries": 10.0, "hits": 5.0, "hit_rate": 0.5}


def test_delta_first_snapshot_empty() -> None:
    vllm = FakeVLLM()
    vllm.queue.labels("m", "0").observe(0.3)
    out = delta(Snapshot(), parse(vllm.text()))
    assert out["queue_time"]["count"] == 1
    assert out["prefix_cache"] == {"queries": 0.0, "hits": 0.0, "hit_rate": None}


def test_missing_metrics_give_empty_dict() -> None:
    registry = CollectorRegistry()
    Counter("http_requests", "other", registry=registry).inc()
    text = generate_latest(registry).decode()
    assert delta(parse(text), parse(text)) == {}
    assert delta(parse(None), parse("")) == {}
    assert parse("<html>not metrics</html>") == Snapshot()


def test_switchyard_gateway_ttft() -> None:
    from app.observability.metrics import GatewayMetrics

    gw = GatewayMetrics(["m"])
    gw.ttft.labels("m").observe(0.03)
    out = delta(Snapshot(), parse(gw.render().decode()))
    assert set(out) == {"gateway_ttft"}  # the gateway exports no queue time
    assert out["gateway_ttft"]["count"] == 1
    assert out["gateway_ttft"]["p50"] == pytest.approx(0.02 + 0.02 * 0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def metrics_server() -> AsyncIterator[str]:
    vllm = FakeVLLM()
    vllm.queue.labels("m", "0").observe(0.3)
    body = vllm.text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_scrape(metrics_server: str) -> None:
    async with aiohttp.ClientSession() as session:
        text = await scrape(session, metrics_server)
        assert text is not None
        assert parse(text).histograms["queue_time"].count == 1
        assert await scrape(session, metrics_server + "/v1/") == text
        assert await scrape(session, metrics_server + "/nothing") is None  # 404
    assert await scrape(None, metrics_server) == text  # its own session


async def test_scrape_unreachable_is_none() -> None:
    assert await scrape(None, f"http://127.0.0.1:{_free_port()}", timeout_s=1.0) is None
