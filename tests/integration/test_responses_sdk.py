"""The Responses API through the official openai SDK and the OpenAI Agents SDK: on the
simulated engine and on the real vLLM CPU engine with the tiny random-weight model
(plain, streamed, json_schema, a function tool round trip, retrieve / input_items /
delete, a chain continued with previous_response_id, another tenant's 404, one ledger
record per response, a disconnect mid-stream), and an agent with one function tool run
to its final answer in the Agents SDK's Responses and chat-completions modes."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel, Field

from tests.integration.conftest import TENANT, Gateway

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
TOOLS: Any = [{"type": "function", "name": "weather", "description": "Forecast",
               "parameters": WEATHER}]  # fmt: skip


def _client(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=key or gw.api_key, max_retries=0, timeout=180)


@pytest.fixture(params=["sim", "tiny"])
def target(request: pytest.FixtureRequest) -> tuple[Gateway, str]:
    if request.param == "sim":
        return request.getfixturevalue("sim_gateway"), "sim-chat"
    return request.getfixturevalue("tiny_gateway"), "tiny-llama"


def _records(gw: Gateway, response_id: str, status: str = "ok") -> list[dict[str, Any]]:
    """The ledger records of one response, once one with ``status`` is there."""
    rid = response_id.removeprefix("resp_")
    deadline = time.monotonic() + 10
    while True:
        mine = [r for r in gw.records(TENANT) if r["request_id"] == rid]
        if any(r["status"] == status for r in mine) or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


def test_a_response_is_stored_listed_and_deleted_with_one_record(
    target: tuple[Gateway, str],
) -> None:
    gw, model = target
    client = _client(gw)
    out = client.responses.create(model=model, input="Name three colours.",
                                  instructions="Be brief.", max_output_tokens=6,
                                  temperature=0, metadata={"run": "7"})  # fmt: skip
    assert out.object == "response" and out.model == model and out.store
    assert out.status in ("completed", "incomplete") and out.output_text
    assert out.usage is not None and 0 < out.usage.output_tokens <= 6
    (record,) = _records(gw, out.id)
    assert (record["endpoint"], record["status"]) == ("responses", "ok")
    assert record["prompt_tokens"] == out.usage.input_tokens
    assert record["completion_tokens"] == out.usage.output_tokens
    got = client.responses.retrieve(out.id)
    assert got.output_text == out.output_text and got.metadata == {"run": "7"}
    items = client.responses.input_items.list(out.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]
    client.responses.delete(out.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)


def test_a_streamed_response_assembles_in_the_sdk(target: tuple[Gateway, str]) -> None:
    gw, model = target
    with _client(gw).responses.stream(model=model, input="Count to five.",
                                      max_output_tokens=6, temperature=0) as stream:  # fmt: skip
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]  # completed, or incomplete at max_output_tokens (as OpenAI's)
    assert last.type in ("response.completed", "response.incomplete")
    final = last.response  # type: ignore[union-attr]
    assert final.status == last.type.removeprefix("response.")
    assert final.output_text == text and text
    assert final.usage is not None and 0 < final.usage.output_tokens <= 6
    assert [r["status"] for r in _records(gw, final.id)] == ["ok"]


def test_a_chain_continues_and_stays_with_its_tenant(sim_gateway: Gateway) -> None:
    gw = sim_gateway
    client = _client(gw)
    first = client.responses.create(model="sim-chat", input="Plan a trip.", max_output_tokens=4)
    second = client.responses.create(model="sim-chat", input="Shorter.", max_output_tokens=4,
                                     previous_response_id=first.id)  # fmt: skip
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # the chain is re-rendered: turn two's prompt holds turn one and its answer
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    (a,), (b,) = _records(gw, first.id), _records(gw, second.id)
    assert a["session_id"] == b["session_id"] == first.id  # one chain, one session
    stranger = _client(gw, gw.new_key(tenant="someone-else"))
    with pytest.raises(openai.NotFoundError) as missing:
        stranger.responses.retrieve(first.id)
    assert missing.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError) as chained:
        stranger.responses.create(model="sim-chat", input="x", previous_response_id=first.id)
    assert chained.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="sim-chat", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert bad.value.param == "tools" and "built-in tool" in bad.value.message


def test_a_client_leaving_mid_stream_leaves_one_record(sim_gateway: Gateway) -> None:
    gw = sim_gateway
    body = {"model": "sim-slow", "input": "Write a long story.", "max_output_tokens": 400,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {gw.api_key}"}
    response_id = ""
    with httpx.stream("POST", f"{gw.v1}/responses", json=body, headers=headers,
                      timeout=60) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.startswith("data: ") and "output_text.delta" in line:
                break
            if line.startswith("data: ") and "response.created" in line:
                response_id = json.loads(line[6:])["response"]["id"]
    records = _records(gw, response_id, status="client_closed")
    assert [r["status"] for r in records] == ["client_closed"]
    assert 0 < records[0]["completion_tokens"] < 400
    with pytest.raises(openai.NotFoundError):  # an unfinished response is not stored
        _client(gw).responses.retrieve(response_id)


def test_a_function_tool_round_trip_and_json_schema(tiny_gateway: Gateway) -> None:
    """Random weights: a required tool choice, and a schema, constrain the output."""
    client = _client(tiny_gateway)
    out = client.responses.create(model="tiny-llama", input="Weather in Oslo?", tools=TOOLS,
                                  tool_choice="required", max_output_tokens=300)  # fmt: skip
    calls = [i for i in out.output if i.type == "function_call"]
    assert calls and all(c.name == "weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER)
    results: Any = [{"type": "function_call_output", "call_id": c.call_id,
                     "output": json.dumps({"forecast": "sunny"})} for c in calls]  # fmt: skip
    answer = client.responses.create(model="tiny-llama", input=results, tools=TOOLS,
                                     previous_response_id=out.id, max_output_tokens=8)  # fmt: skip
    assert answer.status in ("completed", "incomplete")
    assert answer.usage is not None and out.usage is not None
    assert answer.usage.input_tokens > out.usage.input_tokens  # the chain was re-rendered
    text = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER}}
    shaped = client.responses.create(model="tiny-llama", input="Weather?", text=text,  # type: ignore[arg-type]
                                     max_output_tokens=300)  # fmt: skip
    assert shaped.status == "completed"
    jsonschema.validate(json.loads(shaped.output_text), WEATHER)


calls_made: list[str] = []


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


@function_tool
def weather(city: Literal["Oslo", "Bergen"], days: Literal[1, 2, 3]) -> str:
    """The forecast for a city.

    Args:
        city: the city.
        days: how many days ahead.
    """
    calls_made.append(city)
    return f"sunny in {city} for {days} days"


@pytest.mark.parametrize("mode", ["responses", "chat_completions"])
async def test_an_agent_with_a_function_tool_runs_to_its_final_answer(
    tiny_gateway: Gateway, mode: str
) -> None:
    """The Agents SDK unchanged, pointed at the gateway. Random weights: the first turn's
    tool choice is required (a valid call); the SDK then resets it to auto, and the next
    turn answers with the agent's output type. Every schema is bounded (random text would
    run to the token limit, which the SDK takes for a failure, as it does with OpenAI)."""
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=tiny_gateway.v1, api_key=tiny_gateway.api_key,
                                max_retries=0, timeout=180)  # fmt: skip
    model: Any = (OpenAIResponsesModel if mode == "responses" else OpenAIChatCompletionsModel)(
        model="tiny-llama", openai_client=client
    )
    agent = Agent(name="forecaster", instructions="Answer with the forecast.", model=model,
                  tools=[weather], output_type=Forecast, model_settings=ModelSettings(
                      tool_choice="required", max_tokens=300, temperature=0))  # fmt: skip
    calls_made.clear()
    result = await Runner.run(agent, "Weather in Oslo for two days?", max_turns=4)
    assert len(calls_made) >= 1  # the tool ran
    assert isinstance(result.final_output, Forecast)
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert kinds[-1] == "message_output_item"
    assert len(result.raw_responses) >= 2  # a model call per turn
    if mode == "responses":  # each turn one response, each with one ledger record
        for turn in result.raw_responses:
            assert turn.response_id is not None
            records = _records(tiny_gateway, turn.response_id)
            assert [(r["endpoint"], r["status"]) for r in records] == [("responses", "ok")]
