"""The engine family through Ray's metrics export, as a cluster's Prometheus scrapes it
(KubeRay's PodMonitor): every LLMServer replica's series under ``ray_<name>`` with
Ray Serve's ``deployment``, ``replica`` and ``application`` labels — from the simulated
engine's scheduler, and from the real vLLM engine's own statistics (turned on)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from tests.integration.conftest import SIM_FAST, Gateway


def _prompt(words: int) -> str:
    """Over one prefix-cache block (128 tokens) of the model's tokenizer: the simulated
    one counts about a token a word, the tiny model's about three."""
    return "Tell me about the harbour: " + " ".join(f"pier{i}" for i in range(words))


def _ray_metrics() -> str:
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    return httpx.get(url, timeout=10).text


def _samples(text: str, name: str, **labels: str) -> list[Any]:
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _total(name: str, **labels: str) -> float:
    return sum(s.value for s in _samples(_ray_metrics(), name, **labels))


def _wait_for(name: str, at_least: float, deadline_s: float = 60.0, **labels: str) -> float:
    """Ray exports what replicas recorded every few seconds: poll until it shows."""
    end = time.monotonic() + deadline_s
    while True:
        value = _total(name, **labels)
        if value >= at_least or time.monotonic() > end:
            return value
        time.sleep(1.0)


def _ask(gw: Gateway, model: str, n: int, words: int) -> None:
    client = openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0)
    for _ in range(n):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": _prompt(words)}],
            max_tokens=4,
            temperature=0,
        )


@pytest.mark.parametrize(
    ("fixture", "model", "words"),
    [("sim_gateway", "sim-chat", 200), ("tiny_gateway", "tiny-llama", 40)],
)
def test_each_replica_exports_the_engine_family_with_its_labels(
    request: pytest.FixtureRequest, fixture: str, model: str, words: int
) -> None:
    gw: Gateway = request.getfixturevalue(fixture)
    labels = {"model": model, "deployment": f"LLMServer-{model}", "application": gw.name}
    finished = _total("ray_switchyard_engine_decode_seconds_count", **labels)
    hits = _total("ray_switchyard_engine_prefix_cache_hit_tokens_total", **labels)
    _ask(gw, model, 3, words)
    # Three more finished requests, each observed once, with their queue and prefill.
    assert _wait_for("ray_switchyard_engine_decode_seconds_count", finished + 3, **labels) >= (
        finished + 3
    )
    text = _ray_metrics()
    for part in ("queue", "prefill"):
        (count,) = _samples(text, f"ray_switchyard_engine_{part}_seconds_count", **labels)
        assert count.value >= 3 and count.labels["replica"], count
    # The same prompt three times: the second and third found it in the prefix cache.
    assert _wait_for("ray_switchyard_engine_prefix_cache_hit_tokens_total", hits + 1, **labels) > (
        hits
    )
    queried = _total("ray_switchyard_engine_prefix_cache_queried_tokens_total", **labels)
    assert queried >= _total("ray_switchyard_engine_prefix_cache_hit_tokens_total", **labels)
    (usage,) = _samples(text, "ray_switchyard_engine_kv_cache_usage_ratio", **labels)
    assert 0.0 <= usage.value <= 1.0
    assert _samples(text, "ray_switchyard_engine_step_tokens_bucket", **labels)


def test_one_local_url_shows_the_engine_family_too(deploy: Any) -> None:
    """``gateway.metrics_include_engines`` (make run's config): the gateway's /metrics
    appends the engine family of its node's Ray export."""
    model = {"id": "one-url", "engine": "simulated", "simulation": SIM_FAST}
    gw: Gateway = deploy(
        "oneurl", {"models": [model], "gateway": {"metrics_include_engines": True}}
    )
    try:
        _ask(gw, "one-url", 1, 20)
        labels = {"deployment": "LLMServer-one-url", "application": "oneurl"}
        end = time.monotonic() + 60
        while True:
            text = httpx.get(gw.root + "/metrics", timeout=10).text
            found = _samples(text, "ray_switchyard_engine_decode_seconds_count", **labels)
            if found or time.monotonic() > end:
                break
            time.sleep(1.0)
        assert found and found[0].value >= 1
        assert _samples(text, "switchyard_requests_total", model="one-url")
    finally:
        serve.delete("oneurl")
