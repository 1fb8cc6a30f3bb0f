# Eviction policies of the SIMULATED prefix cache (simulated_cache.py); vLLM's own is
# fixed LRU. Experiments only: which cached prefix to give up when the cache is full.
#
# Rule. Each eviction frees ONE block, always the tail (a leaf of the prefix tree: no
# cached block continues it) of a chain, as vLLM frees a request's blocks tail-first, so
# a shortened chain still hits on what remains and no cached block is ever unreachable.
# The cache offers every chain tail as a candidate — its chain's length in blocks (the
# tail's depth), the chain's last use, its owner (the cache salt of the tenant that
# stored it: the engine sees salts, not tenant names) and its rank in LRU order — and
# the policy names the tail to drop; the cache repeats until it is within capacity.
# The policy picks the victim CHAIN; the unit evicted is always one tail block of it:
#   * ``lru``: the least recently used tail (the cache's default, and what an unset
#     policy does via the cache's own O(1) path: the LRU block is always a chain tail).
#   * ``largest_first``: the tail of the longest chain (most blocks).
#   * ``cheapest_recompute_first``: the tail of the chain whose tokens are cheapest to
#     prefill again (``recompute_s(tokens)``; with the linear timing model: the shortest).
#   * ``paid_first`` (paid tenants' entries kept first): the LRU tail among chains whose
#     owner is not a paid salt; a paid chain only when no other chain is left.
#   * ``weighted`` (seed 003 §3.4): the tail with the highest
#       w_idle·idle + w_size·size + w_recompute·(1 − recompute) + w_priority·(1 − priority)
#     each term min-max normalised over the current candidates (0 when all are equal):
#     idle = now − last use, size = chain blocks, recompute = recompute_s of the chain's
#     tokens, priority = 1 for a paid owner, else 0. Default weights 0.40/0.25/0.20/0.15.
#     With a linear prefill cost, size and recompute are the same quantity, so their
#     terms offset (net weight w_size − w_recompute on chain length).
# Ties go to the least recently used candidate, so ``weighted`` with weights (1,0,0,0)
# is LRU.
#
# Parameters: ``paid`` (owner salts of paid tenants), ``recompute_s`` (tokens → prefill
# seconds; the engine passes its profile's), ``block_size``, ``EvictionWeights``.
"""Victim choice for ``PrefixCache``: LRU, largest-first, cheapest-recompute-first,
paid-first and the seed's weighted score (simulation only)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import Field, model_validator

from app.schema import StrictFrozen

EvictionName = Literal["lru", "largest_first", "cheapest_recompute_first", "paid_first", "weighted"]
EVICTION_POLICIES: tuple[EvictionName, ...] = (
    "lru",
    "largest_first",
    "cheapest_recompute_first",
    "paid_first",
    "weighted",
)


class EvictionWeights(StrictFrozen):
    """Weights of the ``weighted`` score (seed 003 §3.4's learning example by default)."""

    idle: float = Field(default=0.40, ge=0)
    size: float = Field(default=0.25, ge=0)
    recompute_inverse: float = Field(default=0.20, ge=0)
    priority_inverse: float = Field(default=0.15, ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> EvictionWeights:
        if self.idle + self.size + self.recompute_inverse + self.priority_inverse <= 0:
            raise ValueError("at least one eviction weight must be > 0")
        return self


@dataclass(frozen=True)
class Candidate:
    """A chain tail the cache may evict."""

    block: bytes  # the tail block's hash (what is evicted)
    blocks: int  # the chain's length in blocks, root to this tail
    last_used: float  # the cache clock at the chain's last touch
    owner: str | None  # cache salt of the tenant that stored it
    lru_rank: int  # 0: least recently used of all cached blocks


class EvictionPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        """The tail block to evict; ``candidates`` come least recently used first."""
        ...


def _linear(tokens: int) -> float:
    return float(tokens)


@dataclass(frozen=True)
class Lru:
    name: str = "lru"

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        return candidates[0].block


@dataclass(frozen=True)
class LargestFirst:
    name: str = "largest_first"

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        return max(candidates, key=lambda c: (c.blocks, -c.lru_rank)).block


@dataclass(frozen=True)
class CheapestRecomputeFirst:
    block_size: int = 1
    recompute_s: Callable[[int], float] = _linear
    name: str = "cheapest_recompute_first"

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        cost = self.recompute_s
        return min(candidates, key=lambda c: (cost(c.blocks * self.block_size), c.lru_rank)).block


@dataclass(frozen=True)
class PaidFirst:
    paid: Collection[str] = frozenset()
    name: str = "paid_first"

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        return next((c.block for c in candidates if c.owner not in self.paid), candidates[0].block)


def _normalised(values: list[float]) -> list[float]:
    low, high = min(values), max(values)
    if high <= low:
        return [0.0] * len(values)
    return [(v - low) / (high - low) for v in values]


@dataclass(frozen=True)
class Weighted:
    weights: EvictionWeights = field(default_factory=EvictionWeights)
    paid: Collection[str] = frozenset()
    block_size: int = 1
    recompute_s: Callable[[int], float] = _linear
    name: str = "weighted"

    def scores(self, candidates: Sequence[Candidate], now: float) -> list[float]:
        """Each candidate's eviction score (higher: evicted first)."""
        w = self.weights
        idle = _normalised([now - c.last_used for c in candidates])
        size = _normalised([float(c.blocks) for c in candidates])
        cost = _normalised([self.recompute_s(c.blocks * self.block_size) for c in candidates])
        prio = _normalised([1.0 if c.owner in self.paid else 0.0 for c in candidates])
        spread = [max(cost) > min(cost), max(prio) > min(prio)]
        return [
            w.idle * i
            + w.size * s
            + w.recompute_inverse * ((1.0 - r) if spread[0] else 0.0)
            + w.priority_inverse * ((1.0 - p) if spread[1] else 0.0)
            for i, s, r, p in zip(idle, size, cost, prio, strict=True)
        ]

    def victim(self, candidates: Sequence[Candidate], now: float) -> bytes:
        scores = self.scores(candidates, now)
        best = max(range(len(candidates)), key=lambda k: (scores[k], -candidates[k].lru_rank))
        return candidates[best].block


def make_policy(
    name: EvictionName,
    *,
    weights: EvictionWeights | None = None,
    paid: Collection[str] = frozenset(),
    block_size: int = 1,
    recompute_s: Callable[[int], float] = _linear,
) -> EvictionPolicy | None:
    """The policy called ``name``; None for ``lru`` (the cache's own O(1) LRU path,
    which evicts exactly what ``Lru`` would)."""
    if name == "lru":
        return None
    if name == "largest_first":
        return LargestFirst()
    if name == "cheapest_recompute_first":
        return CheapestRecomputeFirst(block_size, recompute_s)
    if name == "paid_first":
        return PaidFirst(frozenset(paid))
    return Weighted(weights or EvictionWeights(), frozenset(paid), block_size, recompute_s)
