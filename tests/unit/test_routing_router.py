from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.routing.router import ModelRouter
from app.routing.spec import ModelProfile, RoutesFileError, load_routes
from app.routing.table import LocalModel, RouteRequest, RouteTable, default_spec

LOCAL = {m: LocalModel(f"LLMServer-{m}", "generate", 512) for m in ("a", "b")}
V1 = """
pools: {pa: {kind: local, model: a}, pb: {kind: local, model: b}}
models: {chat: {pool: pa}}
"""
V2 = V1.replace("{chat: {pool: pa}}", "{chat: {pool: pb}}")


def _router(tmp_path: Path, text: str = V1) -> tuple[ModelRouter, Path]:
    path = tmp_path / "routes.yaml"
    path.write_text(text)
    table = RouteTable(0, load_routes(path), LOCAL)  # the builder's; the router reads v1
    return ModelRouter(table, str(path), check_every_s=0.0), path


def _rewrite(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()  # make sure the signature changes even within one mtime tick
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_serves_the_table_only_when_newer(tmp_path: Path) -> None:
    router, _ = _router(tmp_path)
    table = router.table(-1)
    assert table is not None and table.version == 1
    assert router.table(1) is None
    decision = router.route(RouteRequest("chat"))
    assert decision is not None and decision.pool == "pa"


def test_the_router_reads_the_file_on_its_own_node(tmp_path: Path) -> None:
    """The builder may not have the file (it lives where the router runs): its table is
    the default, and the router's first table is the file's."""
    path = tmp_path / "routes.yaml"
    path.write_text(V2)
    builders = RouteTable(1, default_spec(LOCAL, {m: ModelProfile() for m in LOCAL}), LOCAL)
    router = ModelRouter(builders, str(path), check_every_s=0.0)
    table = router.table(1)
    assert table is not None and table.version == 2
    assert [r.model for r in table.models()] == ["chat"]
    decision = table.decide(RouteRequest("chat"))
    assert decision is not None and decision.pool == "pb"


@pytest.mark.parametrize(
    ("text", "says"),
    [(None, "No such file"), (V1.replace("pool: pa", "pool: nowhere"), "models.chat.pool")],
)
def test_a_missing_or_bad_file_fails_the_router_start(
    tmp_path: Path, text: str | None, says: str
) -> None:
    path = tmp_path / "routes.yaml"
    if text is not None:
        path.write_text(text)
    builders = RouteTable(1, default_spec(LOCAL, {m: ModelProfile() for m in LOCAL}), LOCAL)
    with pytest.raises((RoutesFileError, ValueError), match=says):
        ModelRouter(builders, str(path))


def test_a_changed_file_becomes_the_next_version(tmp_path: Path) -> None:
    router, path = _router(tmp_path)
    _rewrite(path, V2)
    table = router.table(1)
    assert table is not None and table.version == 2
    decision = table.decide(RouteRequest("chat"))
    assert decision is not None and decision.pool == "pb"
    assert router.table(2) is None  # unchanged since


def test_an_invalid_file_keeps_the_current_table(tmp_path: Path) -> None:
    router, path = _router(tmp_path)
    _rewrite(path, V1.replace("pool: pa", "pool: nowhere"))
    assert router.table(1) is None
    assert router.last_error is not None and "models.chat.pool" in router.last_error
    _rewrite(path, V1.replace("model: b", "model: not-served"))
    assert router.table(1) is None
    assert "pools.pb.model" in (router.last_error or "")
    _rewrite(path, V2)  # fixed: picked up
    table = router.table(1)
    assert table is not None and table.version == 2 and router.last_error is None


def test_user_config_reloads_too(tmp_path: Path) -> None:
    router, _ = _router(tmp_path)
    spec = load_routes(tmp_path / "routes.yaml").model_dump()
    spec["models"]["chat"]["pool"] = "pb"
    router.reconfigure({"routes": spec})
    table = router.table(1)
    assert table is not None and table.version == 2
    router.reconfigure({"routes": {"pools": {}, "models": {}}})
    assert router.table(2) is None and router.last_error is not None
