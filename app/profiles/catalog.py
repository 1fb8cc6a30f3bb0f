"""Serving profiles: named, validated bundles of one pool's knobs (seed 003 §2.3).

Three pipelines, each tuned for one goal and carrying the SLO it is tuned to:

- ``throughput`` (pipeline A, batch and offline work): large batches and prefill
  budgets, a deep queue, replicas chosen by load with prefix affinity as a tie-breaker.
  Its SLO is an end-to-end p95; what it maximises is goodput (requests per second
  that meet it).
- ``interactive`` (pipeline B, chat): a small batch and small prefill chunks so a
  decode step stays short (ITL), a batch the KV cache holds whole (no preemption), a
  short queue that refuses (503 with Retry-After) rather than hold a request past its
  TTFT SLO, and replicas chosen by load first.
- ``long_context`` (pipeline C, long documents and agents): a long ``max_model_len``,
  chunked prefill with a long-prefill threshold so one long prompt shares each step
  with other users' decode (seed 000 CH4-6 Q1 ④), prefix caching, replicas chosen by
  prefix first, and the P/D rule's threshold (``disaggregation.min_uncached_tokens``)
  where the pool is disaggregated.

Resolution (``app.profiles.resolve``): a model names a profile; every knob the model
leaves unset comes from the bundle (a tuned profile file's values over this
catalogue's); a knob set on the model wins. The catalogue's values are starting
points sized for SmolLM2-135M; what was measured on this project's 2-core CPU is in
``profiles/*-cpu.yaml`` (written by ``switchyard profile tune`` or justified by
``benchmarks.profiles_kv``; reports in docs/benchmarks/), which the CPU pool config
references. ``switchyard profile tune`` re-measures on the user's own hardware.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schema import StrictFrozen

ProfileName = Literal["throughput", "interactive", "long_context"]
PROFILES: tuple[ProfileName, ...] = ("throughput", "interactive", "long_context")


class Slo(StrictFrozen):
    """The objective a profile is tuned to (p95s, milliseconds); None: not part of it."""

    ttft_p95_ms: float | None = Field(default=None, gt=0)
    itl_p95_ms: float | None = Field(default=None, gt=0)
    e2e_p95_ms: float | None = Field(default=None, gt=0)

    def header(self) -> str:
        """``ttft_p95_ms=1500,itl_p95_ms=150`` (the set fields, for a response header)."""
        return ",".join(f"{k}={v:g}" for k, v in self.model_dump(exclude_none=True).items())


class Backpressure(StrictFrozen):
    """The answer to a request the pool's queue (``max_queued_requests``) cannot take:
    Ray Serve's ``BackpressureConfig``, which the ingress turns into this status with
    ``Retry-After``."""

    status_code: Literal[503, 429] = 503
    retry_after_s: float = Field(default=1.0, ge=0)


class Measured(StrictFrozen):
    """What ``profile tune`` measured on the hardware it ran on (validation uses it)."""

    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="Prompt tokens one replica prefills per second."
    )
    hardware: str | None = Field(default=None, description="Where it was measured.")


class Bundle(StrictFrozen):
    """Every knob a profile owns, named as the model's own field (None: not owned).
    A profile file written by ``switchyard profile tune`` is one of these."""

    profile: ProfileName
    slo: Slo = Field(default_factory=Slo)
    # engine
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int | None = Field(default=None, ge=0)
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=16 * 1024**2)
    # Serve
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    max_queued_requests: int | None = Field(default=None, ge=-1)
    backpressure: Backpressure | None = None
    target_ongoing_requests: float | None = Field(
        default=None, gt=0, description="The autoscaling target, where the pool autoscales."
    )
    # replica routing (Switchyard's router is on for a profiled pool unless `routing: off`)
    routing_scorers: dict[str, float] | None = None
    # prefill/decode: the per-request rule's threshold, where the pool is disaggregated
    pd_min_uncached_tokens: int | None = Field(default=None, ge=1)
    measured: Measured = Field(default_factory=Measured)


GIB = 1024**3

# Starting values (SmolLM2-135M, float32 KV budgets for CPU); measured CPU values are in
# profiles/*-cpu.yaml; re-tune on a GPU.
CATALOGUE: dict[ProfileName, Bundle] = {
    "throughput": Bundle(
        profile="throughput",
        slo=Slo(e2e_p95_ms=60_000),
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        max_model_len=2048,
        kv_cache_memory_bytes=2 * GIB,
        max_ongoing_requests=96,
        max_queued_requests=1024,
        backpressure=Backpressure(status_code=429, retry_after_s=10),
        target_ongoing_requests=48,
        routing_scorers={"load": 2.0, "prefix": 1.0, "session": 4.0, "adapter": 3.0},
    ),
    "interactive": Bundle(
        profile="interactive",
        slo=Slo(ttft_p95_ms=1500, itl_p95_ms=150),
        max_num_seqs=8,
        max_num_batched_tokens=512,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=256,
        enable_prefix_caching=True,
        max_model_len=2048,
        kv_cache_memory_bytes=1 * GIB,
        max_ongoing_requests=8,
        max_queued_requests=16,
        backpressure=Backpressure(status_code=503, retry_after_s=1),
        target_ongoing_requests=6,
        routing_scorers={
            "load": 3.0,
            "prefill": 3.0,
            "prefix": 1.0,
            "session": 4.0,
            "adapter": 3.0,
        },
    ),
    "long_context": Bundle(
        profile="long_context",
        slo=Slo(ttft_p95_ms=10_000, itl_p95_ms=300),
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=512,
        enable_prefix_caching=True,
        max_model_len=8192,
        kv_cache_memory_bytes=2 * GIB,
        max_ongoing_requests=16,
        max_queued_requests=64,
        backpressure=Backpressure(status_code=503, retry_after_s=5),
        target_ongoing_requests=12,
        routing_scorers={
            "prefix": 4.0,
            "load": 1.0,
            "prefill": 1.0,
            "session": 4.0,
            "adapter": 3.0,
        },
        pd_min_uncached_tokens=1024,
    ),
}
