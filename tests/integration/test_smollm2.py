"""The embedded default models, for real: SmolLM2-135M-Instruct through the vLLM CPU
engine and all-MiniLM-L6-v2 through vLLM's pooling runner."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import Gateway

SMOL = "SmolLM2-135M-Instruct"
MINILM = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def smol_gateway(deploy: Callable[[str, dict[str, Any]], Gateway]) -> Gateway:
    return deploy(
        "smol",
        {
            "models": [
                {
                    "id": SMOL,
                    "source": "embedded:smollm2",
                    "dtype": "float32",  # as serve_configs/local.yaml (bf16 on AMX: wrong)
                    "max_model_len": 2048,
                    "kv_cache_memory_bytes": 256 * 1024**2,
                    "max_num_seqs": 8,
                },
                {
                    "id": MINILM,
                    "task": "embed",
                    "source": "embedded:minilm",
                    "max_model_len": 256,
                    "kv_cache_memory_bytes": 64 * 1024**2,
                },
            ]
        },
    )


def test_greedy_answer_names_paris(smol_gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=smol_gateway.v1, api_key=smol_gateway.api_key, max_retries=0)
    out = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert "Paris" in (out.choices[0].message.content or "")


def test_ready_after_a_real_generation(smol_gateway: Gateway) -> None:
    response = httpx.get(smol_gateway.root + "/ready", timeout=120)
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "model": SMOL}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_real_embeddings_rank_related_text_higher(smol_gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=smol_gateway.v1, api_key=smol_gateway.api_key, max_retries=0)
    out = client.embeddings.create(
        model=MINILM, input=["a cat sat on the mat", "a kitten rests on a rug", "stock prices fell"]
    )
    cat, kitten, stocks = (d.embedding for d in out.data)
    assert len(cat) == 384
    assert _cosine(cat, kitten) > _cosine(cat, stocks) + 0.2


def test_real_embeddings_of_the_openai_cap_of_2048_inputs(smol_gateway: Gateway) -> None:
    """OpenAI's maximum, through the real engine: every vector back, in input order (was
    a 503 after the 30 s dispatch bound, MiniLM then running in float16 on this CPU)."""
    client = openai.OpenAI(base_url=smol_gateway.v1, api_key=smol_gateway.api_key, max_retries=0)
    inputs = [f"sentence number {i} about something" for i in range(2048)]
    out = client.embeddings.create(model=MINILM, input=inputs)
    assert [d.index for d in out.data] == list(range(2048))
    assert {len(d.embedding) for d in out.data} == {384}
    assert out.usage.prompt_tokens > 2048
    # vector i is input i's (the batches are put back in order), as when asked alone
    for i in (0, 1000, 2047):
        alone = client.embeddings.create(model=MINILM, input=inputs[i]).data[0].embedding
        assert _cosine(out.data[i].embedding, alone) > 0.999
