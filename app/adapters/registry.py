"""The adapter registry: which LoRA adapters exist, of which base, whose, at what price.

Rule: an adapter is registered under ``base:name`` (``name``: letters, digits, ``._-``)
for a base model served with a ``lora:`` block, from a directory its replicas can read
(or an ``s3://`` prefix, fetched here once to be checked; ``app.adapters.sources``),
checked here (``app.adapters.peft``). A request's model id that is no served model or
alias is looked up here; an adapter with a tenant exists only for that tenant (others
get the 404 of an unknown model, which reveals nothing). Records live in the state
store, so every ingress replica sees an adapter as soon as it is added, without a
restart.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.adapters.peft import AdapterInvalid, base_weight_names, check_adapter, inspect_adapter
from app.adapters.sources import is_s3, local_dir, location
from app.engine.lora import LoraSettings
from app.models.s3 import S3SourceError
from app.state.protocol import Price, StateStore
from app.state.records import AdapterRecord

NAME = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


@dataclass(frozen=True)
class S3Defaults:
    """Object storage for ``s3://`` adapter sources: its server (None: AWS), region, and
    this node's directory to fetch adapters into (checked at registration)."""

    endpoint_url: str | None = None
    region: str | None = None
    adapters_dir: Path | None = None


@dataclass(frozen=True)
class AdapterBase:
    """A served model adapters may extend: its LoRA settings (None: it serves none) and
    its weights directory on this node, when known (target modules are checked there)."""

    lora: LoraSettings | None
    weights: Path | None = None


def split_adapter_id(model: str) -> tuple[str, str] | None:
    """``base:name`` → (base, name); None when ``model`` cannot name an adapter."""
    base, sep, name = model.rpartition(":")
    return (base, name) if sep and base and NAME.match(name) else None


class AdapterRegistry:
    def __init__(
        self,
        store: StateStore,
        bases: Mapping[str, AdapterBase],
        clock: Callable[[], float] = time.time,
        s3: S3Defaults | None = None,
    ) -> None:
        self.store = store
        self.bases = dict(bases)
        self._clock = clock
        self.s3 = s3 or S3Defaults()

    async def add(
        self,
        name: str,
        base: str,
        source: str,
        tenant: str | None = None,
        price_per_1m_in: float | None = None,
        price_per_1m_out: float | None = None,
    ) -> AdapterRecord:
        """Validate and register; raises ``AdapterInvalid`` saying what is wrong."""
        if not NAME.match(name):
            raise AdapterInvalid(f"adapter name {name!r}: use 1-64 letters, digits, '.', '_', '-'")
        served = self.bases.get(base)
        if served is None:
            raise AdapterInvalid(f"{base!r} is not a model this gateway serves")
        if served.lora is None:
            raise AdapterInvalid(f"model {base!r} serves no adapters: give it a lora: block")
        record = AdapterRecord(
            id=f"{base}:{name}", base=base, name=name, source=source, tenant=tenant, rank=0,
            price_per_1m_in=price_per_1m_in, price_per_1m_out=price_per_1m_out,
            created_at=self._clock(),
        )  # fmt: skip
        if is_s3(source):
            record = record.model_copy(
                update={"s3_endpoint_url": self.s3.endpoint_url, "s3_region": self.s3.region}
            )
            try:
                location(record)
                path = await asyncio.to_thread(local_dir, record, self.s3.adapters_dir)
            except (ValueError, S3SourceError) as exc:
                raise AdapterInvalid(str(exc)) from None
        else:
            path = Path(source)
            if not path.is_absolute():
                raise AdapterInvalid(f"source {source!r}: give an absolute directory or s3://")
        files = inspect_adapter(path)
        names = base_weight_names(served.weights) if served.weights is not None else None
        check_adapter(files, served.lora.max_lora_rank, names)
        for price in (price_per_1m_in, price_per_1m_out):
            if price is not None and price < 0:
                raise AdapterInvalid("prices must be >= 0")
        record = record.model_copy(update={"rank": files.rank})
        await self.store.put_adapter(record)
        return record

    async def resolve(self, model: str, tenant: str | None) -> AdapterRecord | None:
        """The adapter ``model`` names for ``tenant``, if it names one it may use."""
        if split_adapter_id(model) is None:
            return None
        record = await self.store.get_adapter(model)
        if record is None or not record.visible_to(tenant) or record.base not in self.bases:
            return None
        return record

    async def visible(self, tenant: str | None) -> list[AdapterRecord]:
        """The adapters of served bases that ``tenant`` may use."""
        found = await self.store.list_adapters()
        return [a for a in found if a.base in self.bases and a.visible_to(tenant)]


def adapter_price(adapter: AdapterRecord | None, base: Price) -> Price:
    """US dollars per token of a request: the adapter's own prices where it has them
    (its input price also for cached input), else the base model's."""
    if adapter is None:
        return base
    price_in = base.input if adapter.price_per_1m_in is None else adapter.price_per_1m_in / 1e6
    cached = base.cached_input if adapter.price_per_1m_in is None else price_in
    price_out = base.output if adapter.price_per_1m_out is None else adapter.price_per_1m_out / 1e6
    return Price(price_in, price_out, cached)
