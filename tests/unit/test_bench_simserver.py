"""The standalone simulated OpenAI server (app.bench.simserver), over real HTTP."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.bench.simserver import SimServerConfig, serve_in_background
from app.bench.virtual_time import VirtualTime
from app.engine.simulated import SimulationProfile

FAST = SimulationProfile(
    decode_base_s=0.002, decode_s_per_seq=0, prefill_base_s=0.003, prefill_s_per_token=0
)
EMBED = SimulationProfile(embedding_dim=16, prefill_s_per_token=0)
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Which track does the cargo train take?"}
]


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serve_in_background(SimServerConfig(profile=FAST, embed_profile=EMBED)) as base:
        yield base


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        yield c


def _chat(max_tokens: int = 5, **extra: Any) -> dict[str, Any]:
    return {"model": "simulated-llm", "messages": CHAT, "max_tokens": max_tokens, **extra}


async def _events(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[str]:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]


async def _ttft(client: httpx.AsyncClient, started: float) -> float:
    """Seconds from ``started`` to the first content chunk of a streamed chat."""
    async with client.stream("POST", "/v1/chat/completions", json=_chat(stream=True)) as r:
        async for line in r.aiter_lines():
            delta = json.loads(line[6:])["choices"][0]["delta"] if line[6:7] == "{" else {}
            if delta.get("content"):
                return time.perf_counter() - started
    raise AssertionError("no content chunk")


async def _stats(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/sim/stats")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


async def _until(client: httpx.AsyncClient, key: str, value: int) -> dict[str, Any]:
    deadline = time.monotonic() + 3
    while (stats := await _stats(client))[key] != value and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert stats[key] == value, stats
    return stats


async def test_streamed_chat_has_role_content_usage_and_done(client: httpx.AsyncClient) -> None:
    body = _chat(7, stream=True, stream_options={"include_usage": True}, ignore_eos=True)
    events = await _events(client, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    content = [c for c in chunks[1:-1] if c["choices"][0]["delta"].get("content")]
    assert len(content) == 7  # one chunk per token with this vocabulary
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage_chunk(client: httpx.AsyncClient) -> None:
    events = await _events(client, "/v1/chat/completions", _chat(3, stream=True))
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])


async def test_sdk_chat_stream_and_non_stream(url: str) -> None:
    sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
    stream = await sdk.chat.completions.create(
        model="simulated-llm",
        messages=CHAT,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    full = await sdk.chat.completions.create(
        model="simulated-llm",
        messages=CHAT,
        max_tokens=4,
        temperature=0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 4
    assert len(full.choices[0].message.content.split()) == 4  # type: ignore[union-attr]
    assert text.split() and len(text.split()) == 4
    await sdk.close()


async def test_completions_stream_and_json(client: httpx.AsyncClient) -> None:
    body = {"model": "simulated-llm", "prompt": "the north line", "max_tokens": 3}
    response = await client.post("/v1/completions", json={**body, "ignore_eos": True})
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    events = await _events(client, "/v1/completions", {**body, "stream": True, "seed": 1})
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "text_completion" for e in events[:-1])
    # Token ids are accepted as the prompt as well; no max_tokens means OpenAI's 16.
    ids = {"model": "simulated-llm", "prompt": [1, 2, 3, 4], "ignore_eos": True}
    response = await client.post("/v1/completions", json=ids)
    assert response.json()["usage"]["completion_tokens"] == 16


async def test_greedy_output_is_repeatable_and_stop_cuts_it(client: httpx.AsyncClient) -> None:
    body = _chat(6, temperature=0, ignore_eos=True)
    first, again = [(await client.post("/v1/chat/completions", json=body)).json() for _ in range(2)]
    text = first["choices"][0]["message"]["content"]
    assert text == again["choices"][0]["message"]["content"]
    stop = text.split()[2]
    stopped = await client.post("/v1/chat/completions", json={**body, "stop": [stop]})
    choice = stopped.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert text.startswith(choice["message"]["content"])  # cut at the stop string
    assert stop not in choice["message"]["content"]
    # max_completion_tokens wins over max_tokens for chat, as in OpenAI's API.
    capped = await client.post("/v1/chat/completions", json={**body, "max_completion_tokens": 2})
    assert capped.json()["usage"]["completion_tokens"] == 2


async def test_embeddings_float_and_sdk_base64(client: httpx.AsyncClient, url: str) -> None:
    body = {"model": "simulated-embed", "input": ["red signal", "green light"]}
    data = (await client.post("/v1/embeddings", json=body)).json()
    assert [d["index"] for d in data["data"]] == [0, 1]
    assert all(len(d["embedding"]) == 16 for d in data["data"])
    assert data["usage"]["prompt_tokens"] == 4
    sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
    out = await sdk.embeddings.create(model="simulated-embed", input="red signal")
    assert len(out.data[0].embedding) == 16
    assert out.data[0].embedding == pytest.approx(data["data"][0]["embedding"], abs=1e-6)
    await sdk.close()


async def test_models_and_health(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    cards = {m["id"]: m for m in models["data"]}
    assert set(cards) == {"simulated-llm", "simulated-embed"}
    assert cards["simulated-llm"]["max_model_len"] == FAST.max_model_len
    assert (await client.get("/health")).status_code == 200


ERRORS: list[tuple[str, Any, int, str | None]] = [
    ("/v1/chat/completions", {"model": "nope", "messages": CHAT}, 404, "model_not_found"),
    ("/v1/embeddings", {"model": "simulated-llm", "input": "x"}, 404, "model_not_found"),
    ("/v1/chat/completions", b'{"model": ', 400, "invalid_json"),
    ("/v1/chat/completions", [1, 2], 400, "invalid_json"),
    ("/v1/chat/completions", {"model": "simulated-llm", "messages": []}, 400, None),
    ("/v1/completions", {"model": "simulated-llm", "prompt": "x", "max_tokens": 0}, 400, None),
    (
        "/v1/completions",
        {"model": "simulated-llm", "prompt": "x", "max_tokens": FAST.max_model_len},
        400,
        "context_length_exceeded",
    ),
]


async def test_errors_have_the_openai_shape(client: httpx.AsyncClient) -> None:
    for path, body, status, code in ERRORS:
        if isinstance(body, bytes):
            response = await client.post(path, content=body)
        else:
            response = await client.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert code is None or error["code"] == code, (path, body, error)


async def test_full_queue_is_429() -> None:
    tight = FAST.model_copy(update={"max_batch_size": 1, "max_waiting": 1})
    async with (
        serve_in_background(SimServerConfig(profile=tight)) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        long = _chat(1000, stream=True, ignore_eos=True)
        async with (
            client.stream("POST", "/v1/chat/completions", json=long),
            client.stream("POST", "/v1/chat/completions", json=long),
        ):
            await _until(client, "waiting", 1)
            response = await client.post("/v1/chat/completions", json=_chat())
            assert response.status_code == 429
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
        stats = await _until(client, "aborted_total", 2)
        assert stats["running"] == stats["waiting"] == 0


async def test_stall_holds_new_and_running_requests() -> None:
    """In virtual time (the server's engines and stall on one clock with the test):
    a 0.3 s stall delays a new request's first token by exactly its length and holds
    the running stream's chunks for as long."""
    vt = VirtualTime(settle=200)
    config = SimServerConfig(profile=FAST, embed_profile=EMBED)

    async def first_token(client: httpx.AsyncClient) -> float:
        started = vt()
        async with client.stream("POST", "/v1/chat/completions", json=_chat(stream=True)) as r:
            async for line in r.aiter_lines():
                delta = json.loads(line[6:])["choices"][0]["delta"] if line[6:7] == "{" else {}
                if delta.get("content"):
                    return vt() - started
        raise AssertionError("no content chunk")

    async def scenario(client: httpx.AsyncClient) -> dict[str, Any]:
        before = await first_token(client)  # no stall yet
        arrivals: list[float] = []
        body = _chat(1000, stream=True, ignore_eos=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as running:
            lines = running.aiter_lines()
            async for line in lines:
                if '"content":"' in line and '"content":""' not in line:
                    break  # the running stream is producing content
            started = vt()

            async def read_running() -> None:
                async for line in lines:
                    if line:
                        arrivals.append(vt())
                        if arrivals[-1] - started > 0.35:
                            return

            reader = asyncio.create_task(read_running())
            stall = await client.post("/sim/stall", json={"seconds": 0.3})
            during = await first_token(client)
            await reader
        stats = await _stats(client)
        return {"before": before, "stall": stall, "during": during, "started": started,
                "arrivals": arrivals, "stats": stats}  # fmt: skip

    async with (
        serve_in_background(config, clock=vt, sleep=vt.sleep) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        task = asyncio.ensure_future(scenario(client))
        while not task.done():
            await vt.run(task.done)
        got = task.result()
    stall = got["stall"]
    assert stall.status_code == 200
    assert stall.json()["stalled_s"] == pytest.approx(0.3)
    assert stall.json()["stalled_until"] > time.time() - 1
    ttft = FAST.prefill_base_s + FAST.decode_base_s
    assert got["before"] == pytest.approx(ttft)
    # held for exactly the stall, then its first token one prefill and one step later
    # (virtual time: deterministic, no wall clock; chunks leave without Nagle's hold)
    assert got["during"] == pytest.approx(0.3 + ttft)
    # The running stream sent nothing from the stall's start to its end.
    gaps = [b - a for a, b in itertools.pairwise([got["started"], *got["arrivals"]])]
    assert max(gaps) == pytest.approx(0.3, abs=FAST.decode_base_s)
    assert got["stats"]["stalled_s"] == 0


def _accepted_nodelay(port: int) -> list[int]:
    """TCP_NODELAY of this process's connected sockets whose local port is ``port``."""
    flags = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # not a socket, or closed meanwhile
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family != socket.AF_INET:
                continue
            try:
                local, _ = sock.getsockname(), sock.getpeername()
            except OSError:
                continue  # the listener has no peer
            if local[1] == port:
                flags.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    return flags


async def test_accepted_connections_send_without_nagle() -> None:
    """Each SSE chunk leaves at once: a listener bound with proto 0 gives accepted sockets
    no TCP_NODELAY under asyncio, and a chunk then waits for the peer's delayed ACK."""
    async with (
        serve_in_background(SimServerConfig(profile=FAST)) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        assert (await client.get("/v1/models")).status_code == 200  # the connection stays open
        flags = _accepted_nodelay(int(base.rsplit(":", 1)[1]))
    assert flags and all(flags), flags


async def test_bad_stall_body_is_400(client: httpx.AsyncClient) -> None:
    for body in ({"seconds": -1}, {"secs": 1}, "x"):
        response = await client.post("/sim/stall", json=body)
        assert response.status_code == 400


@pytest.mark.parametrize("queued", [False, True])
async def test_client_disconnect_aborts_the_engine_request(queued: bool) -> None:
    profile = FAST.model_copy(update={"decode_base_s": 0.01, "max_batch_size": 1})
    async with (
        serve_in_background(SimServerConfig(profile=profile)) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
        httpx.AsyncClient(base_url=base, timeout=10) as other,
    ):
        body = _chat(1000, stream=True, ignore_eos=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if queued:  # a second stream waits behind the first; leave it while queued
                async with other.stream("POST", "/v1/chat/completions", json=body):
                    await _until(client, "waiting", 1)
                stats = await _until(client, "aborted_total", 1)
                assert stats["waiting"] == 0 and stats["running"] == 1
            else:
                n = 0
                async for line in response.aiter_lines():
                    n += line.startswith("data: ")
                    if n >= 3:
                        break
        stats = await _until(client, "aborted_total", 2 if queued else 1)
        assert stats["running"] == stats["waiting"] == 0
        await _until(client, "open_streams", 0)
        assert stats["finished_total"] == 0


def test_config_defaults_and_unknown_fields() -> None:
    assert SimServerConfig().model == "simulated-llm"
    with pytest.raises(ValueError):
        SimServerConfig(unknown=1)  # type: ignore[call-arg]
