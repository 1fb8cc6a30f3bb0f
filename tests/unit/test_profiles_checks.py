"""Every contradiction in a pool's knobs is refused naming the knob and the reason;
consistent pools (every catalogue profile as shipped) pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.config import ModelSpec
from app.models.kv_budget import kv_shape
from app.profiles.catalog import PROFILES
from app.profiles.checks import kv_refusals, model_dir_refusals, refusals

# SmolLM2-135M's shape: 30 layers, 9 heads, 3 KV heads, head_dim 576/9 = 64.
SMOL = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def _model(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"id": "m", "engine": "simulated", **fields})


@pytest.mark.parametrize("name", PROFILES)
def test_the_catalogue_profiles_are_consistent(name: str) -> None:
    m = _model(profile=name)
    assert refusals(m) == []
    # float32 KV: 2 × 30 × 3 × 64 × 4 = 46,080 bytes per token
    assert kv_refusals(m, kv_shape(SMOL, "float32"), 8192) == []


@pytest.mark.parametrize(
    ("fields", "knob", "reason"),
    [
        # any pool
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 1024,
          "max_model_len": 2048}, "max_num_batched_tokens", "never be scheduled"),
        ({"enable_chunked_prefill": False, "long_prefill_token_threshold": 256},
         "long_prefill_token_threshold", "enable_chunked_prefill is false"),
        ({"max_queued_requests": -1, "backpressure": {"status_code": 429}},
         "max_queued_requests", "never refuses"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens",
         "below max_num_seqs 64"),
        ({"max_model_len": 1024, "long_prefill_token_threshold": 2048},
         "long_prefill_token_threshold", "above max_model_len 1024"),
        # interactive
        ({"profile": "interactive", "enable_chunked_prefill": False,
          "max_num_batched_tokens": 4096}, "enable_chunked_prefill", "stalls every stream"),
        ({"profile": "interactive", "max_ongoing_requests": 32},
         "max_ongoing_requests", "wait inside the engine"),
        # long context
        ({"profile": "long_context", "enable_prefix_caching": False},
         "enable_prefix_caching", "long_context pool needs it"),
        # throughput
        ({"profile": "throughput", "max_ongoing_requests": 16},
         "max_ongoing_requests", "batch never fills"),
    ],
)  # fmt: skip
def test_a_contradiction_is_refused_naming_the_knob(
    fields: dict[str, Any], knob: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        _model(**fields)
    message = str(caught.value)
    assert f"{knob}: " in message and reason in message


def test_an_interactive_batch_slower_than_its_ttft_slo_is_refused(tmp_path: Path) -> None:
    tuned = tmp_path / "i.yaml"
    # 512-token steps at 400 prefill tokens/s: 1,280 ms per step, SLO 1,000 ms
    tuned.write_text(
        yaml.safe_dump(
            {"profile": "interactive", "slo": {"ttft_p95_ms": 1000},
             "measured": {"prefill_tokens_per_s": 400}}
        )
    )  # fmt: skip
    with pytest.raises(ValidationError, match=r"max_num_batched_tokens: one full step of 512 "
                       r"tokens takes 1280 ms .* above the ttft_p95_ms SLO 1000"):  # fmt: skip
        _model(profile={"name": "interactive", "file": str(tuned)})
    # smaller steps meet it: 256 / 400 = 640 ms
    ok = _model(profile={"name": "interactive", "file": str(tuned)}, max_num_batched_tokens=256)
    assert ok.max_num_batched_tokens == 256


@pytest.mark.parametrize(
    ("fields", "dtype", "knob", "reason"),
    [
        # bf16: 23,040 B/token; 64 MiB = 67,108,864 / (16 × 23,040) = 182 blocks = 2,912
        # tokens, below one 4,096-token sequence
        ({"max_model_len": 4096, "kv_cache_memory_bytes": 64 * 2**20}, "bfloat16",
         "kv_cache_memory_bytes", "hold 2912 tokens at 23040 bytes each"),
        # interactive, float32 (46,080 B/token): 1 GiB holds 1,456 blocks = 23,296 tokens;
        # 16 × 2,048 = 32,768 needed
        ({"profile": "interactive", "max_num_seqs": 16, "max_ongoing_requests": 16},
         "float32", "max_num_seqs", "need 32768 KV tokens and kv_cache_memory_bytes holds 23296"),
        ({"max_model_len": 16384}, "bfloat16", "max_model_len",
         "beyond the model's max_position_embeddings 8192"),
    ],
)  # fmt: skip
def test_kv_budget_contradictions_from_the_models_own_config(
    tmp_path: Path, fields: dict[str, Any], dtype: str, knob: str, reason: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMOL))
    problems = model_dir_refusals(_model(**fields), tmp_path, dtype)
    assert any(p.startswith(f"{knob}: ") and reason in p for p in problems), problems


def test_the_same_interactive_batch_fits_in_bf16() -> None:
    # bf16 halves the bytes: 1 GiB holds 2,912 blocks = 46,592 tokens ≥ 32,768
    m = _model(profile="interactive", max_num_seqs=16, max_ongoing_requests=16)
    assert kv_refusals(m, kv_shape(SMOL, "bfloat16"), 8192) == []


def test_a_directory_without_a_config_or_with_an_unknown_shape_is_left_to_vllm(
    tmp_path: Path,
) -> None:
    m = _model(max_model_len=4096, kv_cache_memory_bytes=64 * 2**20)
    assert model_dir_refusals(m, tmp_path / "absent", "bfloat16") == []
    (tmp_path / "config.json").write_text(json.dumps({**SMOL, "kv_lora_rank": 512}))
    assert model_dir_refusals(m, tmp_path, "bfloat16") == []
