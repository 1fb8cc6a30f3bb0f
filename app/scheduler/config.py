"""A pool's ``routing:`` block: how Switchyard picks the replica of one LLMServer
deployment. Every field has a default and a one-line meaning; unknown fields are errors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from app.schema import StrictFrozen

SCORERS = ("prefix", "load", "session", "adapter", "prefill")


class PrefixRouting(StrictFrozen):
    mode: Literal["approximate", "precise"] = Field(
        default="approximate",
        description="approximate: the router remembers the block hashes it sent to each "
        "replica (what the engine may hold); precise: also what each engine reports "
        "storing and evicting (its KV-cache events; block_size must then be the engine's "
        "KV block size).",
    )
    block_size: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Tokens per hashed block, a multiple of the engine's KV block size "
        "(vLLM: 16 on GPU, 128 on CPU): the routing granularity. Smaller is finer and "
        "costs more per request (an 8k-token prompt is 128 blocks at 64).",
    )
    max_blocks: int = Field(
        default=262_144, ge=1, description="Block hashes remembered per replica (LRU)."
    )


class LoadRouting(StrictFrozen):
    abs_threshold: float = Field(
        default=32.0,
        ge=0,
        description="Balance wins over affinity when the busiest candidate has more than "
        "this many requests in flight above the least busy ...",
    )
    rel_threshold: float = Field(
        default=1.5, ge=1.0, description="... and more than this times its load."
    )
    tokens_per_request: int = Field(
        default=512,
        ge=1,
        description="Booked prompt tokens that weigh as much as one request in flight.",
    )


class SessionRouting(StrictFrozen):
    key: Literal["session", "session_or_user", "none"] = Field(
        default="session_or_user",
        description="What keeps a conversation on one replica: the x-session-id header, "
        "else the OpenAI `user` field (session_or_user), only the header, or nothing.",
    )
    epsilon: float = Field(
        default=0.25,
        gt=0,
        description="Bounded load: a session's replica takes it only while its load is "
        "at most (1 + epsilon) × the mean; else the next replica on the ring.",
    )
    virtual_nodes: int = Field(default=100, ge=1, le=1000, description="Ring points per replica.")


class AdapterRouting(StrictFrozen):
    hot_rps: float = Field(
        default=2.0,
        gt=0,
        description="An adapter this router sends more requests per second with is hot: "
        "it is kept loaded on at least min_replicas replicas.",
    )
    min_replicas: int = Field(default=2, ge=1, description="Warm replicas of a hot adapter.")
    saturated_in_flight: int = Field(
        default=8,
        ge=1,
        description="Holders of an adapter with this many requests in flight each are "
        "full: the adapter may be loaded on another replica.",
    )
    recent_s: float = Field(
        default=10.0,
        gt=0,
        description="A replica sent an adapter's request this recently holds it (its "
        "stats, every few seconds, say so later).",
    )


class EjectionRouting(StrictFrozen):
    consecutive_failures: int = Field(
        default=3,
        ge=1,
        description="A replica whose last this-many judged legs failed (P/D: its prefill "
        "or KV hand-off failed or missed its deadline) is left out for cooldown_s.",
    )
    cooldown_s: float = Field(
        default=30.0,
        gt=0,
        description="How long an ejected replica is left out; after it, one more failure "
        "ejects it again, one success clears it.",
    )


class ReplicaRouting(StrictFrozen):
    """Present on a model: Switchyard's router picks the replica; absent: Ray Serve's."""

    scorers: dict[str, float] = Field(
        default_factory=lambda: {
            "prefix": 2.0,
            "load": 1.0,
            "session": 4.0,
            "adapter": 3.0,
            "prefill": 1.0,
        },
        description="Scorer weights (prefix, load, session, adapter, prefill); 0 or absent "
        "switches one off.",
    )
    prefix: PrefixRouting = Field(default_factory=PrefixRouting)
    load: LoadRouting = Field(default_factory=LoadRouting)
    session: SessionRouting = Field(default_factory=SessionRouting)
    adapter: AdapterRouting = Field(default_factory=AdapterRouting)
    ejection: EjectionRouting = Field(default_factory=EjectionRouting)

    @field_validator("scorers")
    @classmethod
    def _known(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(weights) - set(SCORERS))
        if unknown:
            raise ValueError(f"unknown scorers {unknown}; known: {list(SCORERS)}")
        negative = sorted(k for k, w in weights.items() if w < 0)
        if negative:
            raise ValueError(f"scorer weights must be >= 0: {negative}")
        return {k: w for k, w in weights.items() if w > 0}
