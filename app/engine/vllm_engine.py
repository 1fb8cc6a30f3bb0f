"""The real engine: vLLM's ``AsyncLLM`` (CPU build here, CUDA build in production).

Tokens are streamed with ``RequestOutputKind.DELTA``, one delta per engine step, and
nothing is batched on the way out. A consumer that stops iterating (client gone) makes
vLLM abort the request: ``AsyncLLM.generate`` aborts on ``CancelledError`` /
``GeneratorExit``; we count those aborts here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from app.engine.kv_transfer import (
    PREFILL_PARAMS,
    ConnectorCounters,
    KvConnector,
    bind_cpu_compute,
    set_side_channel,
)
from app.engine.lora import AdapterBook, LoraSettings
from app.engine.protocol import (
    Adapter,
    EngineDead,
    EngineNotReady,
    EngineOverloaded,
    EngineStats,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    KvHandoff,
)
from app.engine.settings import EngineSettings
from app.engine.telemetry import EngineTelemetry
from app.engine.tokenizer import HFPromptTokenizer
from app.engine.vllm_gpu_time import QUALNAME as METERED_SCHEDULER
from app.engine.vllm_gpu_time import strip as strip_gpu_seconds
from app.engine.vllm_params import (
    finish_reason,
    request_times,
    sampling_params,
    token_logprobs,
)
from app.engine.vllm_stats import stat_logger
from app.models.s3 import FetchProgress, S3Location, S3SourceError, fetch_model
from app.schema import StrictFrozen

log = logging.getLogger(__name__)


class S3Source(StrictFrozen):
    """Weights in object storage, fetched by the replica into ``model_path`` on its own
    node at start (once per node; see ``app.models.s3``)."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None


class VLLMEngineConfig(StrictFrozen):
    """Engine arguments we expose; everything else keeps vLLM's defaults."""

    kind: Literal["vllm"] = "vllm"
    model_path: Path
    # Set: ``model_path`` is this node's cache of the object-storage source, filled at
    # start when absent.
    s3: S3Source | None = None
    served_name: str
    task: Literal["generate", "embed"] = "generate"
    max_model_len: int = 2048
    kv_cache_memory_bytes: int | None = 512 * 1024**2  # None: gpu_memory_utilization
    max_num_seqs: int = 32
    max_waiting: int = 256
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    seed: int = 0
    cache_root: Path | None = None
    # vLLM's speculative decoding (e.g. {"method": "ngram", "num_speculative_tokens": 4,
    # "prompt_lookup_max": 4} or a draft model): the draft pool of a routes file.
    speculative_config: dict[str, Any] | None = None
    # Placement and GPU knobs (tensor parallel, quantization, engine_kwargs …).
    settings: EngineSettings = EngineSettings()
    # vLLM's tool parser for tool_choice "auto" (hermes, llama3_json, pythonic …).
    tool_parser: str | None = None
    # Publish KV-cache events (a router in precise mode follows them).
    publish_kv_events: bool = False
    # US dollars per hour of this replica's accelerators: its engine seconds' price.
    hourly_usd: float = 0.0
    # Serve LoRA adapters of this model (vLLM multi-LoRA); None: the base only.
    lora: LoraSettings | None = None
    # Where this node keeps adapters fetched from object storage.
    adapters_dir: Path | None = None
    # Prefill/decode disaggregation: the KV connector, and this engine's role in it.
    kv_connector: KvConnector | None = None
    pd_role: Literal["prefill", "decode"] | None = None


