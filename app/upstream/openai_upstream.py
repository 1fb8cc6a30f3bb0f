"""A pool backed by an external OpenAI-compatible server (vLLM, SGLang, Ollama, a vendor).

``OpenAIUpstream.generate`` streams one completion from the upstream and yields the
same ``GenerationDelta``s an in-cluster engine does. The rules:

* Always ``stream: true`` with ``stream_options.include_usage``; chat when the prompt has
  ``messages`` (``POST {base_url}/chat/completions``), else ``POST {base_url}/completions``
  with the prompt text or the client's token ids (ids counted for a local model are
  never sent: an upstream has its own tokenizer). ``ignore_eos`` (a vLLM extension) is
  sent only when true. Server-sent events are parsed as they arrive and every content
  chunk is yielded at once (``num_new_tokens=1``); nothing is buffered. The first delta
  carries ``prompt_tokens=prompt_tokens_estimate``.
* The stream ends with one last delta (text ``""``) holding the finish reason and the
  upstream's ``usage``: its ``num_new_tokens`` is ``completion_tokens`` minus the chunks
  already counted (never below 0), so the deltas sum to the upstream's count. Without a
  usage chunk the completion is counted with ``count_tokens(full_text)`` when given, else
  the per-chunk count stands.
* Failures before the first delta is yielded raise ``UpstreamUnavailable(reason)``: the
  request may be sent to another pool. Reasons: ``connect`` (no connection: nothing was
  sent), ``timeout`` (no byte within ``timeout_s``), ``status_429``, ``status_503``,
  ``status_5xx`` (other 5xx), ``auth`` (401/403: our key is wrong, not the client's
  fault), ``not_found`` (404: our base_url or model name is wrong), ``protocol`` (the
  answer is not a valid OpenAI stream: a dropped connection,
  bad JSON, an error event, an early end).
* Other upstream 4xx are the client's fault: ``InvalidRequest`` with the upstream's error
  message (at most 500 characters), or ``ContextLengthExceeded`` when a 400 mentions the
  context length (or vLLM's ``max_model_len``).
* After the first delta any failure raises ``UpstreamStreamError``: the caller ends its
  stream with an error event (retrying elsewhere would repeat text already sent).
* ``timeout_s`` is httpx's read timeout: it bounds the wait for the first byte and every
  gap between bytes, not the length of the whole stream.
* Concurrency: a semaphore of ``max_concurrency`` is held for the whole stream; callers
  beyond it wait for a slot without a bound of their own (the gateway's total request
  deadline bounds them). The connection pool is as large as the semaphore.
* Cancellation: closing the generator (or cancelling its task) exits the
  ``client.stream`` context at once, which closes the unfinished HTTP response and its
  connection, so the upstream sees the disconnect and aborts the request.
* The API key is read once at construction (``api_key_env`` or ``api_key_file``) and is
  never logged or put in an exception message.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, NoReturn

import httpx

from app.engine.protocol import (
    ContextLengthExceeded,
    FinishReason,
    GenerationDelta,
    InvalidRequest,
    SamplingOptions,
)
from app.request import InferenceRequest
from app.routing.spec import UpstreamPool

MAX_MESSAGE_CHARS = 500
# OpenAI, vLLM ("maximum context length", "cannot be greater than max_model_len"), SGLang
_CONTEXT_MARKERS = ("context length", "maximum context", "context_length_exceeded", "max_model_len")


class UpstreamUnavailable(Exception):
    """The upstream failed before any output: another pool may be tried."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"upstream unavailable ({reason}){': ' + detail if detail else ''}")
        self.reason = reason


class UpstreamStreamError(Exception):
    """The upstream failed after output was already yielded."""


