"""``app.engine.vllm_engine`` without starting vLLM: a model directory missing on the
replica's node is a clear not-ready error before vLLM is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.protocol import EngineNotReady
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig


async def test_a_volume_not_mounted_on_this_node_is_a_clear_error(tmp_path: Path) -> None:
    engine = VLLMEngine(VLLMEngineConfig(model_path=tmp_path / "absent", served_name="q"))
    with pytest.raises(EngineNotReady, match="is the volume mounted here"):
        await engine.start()
