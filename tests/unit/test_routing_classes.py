"""Routing by request class: the rule, and the decision it makes in the route table
(the class's pool, its profile in the decision, the fallback when the class has no pool)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.routing.classes import ClassRouting, classify
from app.routing.spec import RoutesSpec
from app.routing.table import LocalModel, RouteRequest, RouteTable, check_local_pools

RULE = ClassRouting(pools={"interactive": "x"}, long_prompt_tokens=1000, interactive_max_tokens=64)


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "stream", "batch", "want"),
    [
        (10, 16, True, True, "throughput"),  # the batch marker wins over everything
        (5000, 16, True, True, "throughput"),
        (1000, 16, True, False, "long_context"),  # at the threshold
        (999, 16, True, False, "interactive"),
        (10, 64, True, False, "interactive"),
        (10, 65, True, False, None),  # asks for more than an interactive answer
        (10, 16, False, False, None),  # not streamed
        (10, None, True, False, None),  # the window: unbounded
    ],
)
def test_the_class_rule(
    prompt_tokens: int, max_tokens: int | None, stream: bool, batch: bool, want: str | None
) -> None:
    got = classify(
        RULE, prompt_tokens=prompt_tokens, max_tokens=max_tokens, stream=stream, batch=batch
    )
    assert got == want


SPEC: dict[str, Any] = {
    "pools": {
        "chat": {"kind": "local", "model": "smol-chat"},
        "long": {"kind": "local", "model": "smol-long"},
        "vendor": {"kind": "openai", "base_url": "http://vendor.test/v1", "model": "v"},
    },
    "models": {
        "smol": {
            "pool": "chat",
            "classes": {"pools": {"interactive": "chat", "long_context": "long"},
                        "long_prompt_tokens": 1024},
            "fallbacks": ["vendor"],
        },
    },
}  # fmt: skip
LOCAL = {
    "smol-chat": LocalModel("LLMServer-smol-chat", "generate", 2048, "interactive"),
    "smol-long": LocalModel("LLMServer-smol-long", "generate", 8192, "long_context"),
}
TABLE = RouteTable(1, RoutesSpec.model_validate(SPEC), LOCAL)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # (pool, step, class, profile, fallbacks)
        (RouteRequest("smol", prompt_tokens=3000, max_tokens=16),
         ("long", "class", "long_context", "long_context", ("chat", "vendor"))),
        (RouteRequest("smol", prompt_tokens=20, max_tokens=16, stream=True),
         ("chat", "class", "interactive", "interactive", ("vendor",))),
        # throughput has no pool here: the model's own pool, the class still reported
        (RouteRequest("smol", prompt_tokens=3000, max_tokens=16, batch=True),
         ("chat", "default", "throughput", "interactive", ("vendor",))),
        (RouteRequest("smol", prompt_tokens=20, max_tokens=500),
         ("chat", "default", None, "interactive", ("vendor",))),
    ],
)  # fmt: skip
def test_the_decision_follows_the_class(
    request_: RouteRequest, expected: tuple[Any, ...]
) -> None:
    d = TABLE.decide(request_)
    assert d is not None
    assert (d.pool, d.step, d.request_class, d.profile, d.fallbacks) == expected


def test_a_tenant_pool_wins_over_the_class() -> None:
    spec = {**SPEC, "models": {"smol": {**SPEC["models"]["smol"], "tenants": {"acme": "chat"}}}}
    table = RouteTable(1, RoutesSpec.model_validate(spec), LOCAL)
    d = table.decide(RouteRequest("smol", tenant="acme", prompt_tokens=3000, max_tokens=16))
    assert d is not None and (d.pool, d.step) == ("chat", "tenant")


def test_class_pools_are_cross_checked_and_the_rule_is_strict() -> None:
    bad = {**SPEC, "models": {"smol": {"pool": "chat", "classes": {"pools": {
        "long_context": "nowhere"}}}}}  # fmt: skip
    with pytest.raises(ValidationError, match=r"classes\.pools\.long_context"):
        RoutesSpec.model_validate(bad)
    with pytest.raises(ValidationError, match="batch"):
        ClassRouting.model_validate({"pools": {"batch": "chat"}})
    with pytest.raises(ValidationError, match="at least 1"):
        ClassRouting.model_validate({"pools": {}})
    check_local_pools(RoutesSpec.model_validate(SPEC), LOCAL)  # every local pool is served


def test_the_window_is_the_chosen_pools_and_the_model_shows_the_widest() -> None:
    assert TABLE.max_model_len("smol") == 8192
    assert {r.model: r.max_model_len for r in TABLE.models()} == {"smol": 8192}
    long = TABLE.decide(RouteRequest("smol", prompt_tokens=3000, max_tokens=16))
    short = TABLE.decide(RouteRequest("smol", prompt_tokens=20, max_tokens=16))
    assert long is not None and short is not None
    assert (TABLE.window(long), TABLE.window(short)) == (8192, 2048)
