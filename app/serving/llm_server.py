"""LLMServer: one Ray Serve replica holding one engine.

It renders the prompt (chat template or raw text/token ids), enforces the context
window, and streams the engine's deltas to the caller one by one — no stream batching
on this path. Errors before the first delta are raised to the caller so the gateway
can still answer with a proper HTTP status.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from app import logs
from app.adapters.sources import local_dir
from app.engine.factory import EngineConfig, build_engine
from app.engine.protocol import (
    Adapter,
    ContextLengthExceeded,
    EngineLoad,
    EngineNotReady,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    KvHandoff,
    SamplingOptions,
    SpecCounters,
)
from app.engine.telemetry import EngineTelemetry
from app.engine.window import output_limit
from app.loopback import bind_replica_grpc_to_loopback
from app.models.s3 import S3SourceError
from app.request import InferenceRequest, Prompt, ToolChoice
from app.serving.engine_metrics import EngineMetrics, publish_forever
from app.serving.tools import shape_tool_calls

log = logging.getLogger(__name__)


def children(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The engine requests of ``n`` choices: one each (the engine's prefix cache shares
    the prompt), ids ``<id>-c<i>``, a given seed made ``seed + i`` so the choices differ
    yet repeat."""
    out = []
    for i in range(n):
        s = request.sampling
        sampling = s if s.seed is None else replace(s, seed=(s.seed + i) % 2**63)
        out.append(replace(request, request_id=f"{request.request_id}-c{i}", sampling=sampling))
    return out


