"""A small async load generator for OpenAI-compatible streaming endpoints.

Two arrival models:
* open loop (``run_open_loop``): Poisson arrivals on an ABSOLUTE schedule fixed before
  the run; every latency is measured from the request's INTENDED send time, so a
  server (or client) that falls behind is charged for it (no coordinated omission);
* closed loop (``run_closed_loop``): N workers, each sends its next request when the
  previous one ends (intended start = actual start).

Metric definitions (as ``vllm bench serve``): TTFT = first chunk carrying content;
ITL = gaps between consecutive content chunks; TPOT = (E2E - TTFT) / (n - 1) with n the
output tokens reported in ``usage`` (``stream_options.include_usage``); chunks per token
= content chunks / output tokens (1.0 means one token per chunk).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

# fmt: off
_WORDS = (
    "river", "stone", "cloud", "garden", "window", "paper", "silver", "morning", "engine",
    "bridge", "forest", "signal", "harbor", "lantern", "meadow", "orbit", "pepper", "quiet",
    "rocket", "summer", "tiger", "violet", "winter", "yellow", "anchor", "basket", "candle",
    "desert", "falcon", "glacier", "island", "jungle", "kettle", "ladder", "mirror", "needle",
)
# fmt: on


@dataclass(frozen=True)
class Workload:
    """What every request asks for."""

    endpoint: Literal["chat", "completions"] = "chat"
    max_tokens: int = 32
    ignore_eos: bool = True
    temperature: float = 0.0

    def body(self, model: str, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "stream": True,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass
class RequestRecord:
    """One request. Times are seconds; ``chunk_times`` are from the intended start."""

    index: int
    intended_start: float
    actual_start: float = math.nan
    ttft: float | None = None
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.e2e is not None

    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]

    def tpot(self) -> float | None:
        n = self.output_tokens or self.n_chunks
        if not self.ok or n < 2:
            return None
        assert self.e2e is not None and self.ttft is not None
        return (self.e2e - self.ttft) / (n - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "n_chunks": self.n_chunks}


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100), linear interpolation between order statistics
    (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def poisson_schedule(rate: float, n: int, seed: int) -> list[float]:
    """Intended send offsets (s from the run start) of ``n`` Poisson arrivals."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def make_prompts(count_tokens: Callable[[str], int], n: int, tokens: int, seed: int) -> list[str]:
    """``n`` distinct deterministic prompts of exactly ``tokens`` tokens as counted by
    ``count_tokens`` (which should include the chat template for the chat endpoint)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        words = [f"Item {i}:"]
        while count_tokens(" ".join(words)) < tokens:
            words.append(rng.choice(_WORDS))
        while count_tokens(" ".join(words)) > tokens and len(words) > 1:
            words.pop()
        text = " ".join(words)
        while count_tokens(text) < tokens:  # pad with single-token characters
            text += "."
        if count_tokens(text) != tokens:
            raise ValueError(f"cannot build a {tokens}-token prompt (got {count_tokens(text)})")
        prompts.append(text)
    return prompts


def chat_token_counter(model_dir: str, endpoint: str = "chat") -> Callable[[str], int]:
    """Token counter with the model's own tokenizer (and chat template for ``chat``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def count(text: str) -> int:
        if endpoint == "chat":
            rendered = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            return len(tok.encode(rendered, add_special_tokens=False))
        return len(tok.encode(text))

    return count


