"""Serving profiles on real vLLM CPU engines of the tiny model: two pools of one public
model, an interactive and a long-context one. Each engine runs with its profile's knobs
(read back from vLLM's own config, not from ours, with the per-pool overrides), the
public model shows its profile and SLO in /v1/models, and requests go to the pool of
their class — streamed short answers to the interactive pool, long prompts to the
long-context pool, `service_tier: flex` reported as throughput — each explained in
`x-switchyard-route`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ray import serve

from tests.integration.conftest import Deploy, Gateway

APP = "profiles"
CHAT, LONG = "tiny-chat", "tiny-long"
LONG_PROMPT_TOKENS = 200


@pytest.fixture(scope="module")
def pools(deploy: Deploy, tiny_model_dir: Path) -> Iterator[Gateway]:
    small = {"source": str(tiny_model_dir), "kv_cache_memory_bytes": 32 * 1024**2}
    args = {
        "models": [
            # per-pool overrides of the interactive bundle (512/256 → 256/128)
            {"id": CHAT, **small, "profile": "interactive", "max_model_len": 512,
             "max_num_seqs": 4, "max_ongoing_requests": 4, "max_num_batched_tokens": 256,
             "long_prefill_token_threshold": 128},
            # the long-context bundle as is, but for the window the tiny model has
            {"id": LONG, **small, "profile": "long_context", "max_model_len": 1024,
             "max_num_seqs": 4},
        ],
        "routes": {
            "pools": {"chat": {"kind": "local", "model": CHAT},
                      "long": {"kind": "local", "model": LONG}},
            "models": {"tiny": {"pool": "chat", "classes": {
                "pools": {"interactive": "chat", "long_context": "long"},
                "long_prompt_tokens": LONG_PROMPT_TOKENS}}},
        },
    }  # fmt: skip
    gw = deploy(APP, args)
    yield gw
    serve.delete(APP)


@pytest.mark.parametrize(
    ("model", "want"),
    [
        (CHAT, {"max_num_seqs": 4, "max_num_batched_tokens": 256, "enable_chunked_prefill": True,
                "long_prefill_token_threshold": 128, "enable_prefix_caching": True,
                "max_model_len": 512}),
        (LONG, {"max_num_seqs": 4, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                "long_prefill_token_threshold": 512, "enable_prefix_caching": True,
                "max_model_len": 1024}),
    ],
)  # fmt: skip
def test_each_engine_runs_with_its_profiles_knobs(
    pools: Gateway, model: str, want: dict[str, Any]
) -> None:
    knobs = pools.server(model).knobs.remote().result(timeout_s=60)
    assert {k: knobs[k] for k in want} == want
    assert knobs["kv_blocks"] > 0


def test_models_show_the_profile_and_its_slo(pools: Gateway) -> None:
    r = httpx.get(pools.v1 + "/models", headers={"Authorization": f"Bearer {pools.api_key}"})
    rows = {m["id"]: m for m in r.json()["data"]}
    assert rows["tiny"]["profile"] == {
        "name": "interactive",
        "slo": {"ttft_p95_ms": 1500.0, "itl_p95_ms": 150.0},
    }


def _route(raw: Any) -> dict[str, str]:
    return dict(p.split("=", 1) for p in raw.headers["x-switchyard-route"].split("; "))


@pytest.mark.parametrize(
    ("words", "stream", "extra", "want"),
    [
        (3, True, {}, {"pool": "chat", "step": "class", "class": "interactive",
                       "profile": "interactive"}),
        (200, False, {}, {"pool": "long", "step": "class", "class": "long_context",
                          "profile": "long_context"}),
        # batch work: no throughput pool here, so the model's own pool
        (3, False, {"service_tier": "flex"}, {"pool": "chat", "step": "default",
                                              "class": "throughput", "profile": "interactive"}),
        (3, False, {}, {"pool": "chat", "step": "default", "profile": "interactive"}),
    ],
)  # fmt: skip
def test_a_request_goes_to_the_pool_of_its_class(
    pools: Gateway, words: int, stream: bool, extra: dict[str, Any], want: dict[str, str]
) -> None:
    client = openai.OpenAI(base_url=pools.v1, api_key=pools.api_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": " ".join(f"w{i}" for i in range(words))}],
        max_tokens=8,
        temperature=0,
        stream=stream,
        **extra,
    )
    route = _route(raw)
    assert {k: route.get(k) for k in want} == want
    if "class" not in want:
        assert "class" not in route
    parsed = raw.parse()
    if stream:
        assert sum(1 for _ in parsed) > 0  # the stream completes
    else:
        assert parsed.usage.completion_tokens > 0
