from __future__ import annotations

import pytest

from app.routing.spec import RoutesFileError, load_routes, parse_routes

GOOD = """
pools:
  a: {kind: local, model: m-a}
  up: {kind: openai, base_url: "http://up.test/v1", model: x, api_key_env: UP_KEY}
models:
  chat: {pool: a, fallbacks: [up], profile: {quality: 0.7}}
aliases:
  mini: chat
  auto: {policy: {candidates: [chat]}}
"""


def test_a_good_file_parses() -> None:
    spec = parse_routes(GOOD)
    assert spec.models["chat"].profile.quality == 0.7
    assert spec.aliases["mini"] == "chat"
    assert spec.fallback.max_attempts == 3


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (GOOD.replace("fallbacks: [up]", "fallbacks: [nope]"),
         "models.chat.fallbacks[0]: unknown pool 'nope'"),
        (GOOD.replace("{pool: a,", "{pool: b,"), "models.chat.pool: unknown pool 'b'"),
        (GOOD.replace("quality: 0.7", "quality: 1.7"), "models.chat.profile.quality"),
        (GOOD.replace("quality: 0.7", "qualty: 0.7"), "models.chat.profile.qualty"),
        (GOOD.replace("mini: chat", "mini: chatt"), "aliases.mini: unknown model 'chatt'"),
        (GOOD.replace("candidates: [chat]", "candidates: [chat, zz]"),
         "aliases.auto.policy.candidates[1]: unknown model 'zz'"),
        (GOOD.replace("mini: chat", "chat: chat"), "aliases.chat: shadows the model"),
        (GOOD.replace("fallbacks: [up]", "fallbacks: [a]"), "models.chat.fallbacks: lists its own"),
        (GOOD.replace("kind: openai", "kind: grpc"), "pools.up"),
        (GOOD.replace("api_key_env: UP_KEY", "api_key_env: K, api_key_file: /k"),
         "api_key_env or api_key_file"),
        (GOOD.replace("http://up.test/v1", "up.test/v1"), "pools.up.openai.base_url"),
        (GOOD + "default_model: nope\n", "default_model: unknown model 'nope'"),
        (GOOD + "extra: 1\n", "extra: Extra inputs are not permitted"),
        (GOOD.replace("mini: chat", "mini: 'chatt:ft'"), "aliases.mini: unknown model 'chatt'"),
        (GOOD.replace("{pool: a,", "{pool: a, canary: {weight: 0.1},"),
         "models.chat.canary: give a pool, an adapter, or both"),
        (GOOD.replace("{pool: a,", "{pool: a, canary: {adapter: 'other:v2', weight: 0.1},"),
         "models.chat.canary.adapter: 'other:v2' is not an adapter of chat"),
        (GOOD.replace("{pool: a,", "{pool: a, tenants: {acme: {adapter: ft}},"),
         "adapter 'ft' is not base:adapter"),
        (GOOD.replace("{pool: a,", "{pool: a, tenants: {acme: {pool: zz}},"),
         "models.chat.tenants.acme: unknown pool 'zz'"),
        ("[1, 2]", "must be a mapping"),
        ("pools: {a: [}", "not valid YAML"),
    ],
)  # fmt: skip
def test_errors_name_the_bad_field(text: str, names: str) -> None:
    with pytest.raises(RoutesFileError) as info:
        parse_routes(text, "routes.yaml")
    assert names in str(info.value)
    assert str(info.value).startswith("routes.yaml")


def test_adapters_in_aliases_canaries_and_tenant_overrides_parse() -> None:
    text = GOOD.replace("mini: chat", "mini: 'chat:ft'").replace(
        "{pool: a,", "{pool: a, canary: {adapter: 'chat:v2', weight: 0.1}, "
        "tenants: {acme: {adapter: 'chat:acme'}, globex: up},"
    )
    chat = parse_routes(text).models["chat"]
    assert chat.adapters() == [("canary.adapter", "chat:v2"), ("tenants.acme.adapter", "chat:acme")]
    assert ("tenants.globex", "up") in chat.pools()
    assert chat.canary is not None and chat.canary.pool is None


def test_load_routes_reports_a_missing_file(tmp_path: object) -> None:
    from pathlib import Path

    missing = Path(str(tmp_path)) / "nope.yaml"
    with pytest.raises(RoutesFileError, match=r"nope\.yaml"):
        load_routes(missing)
