"""Workload specs: the validated description of a workload, and the factory.

A spec is a pydantic model selected by ``kind`` (:data:`WorkloadSpec`, a discriminated
union; unknown fields are errors): ``fixed``, ``mix``, ``shared_prefix`` (see
:mod:`app.bench.workloads`), ``trace`` (:mod:`app.bench.trace`) and ``agentic``
(:mod:`app.bench.agentic`). Every spec has ``temperature`` (default 0.0) and
``ignore_eos`` (default True). :func:`parse_workload_spec` validates a dict;
:func:`build_workload` turns a spec into a workload, and rejects a fixed or
shared-prefix shape whose input + output exceeds ``max_model_len`` and an agentic one
whose ``min_steps`` exceeds ``max_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from app.bench.agentic import AgenticWorkload
from app.bench.prompts import PromptFactory
from app.bench.trace import TraceWorkload
from app.bench.workloads import (
    MIX_WEIGHTS,
    FixedWorkload,
    GenEndpoint,
    MixWorkload,
    SharedPrefixWorkload,
    Workload,
)
from app.schema import Strict

__all__ = ["AgenticSpec", "FixedSpec", "MixSpec", "SharedPrefixSpec", "TraceSpec"]
__all__ += ["WorkloadSpec", "build_workload", "parse_workload_spec"]


class _Spec(Strict):
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool = True


class FixedSpec(_Spec):
    kind: Literal["fixed"] = "fixed"
    endpoint: GenEndpoint = "chat"
    input_tokens: int = Field(default=512, ge=1)
    output_tokens: int = Field(default=128, ge=1)


class MixSpec(_Spec):
    kind: Literal["mix"] = "mix"
    endpoint: GenEndpoint = "chat"
    weights: dict[str, float] | None = None
    template_margin: int = Field(default=64, ge=0)


class SharedPrefixSpec(_Spec):
    kind: Literal["shared_prefix"] = "shared_prefix"
    endpoint: GenEndpoint = "chat"
    tenants: int = Field(default=8, ge=1)
    prefix_tokens: int = Field(default=1024, ge=1)
    suffix_tokens: int = Field(default=64, ge=1)
    output_tokens: int = Field(default=128, ge=1)
    distribution: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = Field(default=1.0, gt=0)
    tenant_keys: dict[str, str] | None = None


class TraceSpec(_Spec):
    kind: Literal["trace"] = "trace"
    path: Path
    endpoint: GenEndpoint = "chat"
    """For lines that do not name one."""


class AgenticSpec(_Spec):
    kind: Literal["agentic"] = "agentic"
    embed_model: str | None = None
    """Default: ``build_workload``'s ``embed_model``, else the generation model."""
    question_tokens: int = Field(default=64, ge=1)
    context_tokens: int = Field(default=256, ge=0)
    planner_output: int = Field(default=64, ge=1)
    step_output: int = Field(default=256, ge=1)
    min_steps: int = Field(default=2, ge=1, le=3)
    max_steps: int = Field(default=3, ge=1, le=3)


WorkloadSpec = Annotated[
    FixedSpec | MixSpec | SharedPrefixSpec | TraceSpec | AgenticSpec, Field(discriminator="kind")
]
_SPEC: TypeAdapter[WorkloadSpec] = TypeAdapter(WorkloadSpec)


def parse_workload_spec(data: Mapping[str, Any]) -> WorkloadSpec:
    """Validate a spec dict (``kind`` selects the model; unknown fields are errors)."""
    return _SPEC.validate_python(data)


def _check_fits(what: str, total: int, max_model_len: int) -> None:
    if total > max_model_len:
        raise ValueError(f"{what}: input + output = {total} exceeds max_model_len {max_model_len}")


def build_workload(
    spec: WorkloadSpec,
    model: str,
    factory: PromptFactory,
    max_model_len: int,
    seed: int,
    *,
    embed_model: str | None = None,
) -> Workload:
    """The workload of ``spec``; ``embed_model`` is the agentic default embedding model."""
    t, eos = spec.temperature, spec.ignore_eos
    if isinstance(spec, FixedSpec):
        _check_fits("fixed", spec.input_tokens + spec.output_tokens, max_model_len)
        return FixedWorkload(
            model, spec.endpoint, spec.input_tokens, spec.output_tokens, factory, seed,
            temperature=t, ignore_eos=eos,
        )  # fmt: skip
    if isinstance(spec, MixSpec):
        weights = MIX_WEIGHTS if spec.weights is None else spec.weights
        return MixWorkload(
            model, factory, seed, max_model_len, endpoint=spec.endpoint, weights=weights,
            template_margin=spec.template_margin, temperature=t, ignore_eos=eos,
        )  # fmt: skip
    if isinstance(spec, SharedPrefixSpec):
        total = spec.prefix_tokens + spec.suffix_tokens + spec.output_tokens
        _check_fits("shared_prefix", total, max_model_len)
        return SharedPrefixWorkload(
            model, factory, seed, tenants=spec.tenants, prefix_tokens=spec.prefix_tokens,
            suffix_tokens=spec.suffix_tokens, output_tokens=spec.output_tokens,
            distribution=spec.distribution, zipf_s=spec.zipf_s, tenant_keys=spec.tenant_keys,
            endpoint=spec.endpoint, temperature=t, ignore_eos=eos,
        )  # fmt: skip
    if isinstance(spec, TraceSpec):
        return TraceWorkload.from_jsonl(
            spec.path, model, factory, seed, endpoint=spec.endpoint, temperature=t, ignore_eos=eos
        )
    if spec.min_steps > spec.max_steps:
        raise ValueError("min_steps exceeds max_steps")
    return AgenticWorkload(
        model, spec.embed_model or embed_model or model, factory, seed,
        question_tokens=spec.question_tokens,
        context_tokens=spec.context_tokens, planner_output=spec.planner_output,
        step_output=spec.step_output, min_steps=spec.min_steps, max_steps=spec.max_steps,
        temperature=t, ignore_eos=eos,
    )  # fmt: skip
