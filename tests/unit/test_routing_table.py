from __future__ import annotations

import math
import random
from typing import Any

import pytest

from app.routing.spec import ModelProfile, RoutesSpec
from app.routing.table import (
    LocalModel,
    NoRouteFits,
    RouteRequest,
    RouteTable,
    WrongEndpoint,
    check_local_pools,
    default_spec,
)

SPEC: dict[str, Any] = {
    "pools": {
        "p-chat": {"kind": "local", "model": "chat"},
        "p-canary": {"kind": "local", "model": "chat"},
        "p-acme": {"kind": "local", "model": "chat"},
        "p-spec": {"kind": "local", "model": "chat"},
        "p-big": {"kind": "local", "model": "big"},
        "p-vendor": {"kind": "openai", "base_url": "http://vendor.test/v1", "model": "v"},
    },
    "models": {
        "chat": {
            "pool": "p-chat",
            "profile": {"quality": 0.6, "max_context": 2048, "input_per_1m": 0.1,
                        "output_per_1m": 0.2},
            "canary": {"pool": "p-canary", "weight": 0.2},
            "tenants": {"acme": "p-acme"},
            "draft": {"pool": "p-spec"},
            "fallbacks": ["p-vendor", "p-vendor"],
        },
        "big": {
            "pool": "p-big",
            "profile": {"quality": 0.9, "max_context": 8192, "input_per_1m": 3,
                        "output_per_1m": 15},
            "fallbacks": ["p-vendor"],
        },
    },
    "aliases": {
        "gpt-4o-mini": "chat",
        "auto": {"policy": {"candidates": ["chat", "big"], "cost_ceiling_usd": 1.0}},
        "picky": {"policy": {"candidates": ["chat"], "quality_floor": 0.8}},
    },
}  # fmt: skip
LOCAL = {
    "chat": LocalModel("LLMServer-chat", "generate", 2048),
    "big": LocalModel("LLMServer-big", "generate", 8192),
}
TABLE = RouteTable(1, RoutesSpec.model_validate(SPEC), LOCAL)


def _const(value: float) -> Any:
    return lambda: value


NO_CANARY = 0.99
CANARY = 0.1


@pytest.mark.parametrize(
    ("request_", "rand", "expected"),
    [
        # (model, pool, step, fallbacks, via)
        (RouteRequest("chat", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "default", ("p-vendor",), None)),
        (RouteRequest("chat", max_tokens=16), CANARY,
         ("chat", "p-canary", "canary", ("p-chat", "p-vendor"), None)),
        (RouteRequest("chat", tenant="acme", max_tokens=16), NO_CANARY,
         ("chat", "p-acme", "tenant", ("p-chat", "p-vendor"), None)),
        # canary before tenant override: an acme request can be a canary sample too
        (RouteRequest("chat", tenant="acme", max_tokens=16), CANARY,
         ("chat", "p-canary", "canary", ("p-chat", "p-vendor"), None)),
        (RouteRequest("chat", tenant="other", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "default", ("p-vendor",), None)),
        # speculative decoding above 1024 output tokens, not at 1024
        (RouteRequest("chat", max_tokens=1024), NO_CANARY,
         ("chat", "p-chat", "default", ("p-vendor",), None)),
        (RouteRequest("chat", max_tokens=1025), NO_CANARY,
         ("chat", "p-spec", "speculative", ("p-chat", "p-vendor"), None)),
        # no max_tokens: the rest of the context (2048 - 100) counts
        (RouteRequest("chat", prompt_tokens=100), NO_CANARY,
         ("chat", "p-spec", "speculative", ("p-chat", "p-vendor"), None)),
        (RouteRequest("chat", prompt_tokens=1500), NO_CANARY,
         ("chat", "p-chat", "default", ("p-vendor",), None)),
        # the tenant's dedicated pool wins over speculative decoding
        (RouteRequest("chat", tenant="acme", max_tokens=4000), NO_CANARY,
         ("chat", "p-acme", "tenant", ("p-chat", "p-vendor"), None)),
        (RouteRequest("gpt-4o-mini", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "default", ("p-vendor",), "alias")),
        (RouteRequest("big", max_tokens=16), CANARY,
         ("big", "p-big", "default", ("p-vendor",), None)),
    ],
)  # fmt: skip
def test_decision_order(request_: RouteRequest, rand: float, expected: tuple[Any, ...]) -> None:
    d = TABLE.decide(request_, rand=_const(rand))
    assert d is not None
    assert (d.model, d.pool, d.step, d.fallbacks, d.via) == expected
    assert d.requested == request_.model


