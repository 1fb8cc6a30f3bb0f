"""``app.engine.settings`` (through ``ModelSpec``, where configs meet it): placement and
vLLM knobs are checked when the config loads — against the installed vLLM — and map
one to one onto vLLM's engine arguments, the seed's practice config included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.builders import engine_config
from app.config import ModelSpec
from app.engine.cpu_dtype import auto_dtype
from app.engine.settings import EngineSettings
from app.engine.vllm_engine import VLLMEngineConfig, engine_args
from app.settings import Settings

SOURCE = {"id": "m", "source": "/models/m"}


def spec(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({**SOURCE, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_gpus": 1}, "num_gpus needs a GPU accelerator"),
        ({"tensor_parallel_size": 2}, "need a GPU accelerator"),
        ({"gpu_memory_utilization": 0.9}, "GPU accelerator only"),
        ({"accelerator": "A100", "tensor_parallel_size": 2, "num_gpus": 1}, "must equal"),
        ({"accelerator": "A100", "gpu_memory_utilization": 1.5}, "less than or equal to 1"),
        ({"accelerator": "A100", "quantization": "awqq"}, "not one of the installed vLLM's"),
        ({"engine_kwargs": {"max_num_seqz": 4}}, "not engine arguments of the installed vLLM"),
        ({"engine_kwargs": {"model": "other"}}, "Switchyard sets them"),
        ({"engine_kwargs": {"max_model_len": 4096}, "max_model_len": 1024}, "give one"),
        ({"swap_space": 4}, "kv_offloading_size"),
        ({"accelerator": "a b"}, "pattern"),
        ({"engine": "simulated", "source": None, "accelerator": "L4"}, "runs on CPU"),
        ({"engine": "simulated", "source": None, "engine_kwargs": {"max_logprobs": 5}},
         "runs on CPU"),
    ],
)  # fmt: skip
def test_bad_settings_fail_when_the_config_loads(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**fields)


def test_cpu_defaults_are_the_two_core_recipe() -> None:
    s = spec()
    assert (s.accelerator, s.num_cpus, s.num_gpus, s.world_size) == ("cpu", 0.0, None, 1)
    assert s.kv_cache_bytes == 512 * 1024**2  # the CPU KV cache; a GPU sizes its own
    assert spec(accelerator="A100").kv_cache_bytes is None
    assert spec(accelerator="A100", kv_cache_memory_bytes=2**30).kv_cache_bytes == 2**30


def test_gpus_per_replica_follow_tensor_and_pipeline_parallel() -> None:
    s = spec(accelerator="H100", tensor_parallel_size=2, pipeline_parallel_size=2)
    assert (s.world_size, s.num_gpus) == (4, 4)
    assert s.vllm_args()["distributed_executor_backend"] == "ray"
    assert "distributed_executor_backend" not in spec(accelerator="L4").vllm_args()


def _args(model: ModelSpec, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "config.json").write_text("{}")
    model = model.model_copy(update={"source": str(tmp_path)})
    config = engine_config(model, Settings(cache_dir=tmp_path, data_dir=tmp_path / "d"))
    assert isinstance(config, VLLMEngineConfig)
    return engine_args(config)


def test_the_seeds_practice_config_maps_one_to_one(tmp_path: Path) -> None:
    """Seed 000 CH4-3 §7-2: Qwen2.5-7B-Instruct-AWQ on one GPU, written as Ray Serve
    LLM's engine_kwargs; the same keys reach vLLM's engine arguments unchanged."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    model = ModelSpec.model_validate({
        "id": "qwen2.5-7b-instruct-awq", "source": "/models/qwen", "accelerator": "L4",
        "engine_kwargs": {"quantization": "awq", "max_model_len": 4096,
                          "gpu_memory_utilization": 0.85},
        "max_ongoing_requests": 32,
    })  # fmt: skip
    assert (model.quantization, model.max_model_len, model.gpu_memory_utilization) == (
        "awq", 4096, 0.85,
    )  # fmt: skip
    assert model.engine_kwargs == {}  # every key found its field
    args = _args(model, tmp_path)
    assert {k: args[k] for k in ("quantization", "max_model_len", "gpu_memory_utilization")} == {
        "quantization": "awq", "max_model_len": 4096, "gpu_memory_utilization": 0.85,
    }  # fmt: skip
    assert "kv_cache_memory_bytes" not in args  # the GPU sizes its KV cache
    engine = AsyncEngineArgs(**args)  # the installed vLLM takes every argument
    assert (engine.quantization, engine.gpu_memory_utilization) == ("awq", 0.85)


def test_a_two_gpu_tensor_parallel_pool_with_every_knob(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    model = spec(
        accelerator="A100", tensor_parallel_size=2, quantization="fp8",
        max_num_batched_tokens=8192, enable_chunked_prefill=True, block_size=32,
        enable_prefix_caching=False, engine_kwargs={"long_prefill_token_threshold": 512},
    )  # fmt: skip
    args = _args(model, tmp_path)
    expected = {
        "tensor_parallel_size": 2, "quantization": "fp8", "max_num_batched_tokens": 8192,
        "enable_chunked_prefill": True, "block_size": 32, "enable_prefix_caching": False,
        "long_prefill_token_threshold": 512, "distributed_executor_backend": "ray",
    }  # fmt: skip
    assert {k: args[k] for k in expected} == expected
    engine = AsyncEngineArgs(**args)
    assert (engine.tensor_parallel_size, engine.block_size) == (2, 32)


def test_constrained_json_is_compact_unless_the_config_says_otherwise(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = _args(spec(), tmp_path)
    engine = AsyncEngineArgs(**args)
    assert engine.structured_outputs_config.disable_any_whitespace is True
    own = {"structured_outputs_config": {"backend": "guidance"}}
    config = _args(spec(engine_kwargs=own), tmp_path)["structured_outputs_config"]
    assert (config.backend, config.disable_any_whitespace) == ("guidance", False)


def test_a_kv_events_port_makes_vllm_publish_its_kv_cache_events_there() -> None:
    config = VLLMEngineConfig(model_path=Path("/m"), served_name="m", publish_kv_events=True)
    assert "kv_events_config" not in engine_args(config)
    events = engine_args(config, kv_events_port=5600)["kv_events_config"]
    assert events.enable_kv_cache_events and events.publisher == "zmq"
    assert events.endpoint == "tcp://*:5600"


@pytest.mark.parametrize(
    ("dtype", "task", "accelerator", "sent"),
    [
        ("auto", "embed", "cpu", "float32"),  # vLLM's auto: float16, 4x slower on AVX2
        ("auto", "generate", "cpu", auto_dtype()),  # this CPU's ISA (app.engine.cpu_dtype)
        ("auto", "generate", "L4", "auto"),
        ("auto", "embed", "L4", "auto"),  # a GPU: vLLM's float16
        ("bfloat16", "embed", "cpu", "bfloat16"),  # asked for: as given
        ("float16", "embed", "cpu", "float16"),
        ("float32", "generate", "cpu", "float32"),
    ],
)  # fmt: skip
def test_the_dtype_vllm_gets(
    dtype: Any, task: Any, accelerator: str, sent: str
) -> None:
    config = VLLMEngineConfig(
        model_path=Path("/m"), served_name="m", task=task, dtype=dtype,
        settings=EngineSettings(accelerator=accelerator),
    )  # fmt: skip
    assert engine_args(config)["dtype"] == sent