async def merge(
    streams: list[AsyncIterator[GenerationDelta]],
) -> AsyncIterator[tuple[int, GenerationDelta]]:
    """The deltas of several streams as they come, tagged with the stream's index. A
    failing stream fails the merge; when the consumer stops, every stream is cancelled
    (which aborts its request in the engine)."""
    queue: asyncio.Queue[tuple[int, GenerationDelta | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[GenerationDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((i, delta))
            await queue.put((i, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    running = len(tasks)
    try:
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class ModelInfo:
    served_name: str
    task: str
    max_model_len: int


class LLMServer:
    """Deployment class; ``app.builders`` wraps it with ``serve.deployment``."""

    async def __init__(self, engine_config: EngineConfig) -> None:  # type: ignore[misc]
        """Ray Serve awaits this asynchronous constructor before routing traffic, so the
        warm-up generation runs before the first user request can reach the replica."""
        bind_replica_grpc_to_loopback()
        logs.configure()
        self._setup(engine_config)
        await self._engine.start()
        await self._warm_up()
        # The engine family through Ray's metrics export (only inside Ray Serve).
        metrics = EngineMetrics(engine_config.served_name)
        self._metrics_task = asyncio.get_running_loop().create_task(
            publish_forever(metrics, self._engine_sample)
        )
        log.info("engine for %s started and warm", engine_config.served_name)

    @classmethod
    async def create(cls, engine_config: EngineConfig, *, warm: bool = True) -> LLMServer:
        """Started instance outside Ray Serve (tests, tools)."""
        server = cls.__new__(cls)
        server._setup(engine_config)
        await server._engine.start()
        if warm:
            await server._warm_up()
        return server

    def _setup(self, engine_config: EngineConfig) -> None:
        self._config = engine_config
        self._kv_events: str | None = None  # where this replica's engine publishes them
        port = None
        if engine_config.publish_kv_events:
            port = free_port()
            self._kv_events = f"tcp://{_node_ip()}:{port}"
        side_channel = None
        if getattr(engine_config, "kv_connector", None) is not None:
            side_channel = (_node_ip(), free_port())
        self._engine = build_engine(engine_config, kv_events_port=port, side_channel=side_channel)
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._usd_per_s = engine_config.hourly_usd / 3600  # GPU-time cost (gpu_time)
        self._engine_id = uuid.uuid4().hex[:12]  # whose speculative totals (SpecCounters)
        self._warm = False
        self._adapter_dirs: dict[tuple[str, str, str | None], str] = {}

    async def _warm_up(self) -> None:
        """Short generations (or an embedding): the first user request must not pay the
        engine's first-step costs (~2 s on CPU). A greedy one, and on a real engine a
        sampled one with log probabilities: vLLM compiles its CPU random sampler and its
        log-probability rank kernel (``torch.compile``, a C++ build) the first time a
        request needs them, which took 30 s and more on a loaded 2-core box — a sampled
        request (the API's default temperature is 1) then got no token within its
        first-token budget."""
        if self._engine.supports_generate:
            prompt = tuple(self._engine.tokenize("Hello")) or (0,)
            samplings = [SamplingOptions(temperature=0.0)]
            if self._engine.supports_constraints:
                samplings.append(SamplingOptions(temperature=1.0, logprobs=1))
            for i, sampling in enumerate(samplings):
                warm = GenerationRequest(
                    request_id=f"warm-up-{self._config.served_name}-{i}",
                    prompt_token_ids=prompt,
                    sampling=sampling,
                    max_tokens=1,
                )
                async for _ in self._engine.generate(warm):
                    pass
        elif self._engine.supports_embed:
            await self._engine.embed(["Hello"])
        self._warm = True

    def _engine_sample(self) -> tuple[EngineStats, EngineTelemetry | None]:
        return self._engine.stats(), getattr(self._engine, "telemetry", None)

    def check_health(self) -> None:
        """Ray Serve's replica health check: an engine that died (its process killed,
        out of memory, a device fault) fails it, and Ray replaces the replica."""
        self._engine.check_health()

    def ready(self) -> ModelInfo:
        """For the gateway's ``/ready``: warm and alive, or an error."""
        self._engine.check_health()
        if not self._warm:
            raise EngineNotReady(f"{self._config.served_name} is warming up")
        return self.info()

    def knobs(self) -> dict[str, Any]:
        """The knobs this replica's engine runs with, read back from the engine."""
        return self._engine.knobs()

    def info(self) -> ModelInfo:
        return ModelInfo(
            served_name=self._config.served_name,
            task=self._config.task,
            max_model_len=self._engine.max_model_len,
        )

    def _check_sampling(self, s: SamplingOptions, tool_choice: ToolChoice | None = None) -> None:
        """Options this engine cannot honour, and token ids outside its vocabulary,
        are a 400 naming the parameter (never silently ignored). A constrained tool
        choice (required, named) is a structured output the request did not write
        itself: it is named as ``tool_choice``."""
        if not self._engine.supports_constraints:
            name = self._config.served_name
            if s.structured is not None:
                param = "response_format"
                if tool_choice is not None and tool_choice.mode != "auto":
                    param = "tool_choice"
                raise InvalidRequest(
                    f"model {name} runs on the simulated engine (no weights): "
                    f"{param} needs a real engine",
                    param,
                )
            if s.logprobs is not None:
                raise InvalidRequest(
                    f"model {name} runs on the simulated engine (no weights): it has no "
                    "log probabilities",
                    "logprobs",
                )
        vocab = self._engine.vocab_size
        for param, ids in (("stop_token_ids", s.stop_token_ids),
                           ("logit_bias", tuple(t for t, _ in s.logit_bias))):  # fmt: skip
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequest(
                    f"Token id {bad[0]} is out of the model's vocabulary (0 to {vocab - 1}).",
                    param,
                )

    def _prompt_ids(self, p: Prompt) -> list[int]:
        ids = p.ids_for(self._config.served_name)
        if ids is not None:
            vocab = self._engine.vocab_size
            if ids and (min(ids) < 0 or max(ids) >= vocab):  # C-speed on every request
                bad = next(t for t in ids if not 0 <= t < vocab)
                raise InvalidRequest(
                    f"Token id {bad} is out of the model's vocabulary (0 to {vocab - 1})."
                )
            return list(ids)
        if p.messages is not None:
            return self._engine.apply_chat_template(list(p.messages), p.tools)
        if p.text is not None:
            return self._engine.tokenize(p.text)
        raise InvalidRequest("a prompt or messages are required")

    async def generate(
        self, request: InferenceRequest, attempt: int = 1, handoff: KvHandoff | None = None
    ) -> AsyncIterator[GenerationDelta]:
        """Stream ``request`` (the gateway's request, unchanged) as the engine request of
        dispatch attempt ``attempt``: its prompt's token ids when they were counted for
        this model (or are the client's), else the prompt rendered here. ``handoff``: the
        decode leg of a disaggregated request, its prompt's KV prefilled elsewhere; its
        engine request id differs from a local attempt's (``-d``), so a local fallback
        started while the abandoned leg is still being torn down is a request of its own."""
        engine_request = await self._engine_request(request, attempt)
        if handoff is not None:
            if request.n != 1:
                raise InvalidRequest("a prefilled hand-off serves one choice (n = 1)", "n")
            engine_request = replace(
                engine_request, request_id=engine_request.request_id + "-d", handoff=handoff
            )
        first = True
        if request.n == 1:
            async for delta in self._choice(request, engine_request):
                self._count_prompt(delta)
                yield self._loaded(self._priced(delta), first)
                first = False
            return
        streams = [self._choice(request, child) for child in children(engine_request, request.n)]
        async for index, delta in merge(streams):
            self._count_prompt(delta)
            yield replace(self._loaded(self._priced(delta), first), index=index)
            first = False

    async def prefill(self, request: InferenceRequest, attempt: int = 1) -> KvHandoff:
        """The prefill leg of a disaggregated request: its prompt's KV computed here and
        kept for the decode replica to pull (``KvHandoff`` says where). Cancelling the
        call aborts it."""
        engine_request = await self._engine_request(request, attempt)
        handoff = await self._engine.prefill(
            replace(engine_request, request_id=engine_request.request_id + "-p")
        )
        self._prompt_tokens += handoff.prompt_tokens
        self._cached_tokens += handoff.cached_prompt_tokens
        if handoff.gpu_seconds is None:
            return handoff
        return replace(handoff, gpu_cost_usd=handoff.gpu_seconds * self._usd_per_s)

    async def _engine_request(self, request: InferenceRequest, attempt: int) -> GenerationRequest:
        if not self._engine.supports_generate:
            raise InvalidRequest(f"model {self._config.served_name} does not generate text")
        self._check_sampling(request.sampling, request.tool_choice)
        ids = self._prompt_ids(request.prompt)
        return GenerationRequest(
            request_id=request.engine_id(attempt),
            prompt_token_ids=tuple(ids),
            sampling=request.sampling,
            max_tokens=output_limit(
                len(ids),
                request.max_tokens,
                self._engine.max_model_len,
                request.sampling.min_tokens,
            ),
            cache_salt=request.cache_salt,
            adapter=await self._adapter(request),
            priority=request.engine_priority(),
        )

    async def _adapter(self, request: InferenceRequest) -> Adapter | None:
        """The engine's adapter of a request: its files on this node, fetched once from
        object storage when that is their source (``app.adapters.sources``)."""
        record = request.adapter
        if record is None:
            return None
        key = (record.id, record.source, record.s3_endpoint_url)
        path = self._adapter_dirs.get(key)
        if path is None:
            adapters_dir = getattr(self._config, "adapters_dir", None)
            try:
                found = await asyncio.to_thread(local_dir, record, adapters_dir)
            except S3SourceError as exc:
                raise InvalidRequest(f"adapter {record.id}: {exc}", "model") from None
            path = self._adapter_dirs[key] = str(found)
        return Adapter(record.id, path)

    def _priced(self, delta: GenerationDelta) -> GenerationDelta:
        """The engine seconds of a delta priced at this replica's accelerator-hour."""
        if delta.gpu_seconds is None:
            return delta
        return replace(delta, gpu_cost_usd=delta.gpu_seconds * self._usd_per_s)

    def _loaded(self, delta: GenerationDelta, first: bool) -> GenerationDelta:
        """The first delta carries the engine's load (the fair queue's engine caps) and,
        once it has drafted, its speculative totals (the acceptance health rule)."""
        if not first:
            return delta
        s = self._engine.stats()
        spec = None
        if s.spec_draft_tokens_total:
            spec = SpecCounters(
                self._engine_id, s.spec_draft_tokens_total, s.spec_accepted_tokens_total
            )
        load = EngineLoad(s.running, s.waiting, s.kv_cache_usage)
        return replace(delta, load=load, spec=spec)

    def _count_prompt(self, delta: GenerationDelta) -> None:
        """The engine's own prefix-cache outcome of each prompt (its first delta): how
        replica routing is judged, from what the engine reused, not what a router hoped."""
        if delta.prompt_tokens:
            self._prompt_tokens += delta.prompt_tokens
            self._cached_tokens += delta.cached_prompt_tokens

    def _choice(
        self, request: InferenceRequest, engine_request: GenerationRequest
    ) -> AsyncIterator[GenerationDelta]:
        """One choice's deltas, tool calls taken out of the text."""
        return shape_tool_calls(
            self._engine.generate(engine_request),
            request.tool_choice,
            request.prompt,
            getattr(self._config, "tool_parser", None),
            self._engine.hf_tokenizer,
            self._config.served_name,
        )

    async def embed(
        self, request: InferenceRequest, offset: int = 0
    ) -> tuple[list[list[float]], int]:
        """Vectors of ``request``'s inputs (the gateway's request, or a batch of its
        inputs starting at the client's input ``offset``) and the prompt tokens they
        used."""
        inputs = list(request.prompt.inputs or ())
        if not self._engine.supports_embed:
            raise InvalidRequest(f"model {self._config.served_name} does not embed text")
        too_long = [
            i
            for i, t in enumerate(inputs)
            if len(self._engine.tokenize(t)) > self._engine.max_model_len
        ]
        if too_long:
            raise ContextLengthExceeded(
                f"input[{offset + too_long[0]}] exceeds the model's maximum context length of "
                f"{self._engine.max_model_len} tokens"
            )
        return await self._engine.embed(inputs)

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve's per-replica routing stats, read by Switchyard's replica router:
        where this replica's engine publishes its KV-cache events (precise mode), and
        the LoRA adapters its engine holds (adapter affinity)."""
        stats: dict[str, Any] = {}
        if self._kv_events is not None:
            stats["kv_events"] = self._kv_events
        if getattr(self._config, "lora", None) is not None:
            stats["adapters"] = list(self._engine.stats().adapters)
        return stats

    def stats(self) -> EngineStats:
        """The engine's counters, plus this replica's prompt tokens and the part of them
        served from the engine's prefix cache (``prompt_tokens_total``,
        ``cached_prompt_tokens_total``)."""
        s = self._engine.stats()
        totals = {
            "prompt_tokens_total": float(self._prompt_tokens),
            "cached_prompt_tokens_total": float(self._cached_tokens),
        }
        return replace(s, extra={**s.extra, **totals})

    async def shutdown(self) -> None:
        task = getattr(self, "_metrics_task", None)
        if task is not None:
            task.cancel()
        await self._engine.shutdown()

    def __del__(self) -> None:
        """Ray Serve calls this when the replica stops: release engine processes now
        (engines holding processes offer a synchronous ``close``)."""
        close = getattr(getattr(self, "_engine", None), "close", None)
        if callable(close):
            close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _node_ip() -> str:
    """This node's address as other nodes reach it (Ray's view; loopback outside Ray)."""
    try:
        import ray.util

        return str(ray.util.get_node_ip_address())
    except Exception:
        return "127.0.0.1"