ADAPTER_SPEC = {
    **SPEC,
    "models": {
        **SPEC["models"],
        "chat": {**SPEC["models"]["chat"], "canary": {"adapter": "chat:v2", "weight": 0.2},
                 "tenants": {"acme": "p-acme", "globex": {"adapter": "chat:globex"}}},
    },
    "aliases": {**SPEC["aliases"], "support": "chat:support", "big-ft": "big:ft"},
}  # fmt: skip
ADAPTER_TABLE = RouteTable(1, RoutesSpec.model_validate(ADAPTER_SPEC), LOCAL)


@pytest.mark.parametrize(
    ("request_", "rand", "expected"),
    [
        # (model, pool, step, adapter, adapter_required)
        (RouteRequest("support", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "default", "chat:support", True)),
        (RouteRequest("big-ft", max_tokens=16), NO_CANARY,
         ("big", "p-big", "default", "big:ft", True)),
        # a canary of an adapter stays on the model's pool
        (RouteRequest("chat", max_tokens=16), CANARY,
         ("chat", "p-chat", "canary", "chat:v2", False)),
        (RouteRequest("chat", tenant="globex", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "tenant", "chat:globex", False)),
        (RouteRequest("chat", tenant="acme", max_tokens=16), NO_CANARY,
         ("chat", "p-acme", "tenant", None, False)),
        # the alias's adapter is what was asked for: a tenant's adapter does not replace it
        (RouteRequest("support", tenant="globex", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "tenant", "chat:support", True)),
        (RouteRequest("chat", max_tokens=16), NO_CANARY,
         ("chat", "p-chat", "default", None, False)),
    ],
)  # fmt: skip
def test_routes_that_name_adapters(
    request_: RouteRequest, rand: float, expected: tuple[Any, ...]
) -> None:
    d = ADAPTER_TABLE.decide(request_, rand=_const(rand))
    assert d is not None
    assert (d.model, d.pool, d.step, d.adapter, d.adapter_required) == expected


@pytest.mark.parametrize("model", ["unknown", "", "CHAT", "p-chat"])
def test_unknown_names_have_no_route(model: str) -> None:
    assert TABLE.decide(RouteRequest(model)) is None


@pytest.mark.parametrize(
    ("request_", "model", "dropped"),
    [
        # both fit: quality and latency tie-free, cost dominates → cheap "chat"
        (RouteRequest("auto", max_tokens=100, prompt_tokens=50), "chat", set()),
        # the prompt does not fit chat's 2048 context → big
        (RouteRequest("auto", max_tokens=100, prompt_tokens=3000), "big", {"chat"}),
    ],
)
def test_policy_alias(request_: RouteRequest, model: str, dropped: set[str]) -> None:
    d = TABLE.decide(request_, rand=_const(NO_CANARY))
    assert d is not None and d.via == "policy" and d.model == model
    assert d.policy is not None and set(d.policy.dropped) == dropped
    assert d.request_class is not None and d.request_class.startswith("prompt=")


def test_the_requests_own_quality_floor_drops_candidates() -> None:
    d = TABLE.decide(RouteRequest("auto", max_tokens=100, quality_floor=0.8))
    assert d is not None and d.model == "big" and set(d.policy.dropped) == {"chat"}  # type: ignore[union-attr]
    lower = TABLE.decide(RouteRequest("auto", max_tokens=100, quality_floor=0.1))
    assert lower is not None and lower.model == "chat"


def test_policy_alias_with_nothing_that_fits() -> None:
    with pytest.raises(NoRouteFits) as info:
        TABLE.decide(RouteRequest("picky", max_tokens=10))
    assert info.value.alias == "picky" and set(info.value.dropped) == {"chat"}
    assert "chat" in str(info.value)


