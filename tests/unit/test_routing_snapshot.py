from __future__ import annotations

import asyncio

import pytest

from app.routing.snapshot import RouteSnapshot
from app.routing.spec import RoutesSpec
from app.routing.table import RouteRequest, RouteTable


def _table(version: int, models: list[str]) -> RouteTable:
    spec = RoutesSpec.model_validate(
        {
            "pools": {f"p{m}": {"kind": "local", "model": m} for m in models},
            "models": {m: {"pool": f"p{m}"} for m in models},
        }
    )
    return RouteTable(version, spec)


V1 = _table(1, ["a"])
V2 = _table(2, ["a", "b"])
A, B = RouteRequest("a"), RouteRequest("b")


class _Method:
    def __init__(self, router: _FakeRouter) -> None:
        self.router = router

    async def remote(self, known_version: int) -> RouteTable | None:
        self.router.calls += 1
        if self.router.fail:
            raise ConnectionError("router down")
        return None if known_version == self.router.current.version else self.router.current


class _FakeRouter:
    """Stands in for the router deployment's handle (``router.table.remote(v)``)."""

    def __init__(self, current: RouteTable) -> None:
        self.current = current
        self.calls = 0
        self.fail = False
        self.table = _Method(self)


async def test_hit_needs_no_router_call() -> None:
    router = _FakeRouter(V1)
    snap = RouteSnapshot(router, V1, refresh_s=60)
    assert (await snap.decide(A)) is not None
    assert router.calls == 0


async def test_miss_refreshes_once_per_interval() -> None:
    router = _FakeRouter(V2)
    snap = RouteSnapshot(router, V1, refresh_s=0.0)
    decision = await snap.decide(B)
    assert decision is not None and decision.pool == "pb"
    assert snap.table.version == 2

    slow = RouteSnapshot(_FakeRouter(V2), V1, refresh_s=60)
    assert (await slow.decide(B)) is None  # within the interval: no refresh


async def test_refresh_failure_keeps_last_table() -> None:
    router = _FakeRouter(V2)
    router.fail = True
    snap = RouteSnapshot(router, V1, refresh_s=0.0)
    assert (await snap.decide(B)) is None
    assert snap.table is V1


async def test_background_refresh_when_due() -> None:
    router = _FakeRouter(V2)
    snap = RouteSnapshot(router, V1, refresh_s=0.0)
    assert (await snap.decide(A)) is not None
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert snap.table.version == 2


async def test_the_first_snapshot_is_the_routers_or_an_error() -> None:
    """A replica starts from the router's table (it read the routes file on its node);
    when the router cannot answer, the replica's start fails instead of serving the
    builder's table."""
    snap = RouteSnapshot(_FakeRouter(V2), V1, refresh_s=60)
    await snap.refresh(strict=True)
    assert snap.table.version == 2
    router = _FakeRouter(V2)
    router.fail = True
    with pytest.raises(ConnectionError):
        await RouteSnapshot(router, V1, refresh_s=60).refresh(strict=True)
