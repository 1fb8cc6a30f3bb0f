"""Every dashboard panel and variable, evaluated by a real Prometheus (Debian's package)
that scrapes a running Switchyard the way a cluster does: the gateway's ``/metrics``
with the admin token (the tenant families), and Ray's metrics export for every
LLMServer replica's engine family. A short load touches each family: plain, streamed
and repeated requests, a client that leaves, a budget refusal, a route fallback, a
disaggregated request, a LoRA adapter on the real vLLM engine, a (simulated) speculative
engine's drafts. A panel whose query names a series nobody exports returns nothing, and
fails here."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from ray import serve

from app.observability import dashboards
from benchmarks.local_prometheus import Prometheus, Target, prometheus_server
from benchmarks.local_redis import free_port
from tests.integration.conftest import ADMIN_TOKEN, SIM_FAST, TENANT, Deploy, Gateway

APP = "obs"
ROUTES = """
pools:
  main: {kind: local, model: obs-chat}
  pd:   {kind: local, model: obs-pd}
  lora: {kind: local, model: obs-lora}
  spec: {kind: local, model: obs-spec}
  dead: {kind: openai, base_url: "http://127.0.0.1:DEAD_PORT/v1", model: gone,
         connect_timeout_s: 1}
models:
  obs-chat:
    pool: main
    profile: {max_context: 2048, input_per_1m: 1, output_per_1m: 2, cached_input_per_1m: 0.5}
  obs-pd:
    pool: pd
    profile: {max_context: 2048, input_per_1m: 1, output_per_1m: 2}
  obs-lora:
    pool: lora
    profile: {max_context: 512, input_per_1m: 1, output_per_1m: 2}
  obs-spec:
    pool: spec
    profile: {max_context: 2048}
  obs-flaky:
    pool: dead
    profile: {max_context: 2048}
    fallbacks: [main]