def parse_sse_line(line: str) -> dict[str, Any] | Literal["done"] | None:
    """One SSE line: a JSON event, ``"done"`` for ``[DONE]``, None for anything else."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return "done"
    return json.loads(payload) if payload else None


def _content(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        text += (delta.get("content") or "") if delta else (choice.get("text") or "")
    return text


async def stream_request(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], record: RequestRecord
) -> RequestRecord:
    """Send one streaming request; fill ``record`` (times from its intended start; a NaN
    intended start, as in closed loop, means "now")."""
    now = time.perf_counter
    record.actual_start = now()
    if math.isnan(record.intended_start):
        record.intended_start = record.actual_start
    t0 = record.intended_start
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                record.error = f"HTTP {resp.status_code}: {text}"
                return record
            async for line in resp.aiter_lines():
                event = parse_sse_line(line)
                if event == "done":
                    break
                if event is None:
                    continue
                if "error" in event:
                    record.error = f"stream error: {json.dumps(event['error'])[:300]}"
                    break
                if _content(event):
                    record.chunk_times.append(now() - t0)
                usage = event.get("usage")
                if usage:
                    record.output_tokens = usage.get("completion_tokens")
                    record.prompt_tokens = usage.get("prompt_tokens")
        record.e2e = now() - t0
        if record.chunk_times:
            record.ttft = record.chunk_times[0]
        elif record.error is None:
            record.error = "no content chunk"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    return record


def _client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0, connect=10.0))


OnDone = Callable[[RequestRecord], None]
BUNCHED_S = 0.001


async def run_open_loop(
    base_url: str,
    model: str,
    prompts: Sequence[str],
    workload: Workload,
    rate: float,
    seed: int = 0,
    on_done: OnDone | None = None,
) -> list[RequestRecord]:
    """One request per prompt, Poisson arrivals at ``rate`` req/s on a fixed schedule."""
    offsets = poisson_schedule(rate, len(prompts), seed)
    url = base_url.rstrip("/") + workload.path
    async with _client(64) as client:
        start = time.perf_counter() + 0.05
        tasks = []
        for i, (prompt, offset) in enumerate(zip(prompts, offsets, strict=True)):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            record = RequestRecord(index=i, intended_start=start + offset)
            task = asyncio.create_task(
                stream_request(client, url, workload.body(model, prompt), record)
            )
            if on_done is not None:
                task.add_done_callback(lambda t: on_done(t.result()))
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


async def run_closed_loop(
    base_url: str,
    model: str,
    prompts: Sequence[str],
    workload: Workload,
    concurrency: int,
    on_done: OnDone | None = None,
) -> list[RequestRecord]:
    """``concurrency`` workers share the prompts in order, one request at a time each."""
    url = base_url.rstrip("/") + workload.path
    queue = list(enumerate(prompts))[::-1]
    records: list[RequestRecord] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            i, prompt = queue.pop()
            record = RequestRecord(index=i, intended_start=math.nan)
            records.append(await stream_request(client, url, workload.body(model, prompt), record))
            if on_done is not None:
                on_done(record)

    async with _client(concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.index)


def aggregate(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """Summary metrics (seconds) over the successful requests of one run."""
    records = list(records)
    ok = [r for r in records if r.ok]
    itls = [g for r in ok for g in r.itls()]
    tpots = [t for r in ok if (t := r.tpot()) is not None]
    tokens = sum(r.output_tokens or r.n_chunks for r in ok)
    chunks = sum(r.n_chunks for r in ok)
    span = (
        (max(r.intended_start + (r.e2e or 0.0) for r in ok) - min(r.intended_start for r in ok))
        if ok
        else 0.0
    )
    lateness = [r.actual_start - r.intended_start for r in records]
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "ttft_p50": percentile([r.ttft for r in ok if r.ttft is not None], 50),
        "ttft_p99": percentile([r.ttft for r in ok if r.ttft is not None], 99),
        "tpot_p50": percentile(tpots, 50),
        "itl_p50": percentile(itls, 50),
        "itl_p99": percentile(itls, 99),
        # Chunks that reached the client together with the previous one (gap < 1 ms):
        # buffered somewhere on the way even if each carries one token.
        "itl_bunched_frac": sum(g < BUNCHED_S for g in itls) / len(itls) if itls else None,
        "e2e_p50": percentile([r.e2e for r in ok if r.e2e is not None], 50),
        "e2e_p99": percentile([r.e2e for r in ok if r.e2e is not None], 99),
        "chunks_per_token": chunks / tokens if tokens else None,
        "output_tokens": tokens,
        "output_tok_per_s": tokens / span if span > 0 else None,
        "req_per_s": len(ok) / span if span > 0 else None,
        "send_lateness_p99": percentile(lateness, 99),
    }