def engine_args(c: VLLMEngineConfig, kv_events_port: int | None = None) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` of one engine: Switchyard's own, then the model's
    settings (tensor parallel, quantization, engine_kwargs …) over them. With a
    ``kv_events_port`` the engine publishes its KV-cache events there (ZMQ)."""
    args: dict[str, Any] = {
        "model": str(c.model_path),
        "served_model_name": [c.served_name],
        "runner": "pooling" if c.task == "embed" else "generate",
        "max_model_len": c.max_model_len,
        "max_num_seqs": c.max_num_seqs,
        "enforce_eager": c.enforce_eager,
        "enable_prefix_caching": c.enable_prefix_caching if c.task == "generate" else False,
        "dtype": c.settings.vllm_dtype(c.dtype, c.task),
        "seed": c.seed,
        "disable_log_stats": True,
        # GPU-time attribution (app.engine.vllm_gpu_time): each step's time split across
        # its requests; vLLM's own per-step times give the engine's busy total.
        "enable_logging_iteration_details": True,
        "speculative_config": c.speculative_config,
        # Constrained JSON (response_format, tool calls) without free whitespace between
        # tokens, like OpenAI's: a weak model otherwise pads with whitespace until
        # max_tokens cuts the answer. vLLM 0.29 reads this per engine, not per request,
        # and only with a named backend: llguidance (the widest JSON Schema support).
        # engine_kwargs.structured_outputs_config replaces it.
        "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
    }
    if c.task == "generate":
        args["scheduler_cls"] = METERED_SCHEDULER
    if c.kv_cache_memory_bytes is not None:
        args["kv_cache_memory_bytes"] = c.kv_cache_memory_bytes
    if c.lora is not None:
        args.update(c.lora.vllm_args())
    if c.kv_connector is not None:
        args["kv_transfer_config"] = c.kv_connector.vllm_config(
            c.pd_role or "pd", on_gpu=c.settings.on_gpu
        )
    if kv_events_port is not None:
        from vllm.config import KVEventsConfig

        args["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{kv_events_port}"
        )
    args = {**args, **c.settings.vllm_args()}
    if isinstance(args["structured_outputs_config"], dict):  # vLLM wants its config type
        from vllm.config import StructuredOutputsConfig

        args["structured_outputs_config"] = StructuredOutputsConfig(
            **args["structured_outputs_config"]
        )
    return args


class Charge:
    """A request's engine seconds (``app.engine.vllm_gpu_time``): its outputs carry the
    total so far; a delta gets what is new since the previous one."""

    def __init__(self) -> None:
        self._total: float | None = None
        self._taken = 0.0

    def read(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """The connector's own parameters of an output, its charge noted."""
        rest, total = strip_gpu_seconds(params)
        if total is not None:
            self._total = total
        return rest

    def take(self) -> float | None:
        """Seconds charged since the last ``take``; None while the engine reported none."""
        if self._total is None:
            return None
        new, self._taken = self._total - self._taken, self._total
        return new


class VLLMEngine:
    """Adapter from the ``Engine`` protocol to ``vllm.v1.engine.async_llm.AsyncLLM``."""

    def __init__(
        self,
        config: VLLMEngineConfig,
        kv_events_port: int | None = None,
        side_channel: tuple[str, int] | None = None,
    ) -> None:
        """``side_channel``: (address, port) of this engine's NIXL handshake listener,
        when its config has a KV connector."""
        self.config = config
        self._kv_events_port = kv_events_port
        self._side_channel = side_channel
        self.max_model_len = config.max_model_len
        self.vocab_size = 0  # known once the tokenizer is loaded (start)
        self.supports_generate = config.task == "generate"
        self.supports_embed = config.task == "embed"
        self.supports_constraints = True
        self.supports_handoff = config.kv_connector is not None
        self._llm: Any = None
        self._tokenizer: Any = None
        self._in_flight = 0
        self._aborted = 0
        self._finished = 0
        self._adapters = AdapterBook()
        self._prefills = 0
        self._connector = ConnectorCounters()
        self.telemetry = EngineTelemetry()

    async def start(self) -> None:
        if self.config.s3 is not None:
            await asyncio.to_thread(self._fetch, self.config.s3)
        if not (self.config.model_path / "config.json").is_file():
            raise EngineNotReady(
                f"model {self.config.served_name}: {self.config.model_path} holds no HF model "
                "(config.json) on this node — is the volume mounted here?"
            )
        if self.config.cache_root is not None:
            # vLLM reads its cache location from the environment only.
            os.environ.setdefault("VLLM_CACHE_ROOT", str(self.config.cache_root))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args(self.config, self._kv_events_port))
        connector = None
        if self.config.kv_connector is not None:
            set_side_channel(*(self._side_channel or ("127.0.0.1", 5600)))
            if not self.config.settings.on_gpu:
                bind_cpu_compute()
            connector = self._connector
        loggers = [stat_logger(self.telemetry, connector)]  # vLLM's stats, ours only
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        self._tokenizer = self._llm.get_tokenizer()
        self._prompts = HFPromptTokenizer(self._tokenizer)
        self.vocab_size = len(self._tokenizer)

    def _fetch(self, source: S3Source) -> None:
        """Download the weights into this node's cache unless they are there (blocking:
        run on a thread)."""
        location = S3Location.parse(source.url, source.endpoint_url, source.region)

        def report(p: FetchProgress) -> None:
            share = 100.0 * p.done / p.total if p.total else 100.0
            log.info("model %s: %s %.0f%% (%d of %d bytes)",
                     self.config.served_name, p.source, share, p.done, p.total)  # fmt: skip

        try:
            fetched = fetch_model(location, self.config.model_path, progress=report)
        except S3SourceError as exc:
            raise EngineNotReady(f"model {self.config.served_name}: {exc}") from exc
        log.info("model %s: %s %s", self.config.served_name, location.url,
                 "downloaded" if fetched else "already on this node")  # fmt: skip

    @property
    def hf_tokenizer(self) -> Any:
        return self._tokenizer

    def _require(self) -> Any:
        if self._llm is None:
            raise EngineNotReady(f"engine for {self.config.served_name} is not started")
        return self._llm

    def check_health(self) -> None:
        llm = self._require()
        if llm.errored:
            raise EngineDead(f"the vLLM engine of {self.config.served_name} is dead")

    def tokenize(self, text: str) -> list[int]:
        self._require()
        return self._prompts.tokenize(text)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        self._require()
        return self._prompts.apply_chat_template(messages, tools)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        from vllm.inputs import TokensPrompt

        self.check_health()
        llm = self._require()
        if self._in_flight >= self.config.max_num_seqs + self.config.max_waiting:
            raise EngineOverloaded(f"{self._in_flight} requests in flight")
        kv_transfer = None
        if request.handoff is not None:
            self._require_connector()
            kv_transfer = request.handoff.params
        params = sampling_params(request.sampling, request.max_tokens, kv_transfer)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        lora, load_s = None, None
        if request.adapter is not None:
            lora, load_s = await self._adapter(request.adapter)
        self._in_flight += 1
        finished = False
        charged = Charge()
        try:
            first = True
            async for out in llm.generate(
                prompt, params, request.request_id, lora_request=lora, priority=request.priority
            ):
                charged.read(out.kv_transfer_params)
                completion = out.outputs[0]
                finish = finish_reason(completion.finish_reason) if out.finished else None
                matched = completion.stop_reason if finish == "stop" else None
                delta = GenerationDelta(
                    text=completion.text,
                    num_new_tokens=len(completion.token_ids),
                    finish_reason=finish,
                    stop_sequence=matched if isinstance(matched, str) else None,
                    prompt_tokens=len(request.prompt_token_ids) if first else 0,
                    cached_prompt_tokens=(out.num_cached_tokens or 0) if first else 0,
                    logprobs=token_logprobs(
                        completion.token_ids, completion.logprobs, request.sampling.logprobs
                    ),
                    adapter_load_s=load_s if first else None,
                    times=request_times(out.metrics) if out.finished else None,
                )
                first = False
                if delta.text or delta.num_new_tokens or finish is not None:
                    yield replace(delta, gpu_seconds=charged.take())
                if out.finished:
                    finished = True
        except (asyncio.CancelledError, GeneratorExit):
            # AsyncLLM.generate has already aborted the request in the engine.
            self._aborted += 1
            raise
        except Exception as exc:
            if llm.errored:  # the engine process died under this request
                raise EngineDead(f"the vLLM engine of {self.config.served_name} died") from exc
            raise
        finally:
            self._in_flight -= 1
            if finished:
                self._finished += 1

    async def prefill(self, request: GenerationRequest) -> KvHandoff:
        """One-token generation that keeps the prompt's KV for a remote decode engine;
        the connector's answer says where the blocks are (``kv_transfer_params``)."""
        self._require_connector()
        one = replace(request, max_tokens=1, handoff=None)
        params = sampling_params(one.sampling, 1, dict(PREFILL_PARAMS))
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        lora = None
        if request.adapter is not None:
            lora, _ = await self._adapter(request.adapter)
        llm = self._require()
        found: dict[str, Any] | None = None
        cached = 0
        charged = Charge()
        self._in_flight += 1
        try:
            first = True
            async for out in llm.generate(
                prompt, params, request.request_id, lora_request=lora, priority=request.priority
            ):
                if first:
                    cached = out.num_cached_tokens or 0
                    first = False
                params_out = charged.read(out.kv_transfer_params)
                if params_out:
                    found = dict(params_out)
        except (asyncio.CancelledError, GeneratorExit):
            self._aborted += 1
            raise
        finally:
            self._in_flight -= 1
        if found is None:
            raise EngineDead(f"the prefill engine of {self.config.served_name} returned no KV")
        self._prefills += 1
        return KvHandoff(found, len(request.prompt_token_ids), cached, charged.take())

    def _require_connector(self) -> None:
        if self.config.kv_connector is None:
            raise InvalidRequest(
                f"model {self.config.served_name} has no KV connector (disaggregation)"
            )

    async def _adapter(self, adapter: Adapter) -> tuple[Any, float | None]:
        """vLLM's ``LoRARequest`` of ``adapter``, loaded into the engine first when it
        does not hold it (``app.engine.lora``), and the seconds that load took."""
        from vllm.lora.request import LoRARequest

        if self.config.lora is None:
            raise InvalidRequest(
                f"model {self.config.served_name} serves no LoRA adapters (no lora: block)",
                "model",
            )
        llm = self._require()
        lora_id = self._adapters.id_for(adapter.name, adapter.path)
        lora = LoRARequest(f"{adapter.name}@{lora_id}", lora_id, adapter.path)

        async def held() -> list[int]:
            return list(await llm.list_loras())

        async def load() -> None:
            try:
                await llm.add_lora(lora)
            except Exception as exc:
                raise InvalidRequest(
                    f"adapter {adapter.name} could not be loaded: {exc}", "model"
                ) from exc

        loaded = await self._adapters.ensure(adapter.name, adapter.path, held, load, time.monotonic)
        return lora, loaded

    async def abort(self, request_id: str) -> None:
        await self._require().abort(request_id)
        self._aborted += 1

    async def embed(self, inputs: Sequence[str]) -> tuple[list[list[float]], int]:
        from vllm.inputs import TokensPrompt
        from vllm.pooling_params import PoolingParams

        llm = self._require()

        async def one(text: str) -> tuple[list[float], int]:
            ids = self._prompts.embedding_input(text)
            result: Any = None
            rid = f"emb-{uuid.uuid4().hex}"
            params = PoolingParams(task="embed")
            async for out in llm.encode(TokensPrompt(prompt_token_ids=ids), params, rid):
                result = out
            data = result.outputs.data
            return [float(x) for x in data.tolist()], len(ids)

        results = await asyncio.gather(*(one(t) for t in inputs))
        return [v for v, _ in results], sum(n for _, n in results)

    def stats(self) -> EngineStats:
        # Requests in the engine, split by the scheduler's last report (which an abort
        # with nothing else running does not refresh: the count here is exact).
        unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        t = self.telemetry
        waiting = min(t.waiting, unfinished)
        return EngineStats(
            running=unfinished - waiting,
            waiting=waiting,
            kv_cache_usage=t.kv_cache_usage if unfinished else 0.0,
            prefix_queried_tokens_total=t.prefix_queried_tokens_total,
            prefix_hit_tokens_total=t.prefix_hit_tokens_total,
            preemptions_total=t.preemptions_total,
            steps_total=t.steps_total,
            busy_seconds_total=t.busy_seconds_total,
            spec_drafts_total=t.spec_drafts_total,
            spec_draft_tokens_total=t.spec_draft_tokens_total,
            spec_accepted_tokens_total=t.spec_accepted_tokens_total,
            aborted_total=self._aborted,
            finished_total=self._finished,
            extra={
                "in_flight": float(self._in_flight),
                "adapter_loads_total": float(self._adapters.loads_total),
                "adapter_load_seconds_total": self._adapters.load_seconds_total,
                **(
                    {"prefills_total": float(self._prefills), **self._connector.as_extra()}
                    if self.supports_handoff
                    else {}
                ),
            },
            adapters=self._adapters.held,
        )

    def knobs(self) -> dict[str, Any]:
        c = self._require().vllm_config  # the front end's copy, KV blocks reported back
        sched, cache = c.scheduler_config, c.cache_config
        return {
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_chunked_prefill": sched.enable_chunked_prefill,
            "long_prefill_token_threshold": sched.long_prefill_token_threshold,
            "enable_prefix_caching": cache.enable_prefix_caching,
            "max_model_len": c.model_config.max_model_len,
            "block_size": cache.block_size,
            "kv_blocks": cache.num_gpu_blocks,
            "dtype": str(c.model_config.dtype).removeprefix("torch."),
            "quantization": c.model_config.quantization,  # e.g. compressed-tensors
        }

    async def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine-core process (synchronous, safe to call twice)."""
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
