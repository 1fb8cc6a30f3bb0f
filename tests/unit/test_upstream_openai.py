"""OpenAIUpstream against ``httpx.MockTransport``: error mapping, SSE parsing, usage
correction, request bodies, keys, cancellation and the concurrency slot. The same client
against a real vLLM server is in tests/integration/test_upstream_vllm.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.engine.protocol import (
    ContextLengthExceeded,
    GenerationDelta,
    InvalidRequest,
    SamplingOptions,
    StructuredOutput,
)
from app.request import InferenceRequest, Prompt, ToolChoice, TraceContext
from app.routing.spec import UpstreamPool
from app.upstream.openai_upstream import (
    OpenAIUpstream,
    UpstreamStreamError,
    UpstreamUnavailable,
    sampling_extras,
)
from tests.request_helpers import inference

Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]
CHAT = inference("r1", messages=({"role": "user", "content": "hi"},), max_tokens=8)


def spec(**kw: Any) -> UpstreamPool:
    fields: dict[str, Any] = {"kind": "openai", "base_url": "http://up.test/v1", "model": "m"}
    return UpstreamPool.model_validate(fields | kw)


def upstream(handler: Handler, **kw: Any) -> OpenAIUpstream:
    count = kw.pop("count_tokens", None)
    return OpenAIUpstream(
        "up", spec(**kw), count_tokens=count, transport=httpx.MockTransport(handler)
    )


def sse(*events: Any) -> bytes:
    out = []
    for e in events:
        out.append(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n")
    return "".join(out).encode()


def chat_chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> Any:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage(prompt: int, completion: int, cached: int | None = None) -> Any:
    u: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"object": "chat.completion.chunk", "choices": [], "usage": u}


def answer(body: bytes, status: int = 200) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body)

    return handler


async def collect(up: OpenAIUpstream, payload: InferenceRequest = CHAT, **kw: Any) -> list[Any]:
    try:
        return [d async for d in up.generate(payload, **kw)]
    finally:
        await up.aclose()


# ---- status codes and transport errors -------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "expected", "reason"),
    [
        (400, "temperature must be >= 0", InvalidRequest, None),
        (422, "bad field", InvalidRequest, None),
        (404, "The model `m` does not exist.", UpstreamUnavailable, "not_found"),
        (400, "This model's maximum context length is 512 tokens.", ContextLengthExceeded, None),
        (401, "bad key", UpstreamUnavailable, "auth"),
        (403, "forbidden", UpstreamUnavailable, "auth"),
        (429, "slow down", UpstreamUnavailable, "status_429"),
        (503, "overloaded", UpstreamUnavailable, "status_503"),
        (500, "boom", UpstreamUnavailable, "status_5xx"),
        (502, "bad gateway", UpstreamUnavailable, "status_5xx"),
    ],
)
async def test_status_codes_map_to_errors(
    status: int, message: str, expected: type[Exception], reason: str | None
) -> None:
    body = json.dumps({"error": {"message": message, "type": "x", "code": status}}).encode()
    with pytest.raises(expected) as info:
        await collect(upstream(answer(body, status)))
    if reason is None:
        assert str(info.value) == message
    else:
        assert info.value.reason == reason  # type: ignore[attr-defined]
        assert type(info.value) is UpstreamUnavailable


async def test_client_error_message_is_truncated_and_plain_bodies_are_used() -> None:
    body = json.dumps({"error": {"message": "x" * 2000}}).encode()
    with pytest.raises(InvalidRequest) as info:
        await collect(upstream(answer(body, 400)))
    assert str(info.value) == "x" * 500
    with pytest.raises(InvalidRequest, match=r"^not json here$"):
        await collect(upstream(answer(b"not json here", 400)))
    legacy = json.dumps({"object": "error", "message": "old style"}).encode()
    with pytest.raises(InvalidRequest, match=r"^old style$"):
        await collect(upstream(answer(legacy, 400)))


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (httpx.ConnectError("refused"), "connect"),
        (httpx.ConnectTimeout("slow connect"), "connect"),
        (httpx.ReadTimeout("no first byte"), "timeout"),
        (httpx.RemoteProtocolError("server disconnected"), "protocol"),
    ],
)
async def test_transport_errors_before_output_are_unavailable(exc: Exception, reason: str) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(UpstreamUnavailable) as info:
        await collect(upstream(handler))
    assert info.value.reason == reason


async def test_a_non_stream_answer_is_a_protocol_failure() -> None:
    body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
    with pytest.raises(UpstreamUnavailable) as info:
        await collect(upstream(answer(body)))
    assert info.value.reason == "protocol"


# ---- SSE parsing and usage -------------------------------------------------------------


async def test_chat_stream_yields_each_chunk_and_corrects_usage() -> None:
    body = sse(
        chat_chunk("", role=True),
        chat_chunk("Hel"),
        chat_chunk("lo"),
        chat_chunk(" you", finish="length"),
        usage(prompt=11, completion=5, cached=4),
        "[DONE]",
    )
    deltas = await collect(upstream(answer(body)), prompt_tokens_estimate=9)
    assert [d.text for d in deltas] == ["Hel", "lo", " you", ""]
    assert [d.num_new_tokens for d in deltas] == [1, 1, 1, 2]
    assert deltas[0].prompt_tokens == 9
    assert [d.finish_reason for d in deltas] == [None, None, None, "length"]
    last = deltas[-1]
    assert (last.prompt_tokens, last.cached_prompt_tokens) == (11, 4)


async def test_usage_below_the_chunk_count_never_goes_negative() -> None:
    body = sse(chat_chunk("a"), chat_chunk("b"), chat_chunk(None, "stop"), usage(3, 1), "[DONE]")
    deltas = await collect(upstream(answer(body)))
    assert deltas[-1] == GenerationDelta("", 0, "stop", prompt_tokens=3)


async def test_missing_usage_is_counted_with_count_tokens() -> None:
    body = sse(chat_chunk("ab"), chat_chunk("cd", finish="stop"), "[DONE]")
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return 7

    deltas = await collect(upstream(answer(body), count_tokens=count), prompt_tokens_estimate=5)
    assert seen == ["abcd"]
    assert sum(d.num_new_tokens for d in deltas) == 7
    assert deltas[-1] == GenerationDelta("", 5, "stop", prompt_tokens=5)


async def test_missing_usage_without_a_counter_keeps_the_chunk_count() -> None:
    body = sse(chat_chunk("ab"), chat_chunk("cd", finish="stop"), "[DONE]")
    deltas = await collect(upstream(answer(body)))
    assert sum(d.num_new_tokens for d in deltas) == 2
    assert deltas[-1].finish_reason == "stop"


async def test_completions_stream_and_sse_details() -> None:
    # CRLF line ends, comments, an event: field and a payload without the space after ':'
    raw = (
        b": keep-alive\r\n\r\n"
        b'data:{"choices":[{"index":0,"text":"one","finish_reason":null}]}\r\n\r\n'
        b"event: message\r\n"
        b'data: {"choices":[{"index":0,"text":" two","finish_reason":"tool_calls"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    payload = inference("r", prompt_text="count:")
    deltas = await collect(upstream(answer(raw)), payload)
    assert [d.text for d in deltas] == ["one", " two", ""]
    assert deltas[-1].finish_reason == "stop"


async def test_error_event_before_output_is_unavailable_and_after_is_stream_error() -> None:
    error = {"error": {"message": "engine died", "code": 500}}
    with pytest.raises(UpstreamUnavailable, match="engine died") as info:
        await collect(upstream(answer(sse(chat_chunk("", role=True), error))))
    assert info.value.reason == "protocol"
    with pytest.raises(UpstreamStreamError, match="engine died"):
        await collect(upstream(answer(sse(chat_chunk("a"), error))))


async def test_an_early_end_after_output_is_a_stream_error() -> None:
    with pytest.raises(UpstreamStreamError, match=r"\[DONE\]"):
        await collect(upstream(answer(sse(chat_chunk("a"), chat_chunk("b")))))
    with pytest.raises(UpstreamStreamError, match="invalid JSON"):
        await collect(upstream(answer(sse(chat_chunk("a"), "{not json"))))


class Body(httpx.AsyncByteStream):
    """A streamed body the test controls: chunks are released one by one."""

    def __init__(self, chunks: list[bytes], fail_after: Exception | None = None) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.chunks = chunks
        self.fail_after = fail_after
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        while (item := await self.queue.get()) is not None:
            yield item
        if self.fail_after is not None:
            raise self.fail_after

    async def aclose(self) -> None:
        self.closed = True


def streaming(body: Body, calls: list[httpx.Request] | None = None) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        if calls is not None:
            calls.append(request)
        return httpx.Response(200, stream=body)

    return handler


async def test_deltas_arrive_before_the_stream_is_complete() -> None:
    body = Body([sse(chat_chunk("first"))])
    up = upstream(streaming(body))
    stream = up.generate(CHAT)
    # The rest of the body is not sent yet: a buffering client would hang here.
    first = await asyncio.wait_for(stream.__anext__(), 10)
    assert first.text == "first"
    body.queue.put_nowait(sse(chat_chunk("second", "stop"), "[DONE]"))
    rest = [d async for d in stream]
    assert [d.text for d in rest] == ["second", ""]
    await up.aclose()


async def test_a_transport_failure_after_output_is_a_stream_error() -> None:
    body = Body([sse(chat_chunk("a"))], fail_after=httpx.ReadError("connection reset"))
    up = upstream(streaming(body))
    stream = up.generate(CHAT)
    assert (await stream.__anext__()).text == "a"
    body.queue.put_nowait(None)
    with pytest.raises(UpstreamStreamError, match="connection reset"):
        await stream.__anext__()
    await up.aclose()


async def test_closing_the_generator_closes_the_response_and_frees_the_slot() -> None:
    calls: list[httpx.Request] = []
    first = Body([sse(chat_chunk("a"))])
    up = upstream(streaming(first, calls), max_concurrency=1)
    stream = up.generate(CHAT)
    assert (await stream.__anext__()).text == "a"

    # The only slot is held for the whole stream: a second request waits for it.
    second = Body([sse(chat_chunk("b", "stop"), "[DONE]")])
    up._client._transport = httpx.MockTransport(streaming(second, calls))
    waiting = asyncio.ensure_future(up.generate(CHAT).__anext__())
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(calls) == 1 and not waiting.done()

    await stream.aclose()
    assert first.closed
    assert (await asyncio.wait_for(waiting, 10)).text == "b"
    assert len(calls) == 2
    await up.aclose()


# ---- request bodies and keys -----------------------------------------------------------


def recording(calls: list[httpx.Request]) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=sse(chat_chunk("x", "stop"), "[DONE]"))

    return handler


async def test_chat_request_body() -> None:
    calls: list[httpx.Request] = []
    payload = inference(
        request_id="req-7",
        messages=({"role": "user", "content": "hi"},),
        max_tokens=20,
        temperature=0.0,
        top_p=0.9,
        seed=3,
        stop=("\n",),
        ignore_eos=True,
    )
    await collect(upstream(recording(calls), model="their-name"), payload)
    (req,) = calls
    assert str(req.url) == "http://up.test/v1/chat/completions"
    assert req.headers["x-request-id"] == "req-7-1"  # the gateway id and the attempt
    assert "authorization" not in req.headers
    assert json.loads(req.content) == {
        "model": "their-name",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "top_p": 0.9,
        "max_tokens": 20,
        "seed": 3,
        "stop": ["\n"],
        "ignore_eos": True,
    }


async def test_completions_request_bodies_omit_unset_options() -> None:
    calls: list[httpx.Request] = []
    up = upstream(recording(calls), base_url="http://up.test/v1/")
    await collect(up, inference("a", prompt_text="once"))
    up = upstream(recording(calls))
    await collect(up, inference("b", prompt_token_ids=(1, 2, 3), max_tokens=4))
    text, ids = (json.loads(c.content) for c in calls)
    assert str(calls[0].url) == "http://up.test/v1/completions"
    assert text["prompt"] == "once"
    assert ids["prompt"] == [1, 2, 3] and ids["max_tokens"] == 4
    for body in (text, ids):
        for absent in ("messages", "seed", "stop", "ignore_eos"):
            assert absent not in body
    assert "max_tokens" not in text


async def test_a_payload_without_a_prompt_is_invalid() -> None:
    up = upstream(recording([]))
    with pytest.raises(InvalidRequest):
        await collect(up, inference("x"))


async def test_api_key_from_env_and_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[httpx.Request] = []
    monkeypatch.setenv("UPSTREAM_KEY", "sk-env")
    up = upstream(recording(calls), api_key_env="UPSTREAM_KEY")
    monkeypatch.setenv("UPSTREAM_KEY", "sk-changed")  # read once, at construction
    await collect(up)
    key_file = tmp_path / "key"
    key_file.write_text("sk-file\n")
    await collect(upstream(recording(calls), api_key_file=key_file))
    assert [c.headers["authorization"] for c in calls] == ["Bearer sk-env", "Bearer sk-file"]


def test_a_missing_key_fails_construction_without_leaking(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("UPSTREAM_KEY", raising=False)
    with pytest.raises(ValueError, match="UPSTREAM_KEY"):
        upstream(recording([]), api_key_env="UPSTREAM_KEY")
    with pytest.raises(ValueError, match="cannot read"):
        upstream(recording([]), api_key_file=tmp_path / "absent")


def test_sampling_extras_reach_the_upstream_only_when_asked() -> None:
    assert sampling_extras(SamplingOptions()) == {}  # an OpenAI server would refuse top_k
    options = SamplingOptions(
        presence_penalty=0.5, top_k=3, stop_token_ids=(1,), logit_bias=((9, -5.0),),
        structured=StructuredOutput("json_schema", '{"type": "object"}', "person"),
    )  # fmt: skip
    assert sampling_extras(options) == {
        "presence_penalty": 0.5,
        "top_k": 3,
        "stop_token_ids": [1],
        "logit_bias": {"9": -5.0},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": {"type": "object"}, "strict": True},
        },
    }
    with pytest.raises(InvalidRequest) as info:
        sampling_extras(SamplingOptions(logprobs=0))
    assert info.value.param == "logprobs"


async def test_tools_are_refused_on_an_external_pool_not_dropped() -> None:
    calls: list[httpx.Request] = []
    pool = upstream(recording(calls))
    request = InferenceRequest(
        id="r", endpoint="chat", model="m",
        prompt=Prompt(messages=({"role": "user", "content": "hi"},),
                      tools=({"type": "function", "function": {"name": "f"}},)),
        tool_choice=ToolChoice("auto"),
    )  # fmt: skip
    with pytest.raises(InvalidRequest) as info:
        async for _ in pool.generate(request):
            pass
    assert info.value.param == "tools" and calls == []  # never sent without them


async def test_the_upstream_joins_the_requests_trace() -> None:
    """W3C traceparent: the upstream's spans become children of the request's replica
    span (its id derived from the trace and the request)."""
    calls: list[httpx.Request] = []
    trace = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)
    payload = dataclasses.replace(CHAT, trace=trace)
    await collect(upstream(recording(calls)), payload)
    await collect(upstream(recording(calls)), CHAT)  # no trace context: no header
    sent = TraceContext.parse(calls[0].headers["traceparent"])
    assert sent == TraceContext(trace.trace_id, trace.span_id("replica", CHAT.id), True)
    assert "traceparent" not in calls[1].headers
