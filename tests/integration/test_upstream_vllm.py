"""OpenAIUpstream against real servers: vLLM's own OpenAI server (a subprocess on the
tiny random-weight Llama) and a deliberately broken HTTP server (503, a connection
dropped mid-stream, no answer at all), plus a port nobody listens on."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from app.engine.protocol import ContextLengthExceeded, GenerationDelta
from app.routing.spec import UpstreamPool
from app.serving.llm_server import GeneratePayload
from app.upstream.openai_upstream import OpenAIUpstream, UpstreamStreamError, UpstreamUnavailable
from benchmarks.local_redis import free_port
from tests.integration.conftest import MAX_MODEL_LEN, SERVED

pytestmark = pytest.mark.integration



def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of Prometheus metric ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def pool(base_url: str, **kw: Any) -> UpstreamPool:
    fields: dict[str, Any] = {"kind": "openai", "base_url": base_url, "model": SERVED}
    return UpstreamPool.model_validate(fields | kw)


def chat(text: str, **kw: Any) -> GeneratePayload:
    return GeneratePayload(request_id="t", messages=({"role": "user", "content": text},), **kw)


async def drain(up: OpenAIUpstream, payload: GeneratePayload, **kw: Any) -> list[GenerationDelta]:
    try:
        return [d async for d in up.generate(payload, **kw)]
    finally:
        await up.aclose()


# ---- a real vLLM server ----------------------------------------------------------------


async def test_chat_stream_matches_the_servers_own_stream_and_usage(vllm_url: str) -> None:
    payload = chat("hello world", max_tokens=24, temperature=0.0, seed=7)
    deltas = await drain(OpenAIUpstream("tiny", pool(vllm_url + "/v1")), payload)

    # The same request straight to vLLM: the text of its content chunks and its usage.
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 24,
        "temperature": 0.0,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    texts: list[str] = []
    usage: dict[str, Any] = {}
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", vllm_url + "/v1/chat/completions", json=body) as resp,
    ):
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    texts.append(choice["delta"]["content"])

    assert [d.text for d in deltas[:-1]] == texts and texts
    assert all(d.num_new_tokens == 1 for d in deltas[:-1])
    assert sum(d.num_new_tokens for d in deltas) == usage["completion_tokens"]
    assert deltas[-1].prompt_tokens == usage["prompt_tokens"]
    assert deltas[-1].finish_reason in ("stop", "length")


async def test_prompt_estimate_on_the_first_delta_and_exact_count_on_the_last(
    vllm_url: str,
) -> None:
    payload = chat("what is the capital of France?", max_tokens=20, ignore_eos=True)
    deltas = await drain(
        OpenAIUpstream("tiny", pool(vllm_url + "/v1")), payload, prompt_tokens_estimate=3
    )
    assert deltas[0].prompt_tokens == 3
    assert sum(d.num_new_tokens for d in deltas) == 20
    last = deltas[-1]
    assert last.finish_reason == "length" and last.text == ""
    assert last.prompt_tokens > 3  # the server's count replaced the estimate


async def test_completions_with_text_and_token_ids(vllm_url: str) -> None:
    common: dict[str, Any] = {"max_tokens": 9, "ignore_eos": True}
    for payload in (
        GeneratePayload(request_id="a", prompt_text="once upon a time", **common),
        GeneratePayload(request_id="b", prompt_token_ids=(1, 50, 60, 70), **common),
    ):
        up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
        deltas = await drain(up, payload)
        assert sum(d.num_new_tokens for d in deltas) == 9
        assert deltas[-1].finish_reason == "length"
    assert deltas[-1].prompt_tokens == 4


async def test_over_the_context_window_is_context_length_exceeded(vllm_url: str) -> None:
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    with pytest.raises(ContextLengthExceeded, match="512"):
        await drain(up, chat("hello", max_tokens=MAX_MODEL_LEN - 4))
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    with pytest.raises(ContextLengthExceeded):
        await drain(up, chat("hello", max_tokens=MAX_MODEL_LEN + 100))


LONG = 500  # tokens: ~1 s of work for the server, enough to be cut short


def counters(url: str) -> tuple[float, float, float]:
    """(requests running, requests finished on their own, tokens generated). vLLM counts
    no request its client abandoned as finished (not even as ``abort``)."""
    return (
        metric(url, "vllm:num_requests_running"),
        metric(url, "vllm:request_success_total"),
        metric(url, "vllm:generation_tokens_total"),
    )


async def settled(url: str, timeout_s: float = 15.0) -> tuple[float, float, float]:
    """The counters once nothing runs or waits and three reads 0.4 s apart agree (an
    unaborted request would still be adding tokens; vLLM's counters also lag a little
    behind the requests they count)."""
    deadline = time.monotonic() + timeout_s
    last = await asyncio.to_thread(counters, url)
    same = 0
    while time.monotonic() < deadline and same < 2:
        await asyncio.sleep(0.4)
        now = await asyncio.to_thread(counters, url)
        idle = now[0] == 0 and metric(url, "vllm:num_requests_waiting") == 0
        same = same + 1 if now == last and idle else 0
        last = now
    return last


async def assert_aborted(url: str, before: tuple[float, float, float]) -> None:
    """The one request sent since ``before`` was stopped by the server: nothing runs and
    it generated fewer tokens than it asked for (with ``ignore_eos`` only an abort stops
    it early)."""
    running, _done, tokens = await settled(url)
    assert running == 0
    assert 0 < tokens - before[2] < LONG


async def test_closing_the_stream_aborts_the_request_upstream(vllm_url: str) -> None:
    before = await settled(vllm_url)
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    payload = GeneratePayload(
        request_id="long", prompt_text="the", max_tokens=LONG, ignore_eos=True
    )
    stream = up.generate(payload)
    first = await stream.__anext__()
    assert first.num_new_tokens == 1
    await stream.aclose()
    # Also shows the first delta came before the server was done: nothing was buffered.
    await assert_aborted(vllm_url, before)
    await up.aclose()


async def test_cancelling_the_consumer_task_aborts_the_request_upstream(vllm_url: str) -> None:
    before = await settled(vllm_url)
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    got_one = asyncio.Event()

    async def consume() -> None:
        payload = GeneratePayload(request_id="c", prompt_text="a", max_tokens=LONG, ignore_eos=True)
        async for _ in up.generate(payload):
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_aborted(vllm_url, before)
    await up.aclose()


# ---- a broken server and a closed port -------------------------------------------------


async def test_503_is_unavailable(broken_url: str) -> None:
    with pytest.raises(UpstreamUnavailable) as info:
        await drain(OpenAIUpstream("b", pool(broken_url + "/503/v1")), chat("hi"))
    assert info.value.reason == "status_503"


async def test_a_connection_dropped_mid_stream_is_a_stream_error(broken_url: str) -> None:
    up = OpenAIUpstream("b", pool(broken_url + "/drop/v1"))
    stream = up.generate(chat("hi"))
    assert (await stream.__anext__()).text == "one"
    with pytest.raises(UpstreamStreamError):
        await stream.__anext__()
    await up.aclose()


async def test_no_first_byte_within_timeout_is_unavailable(broken_url: str) -> None:
    up = OpenAIUpstream("b", pool(broken_url + "/hang/v1", timeout_s=0.5))
    with pytest.raises(UpstreamUnavailable) as info:
        await drain(up, chat("hi"))
    assert info.value.reason == "timeout"


async def test_a_closed_port_is_unavailable() -> None:
    up = OpenAIUpstream("none", pool(f"http://127.0.0.1:{free_port()}/v1"))
    with pytest.raises(UpstreamUnavailable) as info:
        await drain(up, chat("hi"))
    assert info.value.reason == "connect"
