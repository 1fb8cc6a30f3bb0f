from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.config import AppArgs, ModelSpec

SIM = {"id": "s", "engine": "simulated"}


def test_default_model_is_first_generator() -> None:
    args = AppArgs.model_validate(
        {"models": [{"id": "e", "engine": "simulated", "task": "embed"}, SIM]}
    )
    assert args.default_model == "s"
    assert args.max_body_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"models": []}, "models"),
        ({"models": [SIM, SIM]}, "duplicate"),
        ({"models": [SIM], "default_model": "x"}, "default_model"),
        ({"models": [SIM], "typo_field": 1}, "typo_field"),
        ({"models": [{"id": "v", "engine": "vllm"}]}, "source"),
        ({"models": [{**SIM, "max_model_len": 4}]}, "max_model_len"),
        ({"models": [{"id": "bad id!", "engine": "simulated"}]}, "id"),
        ({"models": [{**SIM, "simulation": {"decode_ms": 1}}]}, "decode_ms"),
    ],
)
def test_invalid_args_name_the_problem(args: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        AppArgs.model_validate(args)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("model_id", "pool"),
    [
        ("SmolLM2-135M-Instruct", "LLMServer-SmolLM2-135M-Instruct"),
        ("org/m:v1", "LLMServer-org_m_v1"),
    ],
)
def test_pool_names_are_deployment_safe(model_id: str, pool: str) -> None:
    assert ModelSpec(id=model_id, engine="simulated").pool == pool


def test_kv_cache_isolation_salts_isolated_tenants_apart() -> None:
    from app.config import KvCacheIsolation

    iso = KvCacheIsolation.model_validate({"tenants": {"team-shared": "shared"}})
    a, b = iso.salt("acme"), iso.salt("globex")
    assert a is not None and b is not None and a != b
    assert iso.salt("acme") == a  # stable: the same tenant reuses its own cache
    assert iso.salt("team-shared") is None
    assert KvCacheIsolation(default="shared").salt("acme") is None
    with pytest.raises(ValueError):
        KvCacheIsolation.model_validate({"default": "open"})


def test_a_routing_block_is_validated_on_the_model() -> None:
    from app.config import ModelSpec

    spec = ModelSpec.model_validate(
        {"id": "m", "engine": "simulated", "routing": {"scorers": {"prefix": 1, "load": 0}}}
    )
    assert spec.routing is not None and spec.routing.scorers == {"prefix": 1.0}
    assert ModelSpec.model_validate({"id": "m", "engine": "simulated"}).routing is None
    with pytest.raises(ValueError, match="unknown scorers"):
        ModelSpec.model_validate(
            {"id": "m", "engine": "simulated", "routing": {"scorers": {"x": 1}}}
        )


def test_precise_routing_on_a_simulated_engine_hashes_its_own_block_size() -> None:
    from app.config import ModelSpec

    precise = {"mode": "precise", "block_size": 64}
    with pytest.raises(ValueError, match="must be 128"):
        ModelSpec.model_validate({"id": "m", "engine": "simulated", "routing": {"prefix": precise}})
    spec = ModelSpec.model_validate({
        "id": "m", "engine": "simulated", "simulation": {"block_size": 64},
        "routing": {"prefix": precise},
    })  # fmt: skip
    assert spec.routing is not None and spec.routing.prefix.mode == "precise"
