"""The OpenAI parameter set through the official SDK on the real vLLM CPU engine (the
tiny random-weight Llama): structured outputs that always validate, log probabilities
consistent with the tokens, sampling options that change what the engine does, and
documented parameters refused with a 400 naming them."""

from __future__ import annotations

import json
import math
import time

import jsonschema
import openai
import pytest

from tests.integration.conftest import TENANT, Gateway

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Describe a person."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0, timeout=180)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_answers_always_validate(tiny_gateway: Gateway, seed: int) -> None:
    """Random weights, sampled at temperature 1: the grammar alone makes it valid."""
    out = _client(tiny_gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format=SCHEMA_FORMAT,  # type: ignore[arg-type]
        max_tokens=400, temperature=1.0, seed=seed,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_json_schema_streams_validate_too(tiny_gateway: Gateway) -> None:
    stream = _client(tiny_gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format=SCHEMA_FORMAT,  # type: ignore[arg-type]
        max_tokens=400, seed=4, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    jsonschema.validate(json.loads(text), PERSON)
    assert usage is not None and usage.completion_tokens > 0


def test_json_object_answers_are_objects(tiny_gateway: Gateway) -> None:
    out = _client(tiny_gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "json_object"},
        max_tokens=300, temperature=0,
        extra_body={"stop_token_ids": []},
    )  # fmt: skip
    if out.choices[0].finish_reason == "stop":  # a random model may ramble past 300
        assert isinstance(json.loads(out.choices[0].message.content or ""), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert (out.choices[0].message.content or "").lstrip().startswith("{")


def test_chat_logprobs_match_the_tokens(tiny_gateway: Gateway) -> None:
    out = _client(tiny_gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = out.choices[0]
    assert out.usage is not None and choice.logprobs is not None
    content = choice.logprobs.content or []
    assert len(content) == out.usage.completion_tokens == 6
    assert "".join(c.token for c in content) == choice.message.content
    for c in content:
        tops = [t.logprob for t in c.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert c.logprob <= 0 and math.isclose(c.logprob, tops[0], abs_tol=1e-4)  # greedy
        assert c.bytes == list(c.token.encode())


def test_completion_logprobs_stream_with_offsets(tiny_gateway: Gateway) -> None:
    stream = _client(tiny_gateway).completions.create(
        model=MODEL, prompt="one two three", max_tokens=5, temperature=0, logprobs=2,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, tokens, offsets = "", [], []
    for chunk in stream:
        c = chunk.choices[0]
        if c.logprobs is not None and c.logprobs.tokens:
            tokens += c.logprobs.tokens
            offsets += c.logprobs.text_offset or []
            assert all(len(t) <= 2 for t in c.logprobs.top_logprobs or [])
        text += c.text
    assert len(tokens) == 5 and "".join(tokens) == text
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(5)]


def test_logit_bias_and_penalties_reach_the_engine(tiny_gateway: Gateway) -> None:
    client = _client(tiny_gateway)

    def greedy(**extra: object) -> openai.types.Completion:
        return client.completions.create(
            model=MODEL, prompt="a b c", max_tokens=8, temperature=0, logprobs=0,
            extra_body={"ignore_eos": True, **extra.pop("extra_body", {})},  # type: ignore[dict-item]
            **extra,  # type: ignore[arg-type]
        )  # fmt: skip

    plain = greedy()
    tokens = plain.choices[0].logprobs.tokens  # type: ignore[union-attr]
    # +100 on one token id makes it every greedy pick (the engine applied the bias)
    forced = greedy(logit_bias={"300": 100})
    forced_tokens = forced.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert forced_tokens is not None and len(set(forced_tokens)) == 1
    assert forced_tokens != tokens
    # penalties grow with each repeat until the biased token stops winning
    repeated = greedy(logit_bias={"300": 5})
    penalised = greedy(logit_bias={"300": 5}, presence_penalty=2.0, frequency_penalty=2.0)
    repeated_tokens = repeated.choices[0].logprobs.tokens  # type: ignore[union-attr]
    penalised_tokens = penalised.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert repeated_tokens is not None and penalised_tokens is not None
    token = repeated_tokens[0]
    assert penalised_tokens.count(token) < repeated_tokens.count(token) == 8
    # min_tokens with the end token stopping: at least that many tokens come out
    eos = greedy(extra_body={"ignore_eos": False, "min_tokens": 4, "stop_token_ids": [300]})
    assert eos.usage is not None and eos.usage.completion_tokens >= 4


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"audio": {"voice": "alloy", "format": "wav"}},
         "audio"),
        ({"extra_body": {"logit_bias": {"99999": 1}}}, "logit_bias"),  # outside the vocabulary
        ({"extra_body": {"not_an_openai_field": 1}}, "not_an_openai_field"),
    ],
)
def test_refused_parameters_are_400_naming_them(
    tiny_gateway: Gateway, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(tiny_gateway).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, **extra  # type: ignore[arg-type]
        )
    error = info.value.body
    assert isinstance(error, dict) and error.get("param") == param and error["message"]


