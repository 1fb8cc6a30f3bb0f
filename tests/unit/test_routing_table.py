from __future__ import annotations

import pytest

from app.routing.router import ModelRouter
from app.routing.table import ModelRoute, RouteDecision, RouteTable

TABLE = RouteTable(
    version=3,
    routes={
        "a": ModelRoute("a", "LLMServer-a", "generate", 2048),
        "e": ModelRoute("e", "LLMServer-e", "embed", 256),
    },
    default_model="a",
)


@pytest.mark.parametrize(
    ("model", "decision"),
    [
        ("a", RouteDecision("a", "LLMServer-a", "default")),
        ("e", RouteDecision("e", "LLMServer-e", "default")),
        ("A", None),
        ("", None),
    ],
)
def test_decide(model: str, decision: RouteDecision | None) -> None:
    assert TABLE.decide(model) == decision


def test_models_sorted() -> None:
    assert [r.model for r in TABLE.models()] == ["a", "e"]


def test_router_serves_table_only_when_newer() -> None:
    router = ModelRouter(TABLE)
    assert router.table(-1) is TABLE
    assert router.table(3) is None
    assert router.route("a") == TABLE.decide("a")
    assert router.route("zzz") is None
