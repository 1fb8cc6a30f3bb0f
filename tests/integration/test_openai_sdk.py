"""The API surface through the official openai SDK (sync, async, streaming), on the
simulated engine and on the real vLLM CPU engine with a tiny random-weight model."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import GPU_HOURLY_USD, Gateway

MESSAGES = [{"role": "user", "content": "Name three colours."}]


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0, timeout=120)


@pytest.fixture(params=["sim", "tiny"])
def target(request: pytest.FixtureRequest) -> tuple[Gateway, str]:
    if request.param == "sim":
        return request.getfixturevalue("sim_gateway"), "sim-chat"
    return request.getfixturevalue("tiny_gateway"), "tiny-llama"


def test_chat_completion_reports_usage_and_length_finish(target: tuple[Gateway, str]) -> None:
    gw, model = target
    out = _client(gw).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.object == "chat.completion"
    assert out.model == model
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].message.role == "assistant"
    assert out.usage is not None
    assert out.usage.completion_tokens == 6
    assert out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 6


def test_max_completion_tokens_is_honoured(target: tuple[Gateway, str]) -> None:
    gw, model = target
    out = _client(gw).chat.completions.create(
        model=model, messages=MESSAGES, max_completion_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 3


def test_greedy_generation_is_deterministic(target: tuple[Gateway, str]) -> None:
    gw, model = target
    client = _client(gw)
    texts = {
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=8, temperature=0, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    }
    assert len(texts) == 1


def test_stream_yields_chunks_then_usage_then_done(target: tuple[Gateway, str]) -> None:
    gw, model = target
    stream = _client(gw).chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_without_include_usage_sends_no_usage(sim_gateway: Gateway) -> None:
    chunks = list(
        _client(sim_gateway).chat.completions.create(
            model="sim-chat", messages=MESSAGES, max_tokens=4, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_sends_one_token_per_chunk(sim_gateway: Gateway) -> None:
    chunks = list(
        _client(sim_gateway).chat.completions.create(
            model="sim-chat", messages=MESSAGES, max_tokens=12, stream=True
        )
    )
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 12


def test_stop_sequence_ends_generation(sim_gateway: Gateway) -> None:
    client = _client(sim_gateway)
    free = (
        client.chat.completions.create(model="sim-chat", messages=MESSAGES, max_tokens=12, seed=1)
        .choices[0]
        .message.content
    )
    assert free is not None
    word = free.split()[2]
    stopped = client.chat.completions.create(
        model="sim-chat", messages=MESSAGES, max_tokens=12, seed=1, stop=[word]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert word not in (stopped.choices[0].message.content or "")


async def test_async_client_chat_and_completion(target: tuple[Gateway, str]) -> None:
    gw, model = target
    client = openai.AsyncOpenAI(base_url=gw.v1, api_key=gw.api_key, max_retries=0, timeout=120)
    chat = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, user="someone", top_p=0.9
    )
    assert chat.usage is not None and chat.usage.completion_tokens <= 4
    comp = await client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert comp.object == "text_completion"
    assert comp.usage is not None and comp.usage.completion_tokens == 4
    chunks = [
        c
        async for c in await client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    await client.close()


def test_completion_accepts_token_ids(target: tuple[Gateway, str]) -> None:
    gw, model = target
    out = _client(gw).completions.create(
        model=model, prompt=[5, 6, 7, 8], max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.prompt_tokens == 4


def test_models_list_names_every_served_model(sim_gateway: Gateway) -> None:
    ids = {m.id for m in _client(sim_gateway).models.list()}
    assert ids == {"sim-chat", "sim-slow", "sim-one-slot", "sim-embed"}


def test_embeddings_are_unit_vectors(sim_gateway: Gateway) -> None:
    out = _client(sim_gateway).embeddings.create(model="sim-embed", input=["a b", "c"])
    assert [d.index for d in out.data] == [0, 1]
    for d in out.data:
        assert len(d.embedding) == 384
        assert abs(sum(x * x for x in d.embedding) - 1.0) < 1e-3
    assert out.usage.prompt_tokens > 0


def test_one_request_id_from_response_to_ledger(sim_gateway: Gateway) -> None:
    """The gateway's id is the response header, the body's id and the ledger record's
    key; a client's own sane id is kept beside it, never in its place."""
    key = sim_gateway.new_key(tenant="t-rid")
    body = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}", "x-request-id": "abc-123"}
    given = httpx.post(sim_gateway.v1 + "/chat/completions", json=body, headers=headers)
    rid = given.headers["x-request-id"]
    assert rid != "abc-123" and len(rid) == 32
    assert given.headers["x-client-request-id"] == "abc-123"
    assert given.json()["id"] == f"chatcmpl-{rid}"
    sim_gateway.records("t-rid", 1)
    for lookup in (rid, f"chatcmpl-{rid}"):
        found = sim_gateway.admin("GET", "/usage", params={"request_id": lookup}).json()
        (record,) = found["data"]
        assert record["request_id"] == rid and record["client_request_id"] == "abc-123"
    fresh = httpx.post(sim_gateway.v1 + "/chat/completions", json=body, headers=headers)
    assert fresh.headers["x-request-id"] != rid  # the same client id twice: two requests
    assert len(sim_gateway.records("t-rid", 2)) == 2
    error = httpx.post(sim_gateway.v1 + "/chat/completions", json={"model": "nope"})
    assert len(error.headers["x-request-id"]) == 32


def test_the_ledger_charges_each_request_its_engine_time(target: tuple[Gateway, str]) -> None:
    """GPU-time attribution end to end: the engine's share of each step it was in comes
    back with the answer and lands on the ledger record, priced at the model's
    gpu_hourly_usd, beside the list price."""
    gw, model = target
    tenant = f"t-gpu-{model}"
    key = gw.new_key(tenant=tenant)
    client = openai.OpenAI(base_url=gw.v1, api_key=key, max_retries=0, timeout=120)
    for max_tokens in (2, 12):
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    short, long = sorted(gw.records(tenant, 2), key=lambda r: r["completion_tokens"])
    for record in (short, long):
        assert record["gpu_seconds"] > 0
        assert record["gpu_cost_usd"] == pytest.approx(
            record["gpu_seconds"] * GPU_HOURLY_USD / 3600
        )
    assert long["gpu_seconds"] > short["gpu_seconds"]  # ten more decode steps


def test_an_insane_client_request_id_is_never_reflected(sim_gateway: Gateway) -> None:
    body = {"model": "sim-chat", "messages": MESSAGES, "max_tokens": 2}
    raw = [(b"x-request-id", b"\xff\xfe<script>"), (b"content-type", b"application/json")]
    response = httpx.post(sim_gateway.v1 + "/chat/completions", json=body, headers=raw)
    assert response.status_code == 200
    assert "x-client-request-id" not in response.headers
    assert len(response.headers["x-request-id"]) == 32