default_model: obs-chat
fallback: {max_attempts: 3, total_timeout_s: 20}
"""
ROUTING = {"prefix": {"block_size": 16}}


@pytest.fixture(scope="module")
def observed(
    deploy: Deploy,
    redis_server_url: str,
    tiny_model_dir: Path,
    tiny_loras: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    routes = tmp_path_factory.mktemp("obs-routes") / "routes.yaml"
    routes.write_text(ROUTES.replace("DEAD_PORT", str(free_port())))
    sim = {"engine": "simulated", "simulation": SIM_FAST, "routing": ROUTING}
    gw = deploy(
        APP,
        {
            "models": [
                {"id": "obs-chat", **sim},
                {
                    "id": "obs-pd",
                    **sim,
                    "simulation": {**SIM_FAST, "kv_connector": True},
                    "disaggregation": {"min_uncached_tokens": 64},
                },
                # speculative decoding's counters (simulated drafts, every one kept: each
                # counter grows in every round)
                {"id": "obs-spec", **sim,
                 "simulation": {**SIM_FAST, "spec_tokens": 4, "spec_acceptance": 1.0}},
                {
                    "id": "obs-lora",
                    "source": str(tiny_model_dir),
                    "max_model_len": 512,
                    "kv_cache_memory_bytes": 32 * 1024**2,
                    "max_num_seqs": 4,
                    "lora": {"max_loras": 1, "max_cpu_loras": 1, "max_lora_rank": 8},
                },
            ],
            "routes_file": str(routes),
            "gateway": {"metrics_tenants": [TENANT]},
            "ingress_replicas": 2,  # one scrape must still see both
        },
        state_url=redis_server_url.rsplit("/", 1)[0] + "/5",
    )
    body = {"name": "a1", "base": "obs-lora", "source": str(tiny_loras["a1"])}
    assert gw.admin("POST", "/adapters", json=body, timeout=30).status_code == 201
    yield gw
    serve.delete(APP)


def _words(n: int) -> str:
    return "Tell me about the harbour: " + " ".join(f"w{i}" for i in range(n))


def _load(gw: Gateway) -> None:
    """A few requests of every kind the dashboard shows."""
    client = openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0)
    # Over one KV block (128 tokens) of each engine's tokenizer, so a repeat is a prefix
    # hit: the simulated one counts about a token a word, the tiny model's about three
    # (its context is 512). Over 64 tokens: the P/D rule takes it remote.
    sim, tiny = _words(300), _words(60)
    for model in ("obs-chat", "obs-chat", "obs-pd", "obs-flaky", "obs-lora:a1", "obs-spec"):
        words = tiny if model.startswith("obs-lora") else sim
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": words}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
    stream = client.chat.completions.create(
        model="obs-chat", messages=[{"role": "user", "content": "stream"}], max_tokens=8,
        stream=True,
    )  # fmt: skip
    assert sum(1 for _ in stream) >= 8
    # A client that leaves after the first chunk of a long stream.
    body = {"model": "obs-chat", "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 2000, "ignore_eos": True, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {gw.api_key}"}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", gw.v1 + "/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        next(r.iter_lines())
    # A tenant not in metrics_tenants: counted under `other`, never by name.
    stranger = openai.OpenAI(base_url=gw.v1, api_key=gw.new_key("stranger-1"), max_retries=0)
    stranger.chat.completions.create(
        model="obs-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    # A key whose budget cannot pay for one answer: refused before any engine work.
    poor = openai.OpenAI(base_url=gw.v1, api_key=gw.new_key(daily_tokens=1), max_retries=0)
    with pytest.raises(openai.RateLimitError):
        poor.chat.completions.create(
            model="obs-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=64
        )


def _targets(gw: Gateway) -> list[Target]:
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    prefix = "/" + gw.root.split("/", 3)[3]
    return [
        Target("switchyard", gw.root.split("/")[2], prefix + "/metrics", bearer=ADMIN_TOKEN),
        # Every 5 s, so a scrape may take 5 s: in a full test run the node's export holds
        # every app's replicas (a scrape of it took 0.56 s in one such run).
        Target("ray", f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}",
               interval_s=5.0),
    ]


# Grafana's $__rate_interval is a few scrape intervals; 5 m here keeps the whole test's
# load inside every window however long the polls below take. The model variable is
# this app's models: in a full test run Ray's export holds every app's replicas, and
# another app's series must not make a panel of this one look alive.
EXPRS = {p.title: dashboards.concrete(p.expr, "5m", model="obs-.*") for p in dashboards.panels()}
HIT_RATE = "Engine prefix-cache hit rate"
# Neither engine here preempts, and no model here is saturated enough to shed: those
# panels show 0 through their `or` branch, and their own series never appear.
NEVER = {"ray_switchyard_engine_preemptions_total", "switchyard_queue_shed_total"}
SERIES = sorted(
    {n for e in EXPRS.values() for n in re.findall(r"\b(?:ray_)?switchyard_\w+", e)} - NEVER
)


def _hit_rate(got: dict[str, Any]) -> float:
    return float(got[HIT_RATE][0]["value"][1]) if got.get(HIT_RATE) else 0.0


def _panels(prom: Prometheus, deadline_s: float, hits: bool = False) -> dict[str, Any]:
    """Every panel's result, polled until each has data (and, with ``hits``, the hit
    rate is above 0) or the deadline: Ray exports what replicas recorded every few
    seconds, and a rate needs two scrapes."""
    end = time.monotonic() + deadline_s
    while True:
        got = {title: prom.query(expr) for title, expr in EXPRS.items()}
        done = all(got.values()) and (not hits or _hit_rate(got) > 0)
        if done or time.monotonic() > end:
            return got
        time.sleep(2.0)


def _series_exist(prom: Prometheus, deadline_s: float) -> None:
    """Until Prometheus holds a series of every name the panels use, from this app (Ray's
    export carries every app's: a name another app exports says nothing of this one's
    series, which Ray may export seconds later — a counter first seen after the second
    round shows no rate at all, how the hit rate stayed 0 in full test runs)."""
    end = time.monotonic() + deadline_s
    while True:
        missing = [
            n
            for n in SERIES
            if not prom.query(f'count({n}{{application="{APP}"}})' if n.startswith("ray_")
                              else f"count({n})")
        ]  # fmt: skip
        if not missing:
            return
        assert time.monotonic() < end, f"never scraped: {missing}"
        time.sleep(1.0)


@pytest.fixture(scope="module")
def prometheus(observed: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """The load runs twice: the first round makes every series exist (a counter born at
    its first increment shows no rate until the next), the second is what rates show."""
    with prometheus_server(tmp_path_factory.mktemp("prometheus"), _targets(observed)) as prom:
        prom.wait_scraped({"switchyard", "ray"})
        _load(observed)
        _series_exist(prom, deadline_s=60)
        _load(observed)
        yield prom


def test_every_panel_returns_data(prometheus: Prometheus) -> None:
    got = _panels(prometheus, deadline_s=150, hits=True)  # a loaded CI box exports late
    exprs = EXPRS
    empty = [title for title, result in got.items() if not result]
    assert not empty, {t: exprs[t] for t in empty}
    # What the load did, as the panels show it.
    steps = {r["metric"]["step"] for r in got["Route decisions by step"]}
    assert {"default", "fallback"} <= steps
    assert {r["metric"]["reason"] for r in got["Fallbacks by reason"]} == {"upstream_connect"}
    # The long prompt went remote; in the second round the decode side held it, as far
    # as the ingress replica that took it knows (each keeps its own prefix index).
    split = {(r["metric"]["served"], r["metric"]["reason"]) for r in got["Prefill/decode split"]}
    assert ("remote", "long_uncached") in split
    assert split <= {("remote", "long_uncached"), ("local", "cached")}
    # Loaded for the first round, held for the second.
    assert {r["metric"]["cold"] for r in got["Adapter requests (cold loads)"]} == {"true", "false"}
    assert float(got["Budget refusals"][0]["value"][1]) > 0
    assert {r["metric"]["tenant"] for r in got["Spend per hour by tenant"]} == {TENANT, "other"}
    # Repeated prompts were found in the engines' prefix caches. Should it fail, say what
    # each engine's counters held, as Prometheus has them.
    raw = {
        n: [(r["metric"].get("model") or r["metric"].get("job"), r["metric"].get("replica"),
             r["value"][1])
            for r in prometheus.query(n)]
        for n in (dashboards.HIT, dashboards.QUERIED, "up", "scrape_duration_seconds")
    }  # fmt: skip
    assert 0 < _hit_rate(got) < 1, f"hit rate {_hit_rate(got)}: {raw}"


def test_one_scrape_counts_the_requests_of_both_ingress_replicas(prometheus: Prometheus) -> None:
    """Each round sends six requests to obs-chat (two plain, a stream, a stranger's, the
    one that leaves, the refused one): two rounds, twelve, whichever replica took each."""
    expr = 'sum(switchyard_requests_total{model="obs-chat"})'
    end = time.monotonic() + 30
    while True:
        (total,) = prometheus.query(expr) or [{"value": [0, "0"]}]
        if float(total["value"][1]) >= 12 or time.monotonic() > end:
            break
        time.sleep(1.0)
    assert float(total["value"][1]) == 12
    replicas = prometheus.query("count(count by (replica) (switchyard_rejections_total))")
    assert float(replicas[0]["value"][1]) == 2


def test_every_variable_lists_values(prometheus: Prometheus) -> None:
    for name, query in dashboards.VARIABLES:
        series = query.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        values = {r["metric"].get(series[1]) for r in prometheus.query(series[0])}
        assert values - {None}, name
    models = {r["metric"]["model"] for r in prometheus.query("switchyard_requests_total")}
    assert {"obs-chat", "obs-pd", "obs-lora"} <= models


def test_engine_series_carry_each_replicas_labels(prometheus: Prometheus) -> None:
    running = prometheus.query('ray_switchyard_engine_running_requests{application="obs"}')
    deployments = {r["metric"]["deployment"] for r in running}
    # The decode and prefill roles of obs-pd are deployments of their own.
    assert {"LLMServer-obs-chat", "LLMServer-obs-lora"} <= deployments
    assert any("prefill" in d for d in deployments), deployments
    assert all(r["metric"]["replica"] for r in running)


def test_an_anonymous_scrape_gets_no_tenant_family(observed: Gateway) -> None:
    text = httpx.get(observed.root + "/metrics", timeout=10).text
    assert "switchyard_requests_total" in text
    assert "switchyard_tenant_tokens_total" not in text
    wrong = httpx.get(observed.root + "/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
