# LoRA adapters on one engine: vLLM multi-LoRA, adapters loaded on first use and
# evicted least recently used, without a restart.
#
# Rule: an adapter (its name ``base:adapter`` and its files' directory) gets one
# positive integer id for the engine's life (vLLM keys its adapter caches by that id);
# an adapter registered again from other files is another adapter to the engine, with
# another id and another name (``<name>@<id>``: vLLM keys prefix-cache blocks by it).
# Before a request runs with an adapter the engine asks vLLM which adapters its
# host-memory cache holds (``list_loras``); a missing one is loaded there first
# (``add_lora``: a cold load, timed and counted) and vLLM evicts the least recently used
# beyond ``max_cpu_loras``. A batch mixes at most ``max_loras`` adapters on the
# accelerator. Concurrent first requests for one adapter load it once.
#
# Parameters: ``max_loras``, ``max_cpu_loras``, ``max_lora_rank`` (``LoraSettings``).
"""Multi-LoRA settings of a model and the engine's book of its adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from pydantic import Field

from app.schema import StrictFrozen

# vLLM's accepted ranks (LoRAConfig.max_lora_rank).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraSettings(StrictFrozen):
    """A model's ``lora:`` block: present, its replicas serve LoRA adapters of it."""

    max_loras: int = Field(
        default=4, ge=1, description="Adapters one batch may mix (held on the accelerator)."
    )
    max_cpu_loras: int = Field(
        default=8,
        ge=1,
        description="Adapters held in host memory; the least recently used beyond it is "
        "evicted and loaded again on its next request.",
    )
    max_lora_rank: int = Field(
        default=16, description=f"Largest adapter rank the replicas accept ({LORA_RANKS})."
    )

    def model_post_init(self, __context: object) -> None:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {LORA_RANKS}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be at least max_loras")

    def vllm_args(self) -> dict[str, object]:
        return {
            "enable_lora": True,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
        }


@dataclass
class AdapterBook:
    """Ids, loads and what the engine held at its last look."""

    _ids: dict[str, int] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    held: tuple[str, ...] = ()  # adapter names in the engine's host cache, last seen
    loads_total: int = 0
    load_seconds_total: float = 0.0

    def id_for(self, name: str, path: str = "") -> int:
        key = f"{name}\n{path}"
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids) + 1
        return got

    def _names(self, ids: Iterable[int]) -> tuple[str, ...]:
        by_id = {i: key.split("\n", 1)[0] for key, i in self._ids.items()}
        return tuple(sorted({by_id[i] for i in ids if i in by_id}))

    async def ensure(
        self,
        name: str,
        path: str,
        held_ids: Callable[[], Awaitable[Iterable[int]]],
        load: Callable[[], Awaitable[None]],
        clock: Callable[[], float],
    ) -> float | None:
        """Make sure the engine holds ``name`` (from ``path``); the seconds this call
        spent loading it (a cold load), None when the engine held it."""
        lora_id = self.id_for(name, path)
        ids = set(await held_ids())
        if lora_id in ids:
            self.held = self._names(ids)
            return None
        lock = self._locks.setdefault(f"{name}\n{path}", asyncio.Lock())
        async with lock:
            ids = set(await held_ids())
            if lora_id in ids:  # another request loaded it meanwhile
                self.held = self._names(ids)
                return None
            started = clock()
            await load()
            seconds = clock() - started
            self.load_seconds_total += seconds
            self.loads_total += 1
            self.held = self._names(set(await held_ids()))
            return seconds
