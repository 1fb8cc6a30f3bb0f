"""External OpenAI-compatible pools behind the gateway, against real servers: vLLM's own
OpenAI server on the tiny model, and a deliberately broken one. The gateway streams the
upstream's tokens, bills its usage, falls back before the first token, ends the stream
with an error event after it, and closes the upstream connection when the client
leaves."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.integration.conftest import SERVED, SIM_FAST, Deploy, Gateway
from tests.integration.upstreams import SLOW_CHUNKS, SlowStreams

HELLO = [{"role": "user", "content": "Tell me a story about a switchyard."}]


@pytest.fixture(scope="module")
def hybrid(
    deploy: Deploy, tmp_path_factory: pytest.TempPathFactory, vllm_url: str, broken_url: str
) -> Gateway:
    routes = tmp_path_factory.mktemp("hybrid") / "routes.yaml"
    routes.write_text(
        f"""
pools:
  local:  {{kind: local, model: sim-local}}
  remote: {{kind: openai, base_url: "{vllm_url}/v1", model: {SERVED}}}
  busy:   {{kind: openai, base_url: "{broken_url}/503/v1", model: x}}
  drop:   {{kind: openai, base_url: "{broken_url}/drop/v1", model: x}}
  slow:   {{kind: openai, base_url: "{broken_url}/slow/v1", model: x}}
models:
  remote-chat: {{pool: remote, profile: {{max_context: 2048, input_per_1m: 1, output_per_1m: 2}}}}
  busy-chat:   {{pool: busy, profile: {{max_context: 2048}}, fallbacks: [remote]}}
  drop-chat:   {{pool: drop, profile: {{max_context: 2048}}, fallbacks: [local]}}
  slow-chat:   {{pool: slow, profile: {{max_context: 2048}}}}
"""
    )
    return deploy(
        "hybrid",
        {
            "models": [{"id": "sim-local", "engine": "simulated", "simulation": SIM_FAST}],
            "routes_file": str(routes),
        },
    )


def test_streams_and_bills_the_upstreams_usage(hybrid: Gateway) -> None:
    key = hybrid.new_key(tenant="up-t", daily_tokens=100_000)  # prompts are counted
    client = openai.OpenAI(base_url=hybrid.v1, api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="remote-chat",
        messages=HELLO,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    assert "pool=remote" in raw.headers["x-switchyard-route"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 12
    (record,) = hybrid.records("up-t", 1)
    # the exact upstream usage replaced the reservation's upper-bound prompt estimate
    assert (record["prompt_tokens"], record["completion_tokens"]) == (usage.prompt_tokens, 12)
    assert record["pool"] == "remote" and record["cost_usd"] == pytest.approx(
        (usage.prompt_tokens * 1 + 12 * 2) / 1e6
    )


def test_a_503_upstream_falls_back_before_the_first_token(hybrid: Gateway) -> None:
    key = hybrid.new_key(tenant="busy-t")
    response = httpx.post(
        hybrid.v1 + "/chat/completions",
        json={"model": "busy-chat", "messages": HELLO, "max_tokens": 5},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    route = response.headers["x-switchyard-route"]
    assert "pool=remote" in route and "step=fallback" in route and "attempts=2" in route
    (record,) = hybrid.records("busy-t", 1)
    assert (record["pool"], record["attempts"]) == ("remote", 2)
    assert hybrid.metric("switchyard_route_fallbacks_total", reason="upstream_status_503") >= 1


def test_a_failure_after_the_first_token_ends_the_stream_with_an_error(hybrid: Gateway) -> None:
    key = hybrid.new_key(tenant="drop-t")
    client = openai.OpenAI(base_url=hybrid.v1, api_key=key, max_retries=0)
    seen: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
            model="drop-chat", messages=HELLO, max_tokens=5, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append(chunk.choices[0].delta.content)
    assert seen == ["one"]  # no fallback after text was sent
    (record,) = hybrid.records("drop-t", 1)
    assert (record["status"], record["pool"], record["attempts"]) == ("error", "drop", 1)


def test_a_client_that_leaves_closes_the_upstream_connection(hybrid: Gateway) -> None:
    SlowStreams.reset()
    key = hybrid.new_key(tenant="leave-t")
    body = {"model": "slow-chat", "messages": HELLO, "stream": True}
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", hybrid.v1 + "/chat/completions", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if '"content"' in line:
                break  # leave after the first token
    deadline = time.monotonic() + 5
    while not (SlowStreams.sent and SlowStreams.sent[-1] is not None):
        assert time.monotonic() < deadline, "the gateway kept the upstream stream open"
        time.sleep(0.02)
    assert SlowStreams.sent[-1] < SLOW_CHUNKS
    (record,) = hybrid.records("leave-t", 1)
    assert (record["status"], record["http_status"]) == ("client_closed", 499)
    assert record["completion_tokens"] < SLOW_CHUNKS