def test_policy_uses_live_latency_when_given() -> None:
    seen: list[str] = []

    def live(pool: str) -> tuple[float | None, float | None]:
        seen.append(pool)
        return 10.0, 1.0

    TABLE.decide(RouteRequest("auto", max_tokens=10), live=live)
    assert sorted(seen) == ["p-big", "p-chat"]


def test_canary_weight_holds_over_many_decisions() -> None:
    rng = random.Random(20261129)
    n, weight = 5000, 0.2
    hits = sum(
        TABLE.decide(RouteRequest("chat", max_tokens=16), rand=rng.random).step == "canary"  # type: ignore[union-attr]
        for _ in range(n)
    )
    sigma = math.sqrt(n * weight * (1 - weight))
    assert abs(hits - n * weight) <= 3 * sigma


def test_fallbacks_never_repeat_or_include_the_chosen_pool() -> None:
    for rand in (CANARY, NO_CANARY):
        for tenant in (None, "acme"):
            d = TABLE.decide(RouteRequest("chat", tenant=tenant, max_tokens=16), rand=_const(rand))
            assert d is not None
            assert d.pool not in d.fallbacks
            assert len(set(d.fallbacks)) == len(d.fallbacks)


def test_pool_lookups() -> None:
    assert TABLE.deployment("p-canary") == "LLMServer-chat"
    assert TABLE.deployment("p-vendor") is None
    assert TABLE.upstream("p-vendor") is not None and TABLE.upstream("p-chat") is None
    assert TABLE.pool_model("p-big") == "big" and TABLE.pool_model("p-vendor") is None
    assert TABLE.max_model_len("big") == 8192 and TABLE.max_model_len("nope") == 0
    assert [r.model for r in TABLE.models()] == ["big", "chat"]
    assert TABLE.default_model() == "big"


def test_default_spec_serves_every_model_on_its_own_pool() -> None:
    spec = default_spec(LOCAL, {m: ModelProfile(input_per_1m=1.0) for m in LOCAL})
    table = RouteTable(1, spec, LOCAL)
    d = table.decide(RouteRequest("big"))
    assert d is not None and (d.pool, d.step, d.fallbacks) == ("big", "default", ())
    assert table.profile("chat") == ModelProfile(input_per_1m=1.0)


def test_local_pools_must_name_served_models() -> None:
    with pytest.raises(ValueError, match=r"pools\.p-big\.model"):
        check_local_pools(TABLE.spec, {"chat": LOCAL["chat"]})


# ---- the endpoint's task ------------------------------------------------------------

TASK_SPEC: dict[str, Any] = {
    "pools": {
        "p-chat": {"kind": "local", "model": "chat"},
        "p-emb": {"kind": "local", "model": "minilm"},
        "p-vendor": {"kind": "openai", "base_url": "http://vendor.test/v1", "model": "v"},
    },
    "models": {
        "chat": {"pool": "p-chat"},
        "minilm": {"pool": "p-emb"},
        "vendor": {"pool": "p-vendor"},
    },
    "aliases": {
        "gpt-4o-mini": "chat",
        "emb": "minilm",
        "mixed": {"policy": {"candidates": ["minilm", "chat"]}},
        "only-emb": {"policy": {"candidates": ["minilm"]}},
    },
}
TASK_TABLE = RouteTable(
    1,
    RoutesSpec.model_validate(TASK_SPEC),
    {"chat": LOCAL["chat"], "minilm": LocalModel("LLMServer-minilm", "embed", 256)},
)
GENERATES = (
    "serves text generation (task generate); use /v1/chat/completions, /v1/completions, "
    "/v1/responses or /v1/messages."
)
EMBEDS = "serves embeddings (task embed); use /v1/embeddings."