def _read_api_key(spec: UpstreamPool) -> str | None:
    if spec.api_key_env is not None:
        key = os.environ.get(spec.api_key_env, "").strip()
        if not key:
            raise ValueError(f"environment variable {spec.api_key_env} is unset or empty")
        return key
    if spec.api_key_file is not None:
        try:
            key = spec.api_key_file.read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"cannot read api_key_file {spec.api_key_file}: {exc.strerror}"
            ) from None
        if not key:
            raise ValueError(f"api_key_file {spec.api_key_file} is empty")
        return key
    return None


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, or the body itself, truncated."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            text = err["message"]
        elif isinstance(err, str):
            text = err
        elif isinstance(data.get("message"), str):  # older vLLM: {"object": "error", ...}
            text = data["message"]
        elif isinstance(data.get("detail"), str):  # FastAPI
            text = data["detail"]
    return text.strip()[:MAX_MESSAGE_CHARS] or "(empty error body)"


def sampling_extras(s: SamplingOptions) -> dict[str, Any]:
    """The options beyond temperature/top_p/seed/stop, in the upstream's request, only
    where they differ from the neutral value (an OpenAI server refuses vLLM's extras
    like ``top_k``; they reach it only when the client asked for them). Log
    probabilities are refused: the upstream's are not relayed yet."""
    if s.logprobs is not None:
        raise InvalidRequest("logprobs are not relayed from external pools yet", "logprobs")
    body: dict[str, Any] = {}
    neutral = SamplingOptions()
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "top_k",
                 "min_p", "min_tokens"):  # fmt: skip
        if getattr(s, name) != getattr(neutral, name):
            body[name] = getattr(s, name)
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if s.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in s.logit_bias}
    if s.structured is not None:
        if s.structured.kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        else:
            schema = json.loads(s.structured.schema or "{}")
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": s.structured.name, "schema": schema, "strict": True},
            }
    return body


def _status_error(status: int, body: bytes) -> Exception:
    message = _error_message(body)
    if status == 429:
        return UpstreamUnavailable("status_429", message)
    if status == 503:
        return UpstreamUnavailable("status_503", message)
    if status >= 500:
        return UpstreamUnavailable("status_5xx", f"HTTP {status}: {message}")
    if status in (401, 403):
        return UpstreamUnavailable("auth", f"HTTP {status}: {message}")
    if status == 404:  # our base_url or model name is wrong, not the client's request
        return UpstreamUnavailable("not_found", f"HTTP 404: {message}")
    if status >= 400:
        if status == 400 and any(m in message.lower() for m in _CONTEXT_MARKERS):
            return ContextLengthExceeded(message)
        return InvalidRequest(message)
    return UpstreamUnavailable("protocol", f"unexpected HTTP {status}")


def _transport_reason(exc: httpx.RequestError) -> str:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "protocol"


def _finish(reason: object) -> FinishReason:
    if reason in ("stop", "length", "abort"):
        return reason
    return "stop"  # tool_calls, content_filter, eos, ...


class _StreamState:
    """What one stream has seen so far."""

    def __init__(self) -> None:
        self.chunks = 0  # content chunks yielded (one token each)
        self.text: list[str] = []
        self.finish: object = None
        self.usage: dict[str, Any] | None = None
        self.done = False


