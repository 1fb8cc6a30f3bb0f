"""The one engine protocol every LLMServer replica talks to.

Two implementations exist: ``VLLMEngine`` (the real vLLM engine, CPU build here and
CUDA in production) and ``SimulatedEngine`` (no weights, a timing model for tests of
the upper layers and routing experiments). Upper layers never import either directly;
they receive an ``Engine`` built by ``app.engine.factory.build_engine``.

The protocol is token-level and OpenAI-agnostic: it takes a prompt (text or token ids)
plus sampling parameters, and yields ``GenerationDelta``s, one per engine step that
produced text. OpenAI shapes are built by the API layer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort", "tool_calls"]


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output: any JSON object (``json_object``), or JSON valid
    against ``schema`` (a JSON Schema, serialized) for ``json_schema``."""

    kind: Literal["json_object", "json_schema"]
    schema: str | None = None
    name: str = "response"  # the schema's name, as the client gave it


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling parameters the API accepts, already validated: the one type from the
    parsed body (``InferenceRequest.sampling``) to the engine. The output length is not
    one of them: it is the request's (``GenerationRequest.max_tokens``). Defaults are
    the neutral values (no penalty, no bias, every token allowed)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by id
    logprobs: int | None = None  # None: none; k: the sampled token's and the top k
    structured: StructuredOutput | None = None

    def token_ids(self) -> tuple[int, ...]:
        """Every token id the options name (checked against the vocabulary)."""
        return self.stop_token_ids + tuple(t for t, _ in self.logit_bias)


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as an engine loads it: its unique name (``base:adapter``) and a
    directory on this node holding its PEFT files (``adapter_config.json`` and the
    weights)."""

    name: str
    path: str


@dataclass(frozen=True)
class KvHandoff:
    """What a prefill engine hands a decode engine (prefill/decode disaggregation): the
    KV connector's parameters, opaque above the engine (vLLM's ``kv_transfer_params``:
    where the blocks lie and how to pull them), and the prompt it prefilled."""

    params: dict[str, Any]
    prompt_tokens: int
    cached_prompt_tokens: int = 0  # what the prefill engine found in its own cache
    gpu_seconds: float | None = None  # the prefill engine's time charged to it (gpu_time)
    gpu_cost_usd: float | None = None  # ... priced by the prefill replica


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingOptions
    max_tokens: int  # resolved against the context window by the replica
    # Prefix-cache isolation: prompts share cached KV blocks only with the same salt
    # (vLLM's ``cache_salt``; the gateway derives it from the tenant). None: shared.
    cache_salt: str | None = None
    adapter: Adapter | None = None  # run with this LoRA adapter on the base model
    # Decode leg of a disaggregated request: the prompt's KV comes from the prefill
    # engine named here instead of being computed (or from the cache) on this engine.
    handoff: KvHandoff | None = None
    # vLLM's scheduling priority, lower first: the request's band (interactive 0,
    # standard 1, batch 2). Only an engine run with ``scheduling_policy: priority``
    # orders by it; first come, first served ignores it.
    priority: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, its log-probability, and the ``top`` most likely
    tokens at that step as (text, log-probability), most likely first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of tool call ``index`` (OpenAI's streamed shape): the first piece of a
    call carries its ``id`` and function ``name``, later ones more ``arguments`` text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class RequestTimes:
    """One request's time in the engine: queued (arrival to first scheduled), prefill
    (first scheduled to first token) and decode (first token to last), in seconds."""

    queued_s: float
    prefill_s: float
    decode_s: float


@dataclass(frozen=True)
class EngineLoad:
    """How full one replica's engine was as a request's first token left it (the fair
    queue's engine caps, ``app.fairness.queue``)."""

    running: int
    waiting: int
    kv_cache_usage: float  # fraction of KV-cache blocks in use


@dataclass(frozen=True)
class SpecCounters:
    """A replica engine's speculative-decoding totals as a request's first token left
    it: the draft tokens proposed and the ones accepted since the engine started (the
    acceptance health rule, ``app.routing.acceptance``). ``engine`` names the engine
    instance (a new one after a restart), whose totals these are."""

    engine: str
    draft_tokens: int
    accepted_tokens: int


@dataclass(frozen=True)
class GenerationDelta:
    """Text produced since the previous delta of the same request.

    ``prompt_tokens``/``cached_prompt_tokens`` describe the whole prompt; an engine sets
    them on the first delta at least (repeating them later is allowed). ``logprobs``
    has one entry per new token when the request asked for them."""

    text: str
    num_new_tokens: int
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None  # with finish "stop": the stop string that matched
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCallDelta, ...] = ()
    index: int = 0  # the choice, when a request asked for n > 1
    # First delta of a request with an adapter: the seconds spent loading it into the
    # engine for this request (a cold load), None when the engine held it.
    adapter_load_s: float | None = None
    # The last delta of a request: its time in the engine, when the engine keeps it
    # (a trace's queue, prefill and decode spans).
    times: RequestTimes | None = None
    # Engine seconds charged to the request since its previous delta (app.engine.
    # gpu_time: its share of each step's time); None where the engine keeps none.
    gpu_seconds: float | None = None
    # ... priced at the replica's accelerator-hour (set by the replica).
    gpu_cost_usd: float | None = None
    # First delta from a local replica: its engine's load then (set by the replica).
    load: EngineLoad | None = None
    # ... and, when its engine has drafted, its speculative-decoding totals then.
    spec: SpecCounters | None = None