@pytest.mark.parametrize(
    ("model", "endpoint", "expected"),
    [
        # the routed model, or the 400's message
        ("chat", "chat", "chat"),
        ("chat", "completion", "chat"),
        ("chat", "embeddings", f"`chat` {GENERATES}"),
        ("minilm", "embeddings", "minilm"),
        ("minilm", "chat", f"`minilm` {EMBEDS}"),
        ("minilm", "completion", f"`minilm` {EMBEDS}"),
        # an alias is judged by what it names, and the message names both
        ("emb", "chat", f"`emb` (model `minilm`) {EMBEDS}"),
        ("gpt-4o-mini", "embeddings", f"`gpt-4o-mini` (model `chat`) {GENERATES}"),
        # an upstream pool generates
        ("vendor", "embeddings", f"`vendor` {GENERATES}"),
        # a policy alias considers only the candidates of the endpoint's task
        ("mixed", "embeddings", "minilm"),
        ("mixed", "chat", "chat"),
        ("only-emb", "completion", f"`only-emb` (model `minilm`) {EMBEDS}"),
        # a lookup without an endpoint (/ready, tools) is not judged
        ("minilm", None, "minilm"),
        ("emb", None, "minilm"),
    ],
)
def test_a_model_answers_only_on_the_endpoints_of_its_task(
    model: str, endpoint: str | None, expected: str
) -> None:
    request = RouteRequest(model, max_tokens=8, endpoint=endpoint)
    if expected.startswith("`"):
        with pytest.raises(WrongEndpoint) as info:
            TASK_TABLE.decide(request)
        assert str(info.value) == expected
        assert info.value.requested == model and info.value.endpoint == endpoint
        assert info.value.task == ("embed" if "task embed" in expected else "generate")
    else:
        d = TASK_TABLE.decide(request)
        assert d is not None and d.model == expected


def test_tasks_of_public_models() -> None:
    assert [(r.model, r.task) for r in TASK_TABLE.models()] == [
        ("chat", "generate"), ("minilm", "embed"), ("vendor", "generate"),
    ]  # fmt: skip
    assert TASK_TABLE.task("minilm") == "embed" and TASK_TABLE.task("vendor") == "generate"


@pytest.mark.parametrize(
    ("measured", "pool", "step", "note"),
    [
        # (the draft pool's measured acceptance; where a long request goes, its header)
        (None, "p-spec", "speculative", "unmeasured"),  # unknown: fail open
        (0.72, "p-spec", "speculative", "acceptance 0.72"),
        (0.40, "p-spec", "speculative", "acceptance 0.40"),  # at the floor (default 0.4)
        (0.39, "p-chat", "default", "off (acceptance 0.39 < 0.40)"),
        (0.0, "p-chat", "default", "off (acceptance 0.00 < 0.40)"),
    ],
)
def test_a_speculative_pool_below_its_acceptance_floor_is_held_off(
    measured: float | None, pool: str, step: str, note: str
) -> None:
    asked: list[str] = []

    def acceptance(p: str) -> float | None:
        asked.append(p)
        return measured

    d = TABLE.decide(RouteRequest("chat", max_tokens=2000), rand=_const(NO_CANARY),
                     acceptance=acceptance)  # fmt: skip
    assert d is not None
    assert (d.pool, d.step, d.speculative) == (pool, step, note)
    assert asked == ["p-spec"]
    # a short request never reaches the speculative step: nothing asked, nothing said
    asked.clear()
    short = TABLE.decide(RouteRequest("chat", max_tokens=16), rand=_const(NO_CANARY),
                         acceptance=acceptance)  # fmt: skip
    assert short is not None and (short.step, short.speculative, asked) == ("default", None, [])


def test_a_floor_of_zero_never_holds_the_draft_pool_off() -> None:
    spec = {
        **SPEC,
        "models": {
            **SPEC["models"],
            "chat": {**SPEC["models"]["chat"], "draft": {"pool": "p-spec", "min_acceptance": 0}},
        },
    }
    table = RouteTable(1, RoutesSpec.model_validate(spec), LOCAL)
    d = table.decide(RouteRequest("chat", max_tokens=2000), rand=_const(NO_CANARY),
                     acceptance=lambda _: 0.0)  # fmt: skip
    assert d is not None and (d.pool, d.speculative) == ("p-spec", "acceptance 0.00")