class OpenAIUpstream:
    """Streams completions from one OpenAI-compatible upstream pool."""

    def __init__(
        self,
        name: str,
        spec: UpstreamPool,
        *,
        count_tokens: Callable[[str], int] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self._count_tokens = count_tokens
        self._base = spec.base_url.rstrip("/")
        headers = {"Accept": "text/event-stream"}
        key = _read_api_key(spec)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        n = spec.max_concurrency
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(spec.timeout_s, connect=spec.connect_timeout_s),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            transport=transport,
        )
        self._slots = asyncio.Semaphore(n)

    def _request(self, r: InferenceRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.spec.model}
        p, s = r.prompt, r.sampling
        if p.tools or r.tool_choice is not None:
            raise InvalidRequest("tool calls are not relayed from external pools yet", "tools")
        if r.n != 1:
            raise InvalidRequest("n > 1 is not relayed to external pools yet", "n")
        if p.messages is not None:
            url = f"{self._base}/chat/completions"
            body["messages"] = [dict(m) for m in p.messages]
        elif p.text is not None:
            url, body["prompt"] = f"{self._base}/completions", p.text
        elif p.client_ids and p.token_ids is not None:
            url, body["prompt"] = f"{self._base}/completions", list(p.token_ids)
        else:
            raise InvalidRequest("a prompt or messages are required")
        body.update(stream=True, stream_options={"include_usage": True})
        body.update(temperature=s.temperature, top_p=s.top_p)
        if r.max_tokens is not None:
            body["max_tokens"] = r.max_tokens
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if s.ignore_eos:
            body["ignore_eos"] = True
        body.update(sampling_extras(s))
        return url, body

    async def generate(
        self, request: InferenceRequest, attempt: int = 1, *, prompt_tokens_estimate: int = 0
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Stream ``request`` (the gateway's, unchanged) as dispatch attempt ``attempt``:
        the upstream gets ``x-request-id`` = the engine id of that attempt."""
        url, body = self._request(request)
        headers = {"X-Request-Id": request.engine_id(attempt)}
        if request.trace is not None:  # the upstream's spans join the request's trace
            parent = request.trace.span_id("replica", request.id)
            headers["traceparent"] = request.trace.traceparent(parent)
        st = _StreamState()
        async with self._slots:
            try:
                async with self._client.stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code != 200:
                        raise _status_error(resp.status_code, await resp.aread())
                    async with aclosing(self._events(resp, st)) as events:
                        async for text in events:
                            first = st.chunks == 0
                            st.chunks += 1
                            st.text.append(text)
                            yield GenerationDelta(
                                text, 1, prompt_tokens=prompt_tokens_estimate if first else 0
                            )
            except httpx.RequestError as exc:
                detail = f"{type(exc).__name__}: {exc}"
                if st.chunks:
                    raise UpstreamStreamError(f"upstream {self.name}: {detail}") from exc
                raise UpstreamUnavailable(_transport_reason(exc), detail) from exc
        if not st.done and st.finish is None:
            self._fail(st, "the stream ended before [DONE]")
        yield self._last(st, prompt_tokens_estimate)

    def _fail(self, st: _StreamState, detail: str) -> NoReturn:
        if st.chunks:
            raise UpstreamStreamError(f"upstream {self.name}: {detail}")
        raise UpstreamUnavailable("protocol", detail)

    def _last(self, st: _StreamState, prompt_estimate: int) -> GenerationDelta:
        prompt, cached = prompt_estimate, 0
        if st.usage is not None:
            total = int(st.usage.get("completion_tokens") or 0)
            prompt = int(st.usage.get("prompt_tokens") or prompt_estimate)
            details = st.usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                cached = int(details.get("cached_tokens") or 0)
        elif self._count_tokens is not None:
            total = self._count_tokens("".join(st.text))
        else:
            total = st.chunks
        return GenerationDelta(
            "",
            max(0, total - st.chunks),
            finish_reason=_finish(st.finish),
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
        )

    async def _events(self, resp: httpx.Response, st: _StreamState) -> AsyncGenerator[str, None]:
        """Content texts of the SSE stream as they arrive; records finish and usage."""
        data: list[str] = []
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
                continue
            if line or not data:  # comments, event:/id: fields, keep-alive blank lines
                continue
            event, data = "\n".join(data), []
            text = self._parse(event, st)
            if st.done:
                return
            if text:
                yield text
        if data:  # a last event without its blank line
            text = self._parse("\n".join(data), st)
            if text:
                yield text

    def _parse(self, event: str, st: _StreamState) -> str | None:
        if event.strip() == "[DONE]":
            st.done = True
            return None
        try:
            chunk = json.loads(event)
        except ValueError:
            self._fail(st, f"invalid JSON in the stream: {event[:100]!r}")
        if not isinstance(chunk, dict):
            self._fail(st, "a stream event is not a JSON object")
        if "error" in chunk:
            self._fail(st, f"error event: {_error_message(json.dumps(chunk).encode())}")
        if isinstance(chunk.get("usage"), dict):
            st.usage = chunk["usage"]
        text = None
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if choice.get("finish_reason") is not None:
                st.finish = choice["finish_reason"]
        return text if isinstance(text, str) and text else None

    async def aclose(self) -> None:
        await self._client.aclose()
