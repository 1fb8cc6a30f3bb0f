"""A model's ``disaggregation:`` block: its prefill role, the KV connector between the
roles, and the per-request rule (``app.disagg.rule``).

The model's own deployment is the decode role (its ``num_replicas``, engine knobs and
``routing:``); ``prefill`` describes a second deployment of the same model whose
replicas only prefill. Both roles are full engines with the connector on both sides
(vLLM ``kv_role: kv_both``), so a decode replica can serve any request whole.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.engine.kv_transfer import KvConnector
from app.scheduler.config import ReplicaRouting
from app.schema import StrictFrozen


class PrefillRole(StrictFrozen):
    num_replicas: int = Field(default=1, ge=1)
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Default: the model's max_num_seqs."
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=16 * 1024**2, description="Default: the model's."
    )
    max_ongoing_requests: int = Field(default=64, ge=1)
    routing: ReplicaRouting = Field(
        default_factory=lambda: ReplicaRouting(scorers={"prefix": 2.0, "load": 1.0}),
        description="How a prefill replica is picked: prefix affinity and load.",
    )


class Disaggregation(StrictFrozen):
    prefill: PrefillRole = Field(default_factory=PrefillRole)
    connector: KvConnector = Field(default_factory=KvConnector)
    mode: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="auto: the per-request rule; always: every request prefills on the "
        "prefill role (Ray Serve LLM's P/D); never: the decode role serves everything.",
    )
    min_uncached_tokens: int = Field(
        default=512,
        ge=1,
        description="Disaggregate only a prompt with at least this many tokens the "
        "decode side does not hold.",
    )
    max_prefill_in_flight: int = Field(
        default=4,
        ge=1,
        description="Prefill legs per prefill replica (from one ingress replica) beyond "
        "which requests are served whole on the decode side.",
    )
    max_decode_in_flight: int = Field(
        default=8,
        ge=1,
        description="Decode replicas with this many requests in flight each (from one "
        "ingress replica) are busy: short prompts are then prefilled remotely too.",
    )
    prefill_deadline_s: float = Field(
        default=10.0,
        gt=0,
        description="The prefill leg's deadline: past it, or when it fails, the request "
        "is served whole on the decode side (once, billed once).",
    )
    transfer_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="After the prefill leg, the decode leg's first token must come within "
        "this (it includes pulling the KV); past it, or when the pull fails, the request "
        "is served whole on the decode side. Both deadlines are cut to half of the "
        "dispatch's first-token budget, so a local attempt keeps the other half.",
    )