# ---- tools ------------------------------------------------------------------------------

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "weather", "description": "Forecast",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "clock", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]  # fmt: skip
NAMED = {"type": "function", "function": {"name": "weather"}}


@pytest.mark.parametrize("response_format", [None, {"type": "json_object"}])
def test_a_named_tool_call_always_parses_and_validates(
    tiny_gateway: Gateway, response_format: dict[str, str] | None
) -> None:
    """With a response format too, the forced call wins (as OpenAI's: the format shapes
    text, and a forced call writes none)."""
    extra = {"response_format": response_format} if response_format else {}
    out = _client(tiny_gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,  # type: ignore[arg-type]
        max_tokens=300, seed=5, **extra,  # type: ignore[arg-type]
    )  # fmt: skip
    message = out.choices[0].message
    assert message.content is None and message.tool_calls is not None
    (call,) = message.tool_calls
    assert call.type == "function" and call.function.name == "weather"
    assert call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    assert out.usage is not None and out.usage.completion_tokens > 0  # billed like text


def test_streamed_tool_calls_are_assembled_by_the_sdk(tiny_gateway: Gateway) -> None:
    with _client(tiny_gateway).beta.chat.completions.stream(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,  # type: ignore[arg-type]
        max_tokens=300, seed=6,
    ) as stream:  # fmt: skip
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_required_tool_calls_and_a_tool_round_trip(tiny_gateway: Gateway) -> None:
    client = _client(tiny_gateway)
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
        max_tokens=400, seed=7,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("weather", "clock")
        if call.function.name == "weather":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    # the agent loop's next step: the calls and their results go back as history
    history = [
        *MESSAGES,
        choice.message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": "sunny"}
          for c in choice.message.tool_calls),
    ]  # fmt: skip
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=8,  # type: ignore[arg-type]
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert answer.usage is not None
    assert answer.usage.prompt_tokens > out.usage.prompt_tokens  # type: ignore[union-attr]
    assert answer.choices[0].finish_reason in ("length", "tool_calls")


def test_the_example_agent_loop_runs_unchanged(tiny_gateway: Gateway) -> None:
    """examples/agent_loop.py (what a user runs against `make run`), on the tiny model:
    plan → search → answer → done, every call in one session."""
    from examples.agent_loop import run

    answer, steps = run(_client(tiny_gateway), MODEL, "", "What is the capital of France?")
    assert [s.name for s in steps][:1] == ["plan"] and steps[-1].name == "done"
    assert [s.name for s in steps].count("search") >= 1 and steps[-2].name == "answer"
    assert answer == steps[-2].detail
    session = steps[-1].detail.split()[1].rstrip(",")
    deadline = time.monotonic() + 10
    while True:
        records = [r for r in tiny_gateway.records(TENANT) if r["session_id"] == session]
        if len(records) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)


def test_n_choices_are_counted_in_usage_and_the_ledger(tiny_gateway: Gateway) -> None:
    client = _client(tiny_gateway)
    out = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, n=3, max_tokens=4, seed=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    body = out.parse()
    assert [c.index for c in body.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in body.choices)
    assert body.usage is not None and body.usage.completion_tokens == 12
    rid = out.headers["x-request-id"]
    deadline = time.monotonic() + 10
    while True:
        records = [r for r in tiny_gateway.records(TENANT) if r["request_id"] == rid]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [r["completion_tokens"] for r in records] == [12]
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, max_tokens=3, seed=3, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts, finished, usage = {0: "", 1: ""}, set(), None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
        usage = chunk.usage or usage
    assert finished == {0, 1} and usage is not None and usage.completion_tokens == 6
    assert (body.choices[0].message.content or "").startswith(texts[0])  # seed 3 repeats
