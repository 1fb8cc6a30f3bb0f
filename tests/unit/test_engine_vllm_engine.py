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


async def test_an_unreachable_s3_source_is_a_clear_error(tmp_path: Path) -> None:
    """The replica fetches an s3:// source before vLLM is touched; a server that does
    not answer is a not-ready error naming the URL (Ray then retries the replica)."""
    from app.engine.vllm_engine import S3Source
    from benchmarks.local_redis import free_port

    source = S3Source(url="s3://models/tiny", endpoint_url=f"http://127.0.0.1:{free_port()}")
    config = VLLMEngineConfig(model_path=tmp_path / "cache", served_name="q", s3=source)
    with pytest.raises(EngineNotReady, match="s3://models/tiny: cannot list"):
        await VLLMEngine(config).start()
    assert not (tmp_path / "cache").exists()
