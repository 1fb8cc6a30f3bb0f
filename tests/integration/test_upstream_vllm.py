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
from app.request import InferenceRequest
from app.routing.spec import UpstreamPool
from app.upstream.openai_upstream import OpenAIUpstream, UpstreamStreamError, UpstreamUnavailable
from benchmarks.local_redis import free_port
from tests.integration.conftest import MAX_MODEL_LEN, SERVED
from tests.integration.upstreams import SLOW_CHUNKS, SlowStreams
from tests.request_helpers import inference

pytestmark = pytest.mark.integration



def pool(base_url: str, **kw: Any) -> UpstreamPool:
    fields: dict[str, Any] = {"kind": "openai", "base_url": base_url, "model": SERVED}
    return UpstreamPool.model_validate(fields | kw)


def chat(text: str, **kw: Any) -> InferenceRequest:
    return inference("t", messages=({"role": "user", "content": text},), **kw)


async def drain(up: OpenAIUpstream, payload: InferenceRequest, **kw: Any) -> list[GenerationDelta]:
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

    # The same text, chunk by chunk as it arrived. The chunk boundaries of two separate
    # streams may differ: under load vLLM merges the outputs of several engine steps
    # into one chunk (its output collector coalesces deltas a slow reader has not taken
    # yet), so only the joined text is compared across the two streams.
    assert "".join(d.text for d in deltas[:-1]) == "".join(texts) and texts
    assert all(d.text for d in deltas[:-1])  # one delta per content chunk, none empty
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
        inference("a", prompt_text="once upon a time", **common),
        inference("b", prompt_token_ids=(1, 50, 60, 70), **common),
    ):
        up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
        deltas = await drain(up, payload)
        assert sum(d.num_new_tokens for d in deltas) == 9
        assert deltas[-1].finish_reason == "length"
    assert deltas[-1].prompt_tokens == 4


async def test_over_the_context_window_is_context_length_exceeded(vllm_url: str) -> None:
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    with pytest.raises(ContextLengthExceeded, match=str(MAX_MODEL_LEN)):
        await drain(up, chat("hello", max_tokens=MAX_MODEL_LEN - 4))
    up = OpenAIUpstream("tiny", pool(vllm_url + "/v1"))
    with pytest.raises(ContextLengthExceeded):
        await drain(up, chat("hello", max_tokens=MAX_MODEL_LEN + 100))


async def _closed_by_client(timeout_s: float = 5.0) -> int:
    """Chunks the slow server sent before this test's client closed the connection."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with SlowStreams.lock:
            sent = SlowStreams.sent[-1] if SlowStreams.sent else None
        if sent is not None:
            return sent
        await asyncio.sleep(0.02)
    raise AssertionError("the upstream connection stayed open")


async def test_closing_the_stream_closes_the_upstream_connection(broken_url: str) -> None:
    SlowStreams.reset()
    up = OpenAIUpstream("slow", pool(broken_url + "/slow/v1"))
    stream = up.generate(inference("long", prompt_text="the"))
    first = await stream.__anext__()
    assert first.text == "x"  # the first chunk came while the server was still streaming
    await stream.aclose()
    assert await _closed_by_client() < SLOW_CHUNKS
    await up.aclose()


async def test_cancelling_the_consumer_task_closes_the_upstream_connection(
    broken_url: str,
) -> None:
    SlowStreams.reset()
    up = OpenAIUpstream("slow", pool(broken_url + "/slow/v1"))
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in up.generate(inference("c", prompt_text="a")):
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _closed_by_client() < SLOW_CHUNKS
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