@dataclass(frozen=True)
class EngineStats:
    """Point-in-time counters of one engine, read by tests, metrics and routers."""

    running: int
    waiting: int
    aborted_total: int
    finished_total: int
    extra: dict[str, float] = field(default_factory=dict)
    # The engine family (app.engine.telemetry), from the engine's own statistics.
    kv_cache_usage: float = 0.0  # fraction of KV-cache blocks in use
    prefix_queried_tokens_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens_total: int = 0  # ... and found there
    preemptions_total: int = 0
    steps_total: int = 0
    busy_seconds_total: float = 0.0  # the engine's own step times (GPU-time attribution)
    spec_drafts_total: int = 0  # speculative decoding (app.engine.telemetry)
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    adapters: tuple[str, ...] = ()  # LoRA adapters the engine holds (as last seen)


@runtime_checkable
class Engine(Protocol):
    """What an LLMServer replica needs from an inference engine."""

    max_model_len: int
    vocab_size: int  # prompt token ids must lie in [0, vocab_size)
    supports_generate: bool
    supports_embed: bool
    # Sampling options that need real weights (structured outputs, logprobs); an
    # engine without them refuses such requests (the simulated engine).
    supports_constraints: bool
    # A KV connector is configured: ``prefill`` works and ``generate`` takes a handoff.
    supports_handoff: bool

    @property
    def hf_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (tool parsers need it), or None."""

    async def start(self) -> None:
        """Load weights / start workers. Called once before any request."""

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added."""

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat conversation (with the tools the model may call) rendered
        with the model's template, ending with the assistant generation prompt."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream deltas until a finish reason. Cancelling the consumer must
        abort the request in the engine (implementations call ``abort``)."""

    async def prefill(self, request: GenerationRequest) -> KvHandoff:
        """Compute the prompt's KV for a decode engine to pull (prefill/decode
        disaggregation) and return how to find it. Cancelling the caller aborts it."""

    async def abort(self, request_id: str) -> None:
        """Stop a running or queued request and free its KV cache."""

    async def embed(self, inputs: Sequence[str]) -> tuple[list[list[float]], int]:
        """Embedding vectors for ``inputs`` and the number of prompt tokens used."""

    def stats(self) -> EngineStats:
        """Current counters."""

    def knobs(self) -> dict[str, Any]:
        """The serving knobs the running engine took, read back from the engine itself
        (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``,
        ``long_prefill_token_threshold``, ``enable_prefix_caching``, ``max_model_len``,
        ``block_size``, ``kv_blocks``, ``dtype``, ``quantization``)."""

    def check_health(self) -> None:
        """Raise ``EngineDead`` when the engine can no longer serve (its worker
        process died, its scheduler stopped). Cheap: called by Ray Serve's health
        check and before every request."""

    async def shutdown(self) -> None:
        """Release the engine's processes and memory."""


class EngineError(Exception):
    """Base class of errors an engine reports to the server."""


class EngineOverloaded(EngineError):
    """The engine's admission queue is full; the caller should retry later."""


class EngineNotReady(EngineError):
    """The engine has not finished starting."""


class EngineDead(EngineNotReady):
    """The engine stopped for good (process killed, OOM, device fault): this replica
    must be replaced; its requests are retryable elsewhere (503 with Retry-After)."""


class ContextLengthExceeded(EngineError):
    """Prompt plus requested output does not fit the model's context window."""


class InvalidRequest(EngineError, ValueError):
    """The request is well-formed JSON but the engine cannot serve it as asked;
    ``param`` names the request field at fault, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type[InvalidRequest], tuple[str, str | None]]:
        return (InvalidRequest, (str(self.args[0]), self.param))  # param survives Ray
