"""Workloads: request bodies, exact lengths, determinism, the §8.3 mix and its context
cap, and shared tenant prefixes."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import pytest

from app.bench.prompts import PromptFactory, SimulatedCounter
from app.bench.records import RequestSpec
from app.bench.workloads import MIX_CLASSES, FixedWorkload, MixWorkload, SharedPrefixWorkload

COUNT = SimulatedCounter().count
FACTORY = PromptFactory(SimulatedCounter(), seed=0)


def _prompt_tokens(spec: RequestSpec) -> int:
    body = spec.body
    if "prompt" in body:
        return COUNT(body["prompt"])
    return sum(COUNT(m["content"]) for m in body["messages"])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fixed_bodies_and_exact_lengths(endpoint: Any) -> None:
    w = FixedWorkload("m", endpoint, 100, 20, FACTORY, seed=1)
    spec = w.request(0)
    assert (spec.endpoint, spec.kind, spec.input_tokens, spec.output_tokens) == (
        endpoint, "fixed", 100, 20,
    )  # fmt: skip
    prompt_key = "messages" if endpoint == "chat" else "prompt"
    assert set(spec.body) == {"model", prompt_key, "max_tokens", "temperature", "ignore_eos"}
    assert (spec.body["model"], spec.body["max_tokens"]) == ("m", 20)
    assert (spec.body["temperature"], spec.body["ignore_eos"]) == (0.0, True)
    assert _prompt_tokens(spec) == 100
    if endpoint == "chat":
        assert spec.body["messages"][0]["role"] == "user"
    custom = FixedWorkload("m", endpoint, 10, 5, FACTORY, 1, temperature=0.7, ignore_eos=False)
    assert (custom.request(0).body["temperature"], custom.request(0).body["ignore_eos"]) == (
        0.7, False,
    )  # fmt: skip


def _mix(seed: int = 0, max_model_len: int = 32768, **kw: Any) -> MixWorkload:
    return MixWorkload("m", FACTORY, seed, max_model_len, **kw)


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: FixedWorkload("m", "chat", 50, 8, FACTORY, seed),
        lambda seed: _mix(seed),
        lambda seed: SharedPrefixWorkload(
            "m", FACTORY, seed, tenants=3, prefix_tokens=40, suffix_tokens=10, output_tokens=4
        ),
    ],
    ids=["fixed", "mix", "shared_prefix"],
)
def test_requests_are_deterministic_in_seed_and_index(make: Any) -> None:
    a, b, other = make(7), make(7), make(8)
    forward = [a.request(i) for i in range(20)]
    assert [b.request(i) for i in reversed(range(20))] == forward[::-1]  # any order
    assert [other.request(i) for i in range(20)] != forward
    assert len({json.dumps(s.body) for s in forward}) == 20


def test_mix_proportions_and_ranges_over_10000_draws() -> None:
    w = _mix(seed=3)
    draws = [w.draw(i) for i in range(10_000)]
    shares = Counter(d.kind for d in draws)
    for kind, expected in {"short": 0.50, "chat": 0.30, "long_doc": 0.15, "long_gen": 0.05}.items():
        assert abs(shares[kind] / 10_000 - expected) < 0.015, kind
    for d in draws:
        (i_lo, i_hi), (o_lo, o_hi) = MIX_CLASSES[d.kind]
        assert i_lo <= d.input_tokens <= i_hi and o_lo <= d.output_tokens <= o_hi
        assert not d.capped
    for kind, ((i_lo, i_hi), _) in MIX_CLASSES.items():  # the whole range is used
        inputs = [d.input_tokens for d in draws if d.kind == kind]
        assert (
            min(inputs) - i_lo < (i_hi - i_lo) * 0.05 and i_hi - max(inputs) < (i_hi - i_lo) * 0.05
        )
    assert w.describe(10_000)["context_cap"]["capped"] == {}


@pytest.mark.parametrize("max_model_len", [2048, 4096, 8192])
def test_mix_context_cap_rule(max_model_len: int) -> None:
    w = _mix(seed=5, max_model_len=max_model_len, template_margin=64)
    draws = [w.draw(i) for i in range(3000)]
    for d in draws:
        out = min(d.drawn_output, max_model_len // 2)
        assert d.output_tokens == out
        assert d.input_tokens == min(d.drawn_input, max_model_len - out - 64)
        assert d.input_tokens + d.output_tokens + 64 <= max_model_len
    cap = w.describe(3000)["context_cap"]
    assert cap["capped"] == dict(Counter(d.kind for d in draws if d.capped))
    assert cap["by_kind"] == dict(Counter(d.kind for d in draws))
    if max_model_len <= 4096:  # a 4k+ document never fits
        assert cap["capped"]["long_doc"] == cap["by_kind"]["long_doc"]
    else:
        assert 0 < cap["capped"]["long_doc"] < cap["by_kind"]["long_doc"]
    assert (cap["max_model_len"], cap["template_margin"], cap["requests"]) == (
        max_model_len,
        64,
        3000,
    )
    assert "max_model_len // 2" in cap["rule"]


def test_mix_requests_carry_the_capped_lengths_exactly() -> None:
    w = _mix(seed=2, max_model_len=2048)
    for i in range(40):
        spec, d = w.request(i), w.draw(i)
        assert (spec.kind, spec.input_tokens, spec.output_tokens) == (
            d.kind, d.input_tokens, d.output_tokens,
        )  # fmt: skip
        assert _prompt_tokens(spec) == d.input_tokens and spec.body["max_tokens"] == d.output_tokens
    assert w.describe()["context_cap"]["requests"] == 40  # default: what was produced


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"weights": {"huge": 1.0}}, "unknown mix classes"),
        ({"weights": {"short": 0.0}}, "positive sum"),
        ({"weights": {"short": -1.0, "chat": 2.0}}, "non-negative"),
        ({"max_model_len": 100}, "no room"),
    ],
)
def test_mix_rejects_bad_configuration(kw: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _mix(**kw)


def test_mix_weights_are_configurable() -> None:
    w = _mix(weights={"long_gen": 1.0})
    assert {w.draw(i).kind for i in range(200)} == {"long_gen"}
    assert w.describe()["classes"]["short"]["weight"] == 0.0


def _shared(**kw: Any) -> SharedPrefixWorkload:
    args: dict[str, Any] = dict(tenants=4, prefix_tokens=60, suffix_tokens=12, output_tokens=5)
    return SharedPrefixWorkload("m", FACTORY, 11, **(args | kw))


def test_shared_prefix_tenants_share_exactly_their_system_prompt() -> None:
    w = _shared(tenant_keys={f"tenant-{k}": f"sk-{k}" for k in range(1, 5)})
    specs = [w.request(i) for i in range(200)]
    by_tenant: dict[str | None, set[str]] = {}
    for s in specs:
        system, user = s.body["messages"]
        assert (system["role"], user["role"]) == ("system", "user")
        assert (COUNT(system["content"]), COUNT(user["content"])) == (60, 12)
        assert (s.input_tokens, s.output_tokens, s.kind) == (72, 5, "shared_prefix")
        assert s.headers == {"Authorization": f"Bearer sk-{s.tenant.split('-')[1]}"}  # type: ignore[union-attr]
        by_tenant.setdefault(s.tenant, set()).add(system["content"])
    assert set(by_tenant) == {f"tenant-{k}" for k in range(1, 5)}
    assert all(len(texts) == 1 for texts in by_tenant.values())
    assert len({next(iter(t)) for t in by_tenant.values()}) == 4
    assert len({s.body["messages"][1]["content"] for s in specs}) == 200  # questions unique


def test_shared_prefix_completions_prompt_starts_with_the_tenant_prefix() -> None:
    w = _shared(endpoint="completions")
    for i in range(20):
        s = w.request(i)
        assert s.tenant is not None and s.body["prompt"].startswith(w.prefix(s.tenant) + "\n\n")
        assert COUNT(s.body["prompt"]) == 72 and s.headers == {}


def test_shared_prefix_tenant_distributions() -> None:
    uniform = Counter(_shared().request(i).tenant for i in range(2000))
    assert all(abs(n / 2000 - 0.25) < 0.04 for n in uniform.values())
    zipf = Counter(_shared(distribution="zipf", zipf_s=1.0).request(i).tenant for i in range(2000))
    harmonic = sum(1 / k for k in range(1, 5))
    for k in range(1, 5):
        assert abs(zipf[f"tenant-{k}"] / 2000 - 1 / k / harmonic) < 0.04
    assert (
        _shared(distribution="zipf", zipf_s=1.5).describe()["tenant_distribution"] == "zipf s=1.5"
    )


def test_shared_prefix_needs_a_key_for_every_tenant() -> None:
    with pytest.raises(ValueError, match=r"tenant-4"):
        _shared(tenant_keys={f"tenant-{k}": "k" for k in range(1, 4)})


def test_describe_names_dataset_and_lengths() -> None:
    for w in (FixedWorkload("m", "chat", 8, 2, FACTORY, 0), _mix(), _shared()):
        desc = w.describe()
        assert {"dataset", "input_lengths", "output_lengths", "seed"} <= set(desc)
    assert math.isclose(sum(c["weight"] for c in _mix().describe()["classes"].values()), 1.0)
