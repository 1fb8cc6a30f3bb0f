"""The adapter registry on a real SQLite store: registration checks, resolution of
``base:adapter`` per tenant, what each tenant sees, and adapter prices."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.adapters.peft import AdapterInvalid
from app.adapters.registry import AdapterBase, AdapterRegistry, adapter_price, split_adapter_id
from app.engine.lora import LoraSettings
from app.models.tiny import build_tiny_lora
from app.state.protocol import Price
from app.state.records import AdapterRecord
from app.state.sqlite_store import SqliteStore


@pytest.mark.parametrize(
    ("model", "split"),
    [
        ("m:a", ("m", "a")),
        ("org/model:v1:a-1", ("org/model:v1", "a-1")),  # the last colon splits
        ("m", None),
        ("m:", None),
        (":a", None),
        ("m:a/b", None),
    ],
)
def test_an_adapter_id_is_base_colon_name(model: str, split: tuple[str, str] | None) -> None:
    assert split_adapter_id(model) == split


def registry(tmp_path: Path) -> AdapterRegistry:
    bases = {"m": AdapterBase(LoraSettings(max_lora_rank=8)), "plain": AdapterBase(None)}
    return AdapterRegistry(SqliteStore(tmp_path / "state.db"), bases, clock=lambda: 7.0)


def test_resolution_honours_the_owner_and_the_served_bases(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    src = str(build_tiny_lora(tmp_path / "a", seed=1))

    async def scenario() -> None:
        public = await reg.add("pub", "m", src)
        private = await reg.add("own", "m", src, tenant="acme", price_per_1m_out=2.0)
        assert (public.id, public.rank, public.created_at) == ("m:pub", 8, 7.0)
        assert await reg.resolve("m:pub", "globex") == public
        assert await reg.resolve("m:own", "acme") == private
        assert await reg.resolve("m:own", "globex") is None  # exists for acme only
        assert await reg.resolve("m:nope", "acme") is None
        assert [a.id for a in await reg.visible("acme")] == ["m:own", "m:pub"]
        assert [a.id for a in await reg.visible("globex")] == ["m:pub"]
        reg.bases.pop("m")  # the base is no longer served here
        assert await reg.resolve("m:pub", "acme") is None and await reg.visible("acme") == []

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bad name", "m"), "use 1-64 letters"),
        (("a", "nope"), "not a model this gateway serves"),
        (("a", "plain"), "serves no adapters"),
    ],
)
def test_registration_refuses_with_a_reason(
    tmp_path: Path, args: tuple[str, str], message: str
) -> None:
    src = str(build_tiny_lora(tmp_path / "a", seed=1))
    with pytest.raises(AdapterInvalid, match=message):
        asyncio.run(registry(tmp_path).add(*args, src))


@pytest.mark.parametrize(
    ("source", "message"),
    [("s3://bucket", "give s3://BUCKET/PREFIX"), ("relative/dir", "absolute directory")],
)
def test_sources_must_be_absolute_directories(tmp_path: Path, source: str, message: str) -> None:
    with pytest.raises(AdapterInvalid, match=message):
        asyncio.run(registry(tmp_path).add("a", "m", source))


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        ((None, None), Price(1e-6, 2e-6, 0.5e-6)),  # the base's
        ((4.0, None), Price(4e-6, 2e-6, 4e-6)),  # its own input price, cached too
        ((None, 8.0), Price(1e-6, 8e-6, 0.5e-6)),
    ],
)
def test_an_adapter_price_overrides_the_base_where_set(
    prices: tuple[float | None, float | None], expected: Price
) -> None:
    a = AdapterRecord(id="m:a", base="m", name="a", source="/a", rank=8,
                      price_per_1m_in=prices[0], price_per_1m_out=prices[1])  # fmt: skip
    assert adapter_price(a, Price(1e-6, 2e-6, 0.5e-6)) == pytest.approx(expected)
    assert adapter_price(None, expected) == expected
