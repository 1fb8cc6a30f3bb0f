"""Engine settings and placement of one model's replicas: what ``ModelSpec`` adds for
GPU clusters, validated when the config loads (never first at replica start).

Rules and parameters:
- ``accelerator``: ``cpu`` (the default: what ``make run`` needs), or the GPU type Ray
  schedules on (its ``accelerator_type``: ``A10G``, ``L4``, ``A100``, ``H100`` …).
- ``tensor_parallel_size`` × ``pipeline_parallel_size`` = the GPUs one replica uses
  (``num_gpus``, derived when not given; given, it must equal that product). Above one
  GPU, vLLM runs its workers as Ray actors (``distributed_executor_backend: ray``) in
  the replica's placement group (``app.builders.replica_options``).
- ``num_cpus``: CPUs Ray reserves for the replica actor itself (0 by default: on a
  2-core box vLLM sizes its own threads; a GPU profile sets 1 or more).
- GPU-only knobs (``gpu_memory_utilization``) are refused with ``cpu``; on a GPU the KV
  cache follows ``gpu_memory_utilization`` unless ``kv_cache_memory_bytes`` is set.
- ``quantization`` must be a method the installed vLLM knows; ``engine_kwargs`` keys
  must be fields of the installed vLLM's ``EngineArgs``. A key of ``engine_kwargs`` that
  is one of the fields above is moved into that field (so Ray Serve LLM's
  ``engine_kwargs`` layout maps one to one), and conflicting values are an error.
- ``swap_space`` (vLLM V0's CPU swap) does not exist in the installed vLLM (V1): a value
  is refused with what to use instead.
- ``dtype: auto`` of an embedding model on ``cpu`` is float32 (``vllm_dtype``): vLLM's
  ``auto`` picks float16 for every pooling model, and a CPU without half-precision
  arithmetic (AVX2) computes it about 4x slower — all-MiniLM-L6-v2 took 61 s for 2,048
  short inputs in float16 on 2 cores, 14-20 s in float32. ``dtype: auto`` of a text
  model on ``cpu`` follows the CPU's ISA (``app.engine.cpu_dtype``: float32, or
  bfloat16 where AVX-512 BF16 computes it natively and AMX does not). Any other dtype
  or accelerator goes to vLLM as given.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pydantic import Field, model_validator

from app.engine.cpu_dtype import auto_dtype
from app.schema import Strict

# Fields of this model that vLLM takes under the same name.
VLLM_FIELDS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "quantization",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "block_size",
)
# Set by Switchyard itself from other fields; never through engine_kwargs.
RESERVED_KWARGS = frozenset(
    {"model", "served_model_name", "runner", "distributed_executor_backend", "disable_log_stats"}
)


@functools.cache
def vllm_engine_fields() -> frozenset[str]:
    """The installed vLLM's engine argument names (imported once, on first use)."""
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


@functools.cache
def vllm_quantization_methods() -> tuple[str, ...]:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return tuple(QUANTIZATION_METHODS)


class EngineSettings(Strict):
    """Placement and vLLM engine knobs of one model (module docstring)."""

    accelerator: str = Field(
        default="cpu",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="'cpu', or the GPU type Ray schedules replicas on (e.g. 'A100', 'L4').",
    )
    num_gpus: int | None = Field(
        default=None, ge=0, description="GPUs per replica; defaults to TP x PP on a GPU."
    )
    num_cpus: float = Field(default=0.0, ge=0, description="CPUs Ray reserves per replica.")
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Share of GPU memory vLLM may use (GPU only)."
    )
    quantization: str | None = Field(
        default=None, description="A quantization method of the installed vLLM (awq, gptq, fp8…)."
    )
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int | None = Field(
        default=None,
        ge=0,
        description="With chunked prefill: a prompt longer than this is prefilled in "
        "chunks of at most this many tokens per step (vLLM's; 0 or absent: no limit).",
    )
    block_size: int | None = Field(default=None, ge=1)
    swap_space: float | None = Field(
        default=None, description="vLLM V0 only; refused (see the module docstring)."
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vLLM engine argument, by its EngineArgs name.",
    )

    @property
    def on_gpu(self) -> bool:
        return self.accelerator.lower() != "cpu"

    @property
    def world_size(self) -> int:
        """Devices one replica spans: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @model_validator(mode="before")
    @classmethod
    def _lift_engine_kwargs(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("engine_kwargs"), dict):
            return data
        data = dict(data)
        kwargs = dict(data["engine_kwargs"])
        for name in (*VLLM_FIELDS, "max_model_len", "enable_prefix_caching", "dtype"):
            if name not in kwargs or name not in cls.model_fields:  # a subclass's field
                continue
            value = kwargs.pop(name)
            if name in data and data[name] is not None and data[name] != value:
                raise ValueError(
                    f"{name} is {data[name]!r} but engine_kwargs.{name} is {value!r}: give one"
                )
            data[name] = value
        data["engine_kwargs"] = kwargs
        return data

    @model_validator(mode="after")
    def _placement(self) -> EngineSettings:
        if self.swap_space is not None:
            raise ValueError(
                "swap_space is vLLM V0's CPU swap and the installed vLLM (V1) has none; for "
                "a CPU tier of the KV cache use engine_kwargs.kv_offloading_size (GiB)"
            )
        if not self.on_gpu:
            if self.num_gpus:
                raise ValueError("num_gpus needs a GPU accelerator (accelerator is 'cpu')")
            if self.world_size > 1:
                raise ValueError(
                    "tensor_parallel_size/pipeline_parallel_size above 1 need a GPU accelerator"
                )
            if self.gpu_memory_utilization is not None:
                raise ValueError("gpu_memory_utilization applies to a GPU accelerator only")
        else:
            if self.num_gpus is None:
                self.num_gpus = self.world_size
            elif self.num_gpus != self.world_size:
                raise ValueError(
                    f"num_gpus {self.num_gpus} must equal tensor_parallel_size x "
                    f"pipeline_parallel_size = {self.world_size}"
                )
        reserved = sorted(RESERVED_KWARGS & set(self.engine_kwargs))
        if reserved:
            raise ValueError(f"engine_kwargs may not set {reserved}: Switchyard sets them")
        return self

    def check_against_vllm(self) -> None:
        """The vLLM engine only: names and methods the installed vLLM knows."""
        if self.engine_kwargs:
            unknown = sorted(set(self.engine_kwargs) - vllm_engine_fields())
            if unknown:
                raise ValueError(
                    f"engine_kwargs {unknown} are not engine arguments of the installed vLLM"
                )
        if self.quantization is not None and self.quantization not in (
            methods := vllm_quantization_methods()
        ):
            raise ValueError(
                f"quantization {self.quantization!r} is not one of the installed vLLM's: "
                f"{', '.join(methods)}"
            )

    def vllm_dtype(self, dtype: str, task: str) -> str:
        """The ``dtype`` vLLM gets for a model of ``task`` (module docstring); call it on
        the node the engine runs on (a text model's CPU dtype follows that CPU)."""
        if dtype != "auto" or self.on_gpu:
            return dtype
        return "float32" if task == "embed" else auto_dtype()

    def vllm_args(self) -> dict[str, Any]:
        """The engine arguments these settings add (merged over Switchyard's own)."""
        out: dict[str, Any] = {
            name: getattr(self, name) for name in VLLM_FIELDS if getattr(self, name) is not None
        }
        if self.world_size > 1:
            out["distributed_executor_backend"] = "ray"
        out.update(self.engine_kwargs)
        return out
