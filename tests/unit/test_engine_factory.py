from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from app.engine.factory import EngineConfig, SimulatedEngineConfig, build_engine
from app.engine.protocol import Engine
from app.engine.simulated import SimulatedEngine
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

ADAPTER: TypeAdapter[VLLMEngineConfig | SimulatedEngineConfig] = TypeAdapter(EngineConfig)


def test_kind_selects_the_config_class() -> None:
    sim = ADAPTER.validate_python({"kind": "simulated", "served_name": "s"})
    assert isinstance(sim, SimulatedEngineConfig)
    real = ADAPTER.validate_python({"kind": "vllm", "served_name": "v", "model_path": "/m"})
    assert isinstance(real, VLLMEngineConfig) and real.model_path == Path("/m")


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "tgi", "served_name": "x"},
        {"kind": "simulated", "served_name": "x", "gpu": True},
        {"kind": "vllm", "served_name": "x"},
    ],
)
def test_bad_configs_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ADAPTER.validate_python(bad)


def test_build_engine_returns_the_matching_engine() -> None:
    sim = build_engine(SimulatedEngineConfig(served_name="s", task="embed"))
    assert isinstance(sim, SimulatedEngine) and isinstance(sim, Engine)
    assert sim.supports_embed and not sim.supports_generate
    real = build_engine(VLLMEngineConfig(model_path=Path("/m"), served_name="v"))
    # Construction does not load anything: weights load in start().
    assert isinstance(real, VLLMEngine) and isinstance(real, Engine)
    assert real.supports_generate and real.max_model_len == 2048
