"""The Anthropic Messages API through the official anthropic SDK: on the simulated
engine and on the real vLLM CPU engine with the tiny random-weight model (plain,
streamed, a constrained tool round trip, token counts, errors in Anthropic's shape,
one ledger record per message)."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.integration.conftest import TENANT, Gateway

USER = [{"role": "user", "content": "Name three colours."}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
TOOLS: Any = [{"name": "weather", "description": "Forecast", "input_schema": WEATHER}]


def _client(gw: Gateway, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.root, api_key=key or gw.api_key, max_retries=0,
                               timeout=180)  # fmt: skip


@pytest.fixture(params=["sim", "tiny"])
def target(request: pytest.FixtureRequest) -> tuple[Gateway, str]:
    if request.param == "sim":
        return request.getfixturevalue("sim_gateway"), "sim-chat"
    return request.getfixturevalue("tiny_gateway"), "tiny-llama"


def _record(gw: Gateway, message_id: str) -> dict[str, Any]:
    rid = message_id.removeprefix("msg_")
    deadline = time.monotonic() + 10
    while True:
        mine = [r for r in gw.records(TENANT) if r["request_id"] == rid]
        if mine or time.monotonic() > deadline:
            assert len(mine) == 1, mine
            return mine[0]
        time.sleep(0.1)


def test_a_message_reports_usage_and_has_one_ledger_record(target: tuple[Gateway, str]) -> None:
    gw, model = target
    out = _client(gw).messages.create(model=model, max_tokens=6, messages=USER,  # type: ignore[arg-type]
                                      extra_body={"temperature": 0})  # fmt: skip
    assert out.type == "message" and out.role == "assistant" and out.model == model
    assert out.stop_reason in ("end_turn", "max_tokens")
    assert 0 < out.usage.output_tokens <= 6
    if out.stop_reason == "max_tokens":
        assert out.usage.output_tokens == 6
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) > 0
    record = _record(gw, out.id)
    assert (record["endpoint"], record["status"]) == ("messages", "ok")
    assert record["completion_tokens"] == out.usage.output_tokens


def test_a_streamed_message_assembles_in_the_sdk(target: tuple[Gateway, str]) -> None:
    gw, model = target
    with _client(gw).messages.stream(model=model, max_tokens=6, messages=USER,  # type: ignore[arg-type]
                                     extra_body={"temperature": 0}) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content and final.content[0].type == "text"
    assert final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= 6
    assert _record(gw, final.id)["status"] == "ok"


def test_count_tokens_matches_what_a_message_is_billed(target: tuple[Gateway, str]) -> None:
    gw, model = target
    client = _client(gw)
    system = "You answer in one word."
    counted = client.messages.count_tokens(model=model, system=system, messages=USER)  # type: ignore[arg-type]
    out = client.messages.create(model=model, system=system, max_tokens=2, messages=USER)  # type: ignore[arg-type]
    billed = out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == billed > 0


def test_errors_come_in_anthropics_shape(sim_gateway: Gateway) -> None:
    client = _client(sim_gateway)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="sim-chat", max_tokens=4, messages=USER,  # type: ignore[arg-type]
                               extra_body={"temperature": 1.5})  # fmt: skip
    body: Any = bad.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "temperature" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=USER)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _client(sim_gateway, "sk-not-a-key").messages.create(
            model="sim-chat",
            max_tokens=4,
            messages=USER,  # type: ignore[arg-type]
        )
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_tool_round_trip_with_tool_choice_any(tiny_gateway: Gateway) -> None:
    """Random weights: tool_choice any constrains the output to a valid call."""
    client = _client(tiny_gateway)
    out = client.messages.create(model="tiny-llama", max_tokens=300, messages=USER,  # type: ignore[arg-type]
                                 tools=TOOLS, tool_choice={"type": "any"})  # fmt: skip
    assert out.stop_reason == "tool_use"
    calls = [b for b in out.content if b.type == "tool_use"]
    assert calls and all(c.name == "weather" for c in calls)
    for c in calls:
        jsonschema.validate(c.input, WEATHER)
    history: Any = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id,
                                      "content": json.dumps({"forecast": "sunny"})}
                                     for c in calls]},
    ]  # fmt: skip
    answer = client.messages.create(model="tiny-llama", max_tokens=8, messages=history,
                                    tools=TOOLS, extra_body={"temperature": 0})  # fmt: skip
    prompt = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert prompt > out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with client.messages.stream(model="tiny-llama", max_tokens=300, messages=USER,  # type: ignore[arg-type]
                                tools=TOOLS, tool_choice={"type": "any"}) as stream:  # fmt: skip
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert streamed and final.stop_reason == "tool_use"
    for c in streamed:  # the SDK parsed the input_json_delta pieces into the input
        jsonschema.validate(c.input, WEATHER)


def test_output_config_format_constrains_the_answer(tiny_gateway: Gateway) -> None:
    """Random weights, sampled: the schema alone makes the text valid JSON of it."""
    out = _client(tiny_gateway).messages.create(
        model="tiny-llama", max_tokens=300, messages=USER,  # type: ignore[arg-type]
        output_config={"format": {"type": "json_schema", "schema": WEATHER}},
    )  # fmt: skip
    assert out.stop_reason == "end_turn" and out.content[0].type == "text"
    jsonschema.validate(json.loads(out.content[0].text), WEATHER)
