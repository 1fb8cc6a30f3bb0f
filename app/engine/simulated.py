# SIMULATED engine: no weights, no model, a timing model of a vLLM engine.
#
# Timing rule. One scheduler task runs engine steps back to back while work exists:
#   1. Admission, FIFO, at the start of a step: the head of the waiting queue joins the
#      running batch if the batch has fewer than ``max_batch_size`` requests and
#      ceil((prompt_tokens + max_tokens) / block_size) KV blocks are free (the full
#      reservation is made at admission). If the head does not fit, nobody behind it
#      is admitted (no overtaking). ``max_tokens`` is first capped at
#      ``max_model_len - prompt_tokens``. With ``max_prefill_tokens_per_step`` set, a
#      step also stops admitting once the next prompt would take its admitted prompts
#      past that many tokens (a pulled prompt counts one; the first prompt of a step is
#      always admitted): vLLM's per-step token budget, coarsely — a prompt is never
#      split across steps.
#   2. Prefix cache: an admitted request's cached tokens are the longest chain of full
#      prompt blocks found in the per-engine LRU cache (see simulated_cache.py); its
#      full prompt blocks are inserted after the step that prefilled it, owned by the
#      request's cache_salt. ``eviction`` other than "lru" swaps the cache's LRU victim
#      choice for a policy of simulated_eviction.py (experiments; vLLM's is fixed LRU).
#   3. Step time = decode_base_s + decode_s_per_seq * batch
#                  + (prefill_base_s + prefill_s_per_token * uncached_prompt_tokens
#                     of the requests admitted in this step, if any were admitted),
#      where batch counts every running request, the newly admitted included.
#   4. At the end of the step every request still in the batch gets exactly one token
#      (an admitted request's first token comes from its prefill step). A request
#      finishes with "length" at its max_tokens, with "stop" at a stop string (cut
#      from the text) or at a simulated EOS (probability ``eos_probability`` per
#      token unless ``ignore_eos``); its KV blocks are freed at once.
# Beyond ``max_waiting`` queued requests ``generate`` raises EngineOverloaded.
#
# Profile parameters: max_model_len, vocab_size, prefill_s_per_token (per UNCACHED
# prompt token), prefill_base_s (per step that admits), decode_base_s,
# decode_s_per_seq, block_size (tokens), kv_capacity_tokens, prefix_cache_blocks,
# max_waiting, max_batch_size, max_prefill_tokens_per_step, embedding_dim,
# eos_probability, name, eviction, eviction_weights, eviction_paid_salts (see
# simulated_eviction.py); LoRA adapters (max_loras, max_cpu_loras, adapter_load_s): see
# simulated_lora.py. A request's adapter name salts its prefix blocks (KV of different
# adapters is not shared).
# Speculative decoding (spec_tokens, spec_acceptance, spec_s_per_token): see
# simulated_spec.py; a step's verification cost adds to its time.
# Prefill/decode hand-off (kv_connector, kv_bytes_per_token, transfer_bytes_per_s,
# transfer_base_s): see simulated_transfer.py.
#
# Text: token ids are BLAKE2b(prompt, seed | request id, position) mod vocab_size,
# shown as words of a fixed list; temperature 0 makes the output a function of the
# prompt only (seed ignored as in vLLM). Tokenizer, words, stop strings and embeddings:
# see simulated_text.py.
"""``SimulatedEngine``: the Engine protocol without weights, for tests and routing
experiments. Everything it reports is labelled as a simulation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from app.engine.gpu_time import GpuTimeBook, Work
from app.engine.kv_events import KvEvent
from app.engine.protocol import (
    EngineDead,
    EngineError,
    EngineNotReady,
    EngineOverloaded,
    EngineStats,
    FinishReason,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    KvHandoff,
    RequestTimes,
)
from app.engine.simulated_cache import PrefixCache, block_hashes
from app.engine.simulated_eviction import EvictionName, EvictionWeights, make_policy
from app.engine.simulated_lora import SimulatedLoras
from app.engine.simulated_spec import SimulatedDrafts
from app.engine.simulated_text import (
    GeneratedText,
    draw_token,
    embedding,
    stream_key,
)
from app.engine.simulated_transfer import TransferCounters, TransferModel
from app.engine.telemetry import EngineTelemetry
from app.engine.tokenizer import SimulatedPromptTokenizer
from app.schema import StrictFrozen

# Calibrated against SmolLM2-135M-Instruct on the vLLM CPU engine, 2 cores, enforce_eager,
# kv_cache_memory_bytes 1 GiB (least-squares fit of TTFT vs prompt length and ITL vs
# batch size). calibration: see docs/benchmarks/simulated-engine-calibration.md
# vLLM's CPU platform uses 128-token KV blocks (GPU builds default to 16).
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_VOCAB_SIZE = 49152
DEFAULT_PREFILL_S_PER_TOKEN = 0.0015
DEFAULT_PREFILL_BASE_S = 0.0
DEFAULT_DECODE_BASE_S = 0.0302
DEFAULT_DECODE_S_PER_SEQ = 0.0015
DEFAULT_BLOCK_SIZE = 128
DEFAULT_KV_CAPACITY_TOKENS = 46592
DEFAULT_PREFIX_CACHE_BLOCKS = DEFAULT_KV_CAPACITY_TOKENS // DEFAULT_BLOCK_SIZE
DEFAULT_MAX_WAITING = 256
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_EMBEDDING_DIM = 384
# Hand-off, calibrated on a NIXL pair of the same engine (docs/benchmarks/pd-cpu-2026-12-03.md):
# SmolLM2-135M's KV per token in float32, 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 4
# bytes (the connector's own byte count agrees); 8.5 GB/s fitted on its transfer times;
# the fixed part is what the decode leg's first token took beyond one decode step and
# the bytes (64-77 ms: the pull is asynchronous and lands a step later).
DEFAULT_KV_BYTES_PER_TOKEN = 46080
DEFAULT_TRANSFER_BYTES_PER_S = 8.5e9
DEFAULT_TRANSFER_BASE_S = 0.065

_log = logging.getLogger(__name__)
# Most oversleep (event-loop lateness) one step may make up for in real-time runs.
_MAX_CATCH_UP_S = 0.010

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class KvPublisher(Protocol):
    """Takes the prefix cache's KV events (``ZmqKvPublisher``, or a test's list)."""

    def publish(self, events: list[KvEvent]) -> None: ...


class SimulationProfile(StrictFrozen):
    """Timing and capacity model of a simulated engine (see the module comment)."""

    name: str = Field(default="smollm2-135m-cpu2", description="Reported as simulated/<name>.")
    max_model_len: int = Field(default=DEFAULT_MAX_MODEL_LEN, ge=2)
    vocab_size: int = Field(default=DEFAULT_VOCAB_SIZE, ge=2)
    prefill_s_per_token: float = Field(default=DEFAULT_PREFILL_S_PER_TOKEN, ge=0)
    prefill_base_s: float = Field(default=DEFAULT_PREFILL_BASE_S, ge=0)
    decode_base_s: float = Field(default=DEFAULT_DECODE_BASE_S, ge=0)
    decode_s_per_seq: float = Field(default=DEFAULT_DECODE_S_PER_SEQ, ge=0)
    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, ge=1)
    kv_capacity_tokens: int = Field(default=DEFAULT_KV_CAPACITY_TOKENS, ge=1)
    prefix_cache_blocks: int = Field(default=DEFAULT_PREFIX_CACHE_BLOCKS, ge=0)
    max_waiting: int = Field(default=DEFAULT_MAX_WAITING, ge=1)
    max_batch_size: int = Field(default=DEFAULT_MAX_BATCH_SIZE, ge=1)
    max_prefill_tokens_per_step: int | None = Field(
        default=None, ge=1, description="Prompt tokens one step admits; None: no limit."
    )
    embedding_dim: int = Field(default=DEFAULT_EMBEDDING_DIM, ge=1)
    eos_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    max_loras: int = Field(default=0, ge=0, description="Adapters one batch mixes; 0: no LoRA.")
    max_cpu_loras: int = Field(default=8, ge=1, description="Adapters held, LRU beyond.")
    adapter_load_s: float = Field(default=0.02, ge=0, description="One cold adapter load.")
    kv_connector: bool = Field(
        default=False, description="Prefill/decode hand-off on (see simulated_transfer.py)."
    )
    spec_tokens: int = Field(
        default=0, ge=0, description="Speculative tokens per draft; 0: off (simulated_spec.py)."
    )
    spec_acceptance: float = Field(default=0.7, ge=0.0, le=1.0)
    spec_s_per_token: float = Field(default=0.0, ge=0.0, description="Verifying one draft token.")
    kv_bytes_per_token: int = Field(default=DEFAULT_KV_BYTES_PER_TOKEN, ge=1)
    transfer_bytes_per_s: float = Field(default=DEFAULT_TRANSFER_BYTES_PER_S, gt=0)
    transfer_base_s: float = Field(default=DEFAULT_TRANSFER_BASE_S, ge=0)
    eviction: EvictionName = Field(
        default="lru", description="Prefix-cache victim choice (simulated_eviction.py)."
    )
    eviction_weights: EvictionWeights = Field(
        default_factory=EvictionWeights, description="Of the weighted eviction score."
    )
    eviction_paid_salts: frozenset[str] = Field(
        default=frozenset(), description="Cache salts of paid tenants (paid_first, weighted)."
    )

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @model_validator(mode="after")
    def _one_max_len_request_fits(self) -> SimulationProfile:
        if self.kv_capacity_blocks < math.ceil(self.max_model_len / self.block_size):
            raise ValueError(
                "kv_capacity_tokens must hold one max_model_len request "
                f"({self.kv_capacity_tokens} < {self.max_model_len} rounded to blocks)"
            )
        return self


class VirtualClock:
    """A test clock: ``sleep(d)`` first yields ``settle_iterations`` times to the event
    loop (so consumers see the current time), then advances ``now`` by ``d``. Exact when
    the engine's scheduler is the only sleeper."""

    def __init__(self, start: float = 0.0, settle_iterations: int = 20) -> None:
        self.now = start
        self.settle_iterations = settle_iterations

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        for _ in range(self.settle_iterations):
            await asyncio.sleep(0)
        self.now += max(0.0, seconds)


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    max_new_tokens: int
    blocks: int
    prompt_hashes: list[bytes]
    stream_key: bytes
    text: GeneratedText
    outbox: asyncio.Queue[GenerationDelta | BaseException] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    prefilled: bool = False
    num_generated: int = 0
    unsent_tokens: int = 0
    adapter_load_s: float | None = None  # a cold load at admission, until first sent
    remote_kv: bool = False  # its prompt's KV was pulled from a prefill engine
    pulled_tokens: int = 0  # prompt tokens whose KV was pulled (not computed here)
    arrived: float = 0.0  # engine clock: queued, scheduled, first token (telemetry)
    scheduled: float = 0.0
    first_token: float | None = None
    gpu_taken: float = 0.0  # engine seconds already sent on its deltas (gpu_time)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)


class SimulatedEngine:
    """A SIMULATED engine implementing ``app.engine.protocol.Engine`` (no weights)."""

    def __init__(
        self,
        profile: SimulationProfile,
        *,
        task: Literal["generate", "embed"] = "generate",
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        kv_publisher: KvPublisher | None = None,
    ) -> None:
        """``kv_publisher``: where the prefix cache reports the blocks it stores and
        evicts (vLLM's KV-event format; ``app.engine.kv_events``)."""
        self.profile = profile
        self.kv_publisher = kv_publisher
        self._tokenizer = SimulatedPromptTokenizer(profile.vocab_size)
        self.model_name = f"simulated/{profile.name}"
        self.max_model_len = profile.max_model_len
        self.vocab_size = profile.vocab_size
        self.supports_generate = task == "generate"
        self.supports_embed = task == "embed"
        self.supports_constraints = False  # no weights: no logprobs, no grammar
        self.supports_handoff = profile.kv_connector
        self._clock: Clock = clock or time.monotonic
        self._sleep: Sleep = sleep or asyncio.sleep
        self._cache = PrefixCache(
            profile.prefix_cache_blocks,
            on_events=kv_publisher.publish if kv_publisher is not None else None,
            policy=make_policy(
                profile.eviction,
                weights=profile.eviction_weights,
                paid=profile.eviction_paid_salts,
                block_size=profile.block_size,
                recompute_s=lambda n: profile.prefill_base_s + profile.prefill_s_per_token * n,
            ),
            clock=self._clock,
        )
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_blocks = profile.kv_capacity_blocks
        self._drafts = SimulatedDrafts(profile.spec_tokens, profile.spec_acceptance)
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._planned_end: float | None = None
        self._aborted_total = 0
        self._finished_total = 0
        self._steps = 0
        self._busy_s = 0.0
        self._gpu = GpuTimeBook()  # each step's time split across its requests (gpu_time)
        self.telemetry = EngineTelemetry()
        self._hit_tokens = 0
        self._queried_tokens = 0
        self._loras = SimulatedLoras(
            profile.max_loras, profile.max_cpu_loras, profile.adapter_load_s
        )
        self._transfer = TransferModel(
            profile.kv_bytes_per_token, profile.transfer_bytes_per_s, profile.transfer_base_s
        )
        self._received = TransferCounters()
        self._prefills_total = 0

    def __repr__(self) -> str:
        return f"SimulatedEngine(model={self.model_name!r})"

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(
                self._scheduler_loop(), name=f"{self.model_name}-scheduler"
            )

    async def shutdown(self) -> None:
        close = getattr(self.kv_publisher, "close", None)
        if callable(close):
            close()
        task, self._loop_task = self._loop_task, None
        for seq in [*self._running, *self._waiting]:
            self._abort_sequence(seq)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def check_health(self) -> None:
        """Dead once its scheduler loop stopped (``shutdown``, or ``kill`` in tests)."""
        task = self._loop_task
        if task is None or task.done() or task.cancelling():
            raise EngineDead(f"{self.model_name}: the scheduler loop is not running")

    def kill(self) -> None:
        """Stop the scheduler loop as a crash would (for exit-path tests): every
        sequence in flight fails with ``EngineDead``."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        for seq in [*self._running, *self._waiting]:
            self._release(seq)
            seq.outbox.put_nowait(EngineDead(f"{self.model_name} died"))

    @property
    def hf_tokenizer(self) -> Any:
        return None  # no Hugging Face tokenizer: tool_choice "auto" is not parsed here

    # ---------------------------------------------------------------- tokenizer
    def tokenize(self, text: str) -> list[int]:
        """Simulated tokenizer: special tags, words and punctuation, each a token."""
        return self._tokenizer.tokenize(text)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return self._tokenizer.apply_chat_template(messages, tools)

    # ---------------------------------------------------------------- generate
    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationDelta, None]:
        self.check_health()
        if request.handoff is not None:
            await self._pull(request)
        seq = self._enqueue(request)
        try:
            while True:
                item = await seq.outbox.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            # Consumer cancelled or stopped iterating: abort (no-op once finished).
            if self._by_id.get(request.request_id) is seq:
                self._abort_sequence(seq)

    async def prefill(self, request: GenerationRequest) -> KvHandoff:
        """Prefill on this engine for a decode engine (simulated_transfer.py)."""
        self._require_connector()
        one = replace(request, max_tokens=1, handoff=None)
        cached, gpu_s = 0, 0.0
        async for delta in self.generate(one):
            cached = delta.cached_prompt_tokens or cached
            gpu_s += delta.gpu_seconds or 0.0
        self._prefills_total += 1
        n = len(request.prompt_token_ids)
        params = {"engine": self.model_name, "id": request.request_id}
        return KvHandoff(params, n, cached, gpu_s)

    async def _pull(self, request: GenerationRequest) -> None:
        """Wait for the prompt's KV the local cache lacks, as pulled from the prefill
        engine (simulated_transfer.py)."""
        self._require_connector()
        hashes = block_hashes(request.prompt_token_ids, self.profile.block_size, _salt(request))
        lookable = (len(request.prompt_token_ids) - 1) // self.profile.block_size
        held = self._cache.lookup(hashes[:lookable]) * self.profile.block_size
        tokens = max(0, len(request.prompt_token_ids) - held)
        seconds = self._transfer.seconds(tokens)
        await self._sleep(seconds)
        self._received.add(tokens, tokens * self.profile.kv_bytes_per_token, seconds)

    def _require_connector(self) -> None:
        if not self.supports_handoff:
            raise InvalidRequest(f"{self.model_name} has no KV connector (kv_connector off)")

    async def abort(self, request_id: str) -> None:
        seq = self._by_id.get(request_id)
        if seq is not None:
            self._abort_sequence(seq)

    def _enqueue(self, request: GenerationRequest) -> _Sequence:
        profile = self.profile
        if not self.supports_generate:
            raise EngineError(f"{self.model_name} was built for embeddings only")
        if self._loop_task is None:
            raise EngineNotReady(f"{self.model_name} is not started")
        prompt_len = len(request.prompt_token_ids)
        if prompt_len == 0:
            raise InvalidRequest("the prompt must contain at least one token")
        if prompt_len >= profile.max_model_len:
            raise InvalidRequest(
                f"prompt of {prompt_len} tokens does not fit max_model_len "
                f"{profile.max_model_len} of {self.model_name}"
            )
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1")
        if request.request_id in self._by_id:
            raise InvalidRequest(f"request id {request.request_id!r} is already in flight")
        if request.adapter is not None and not self._loras.enabled:
            raise InvalidRequest(f"{self.model_name} serves no LoRA adapters (max_loras 0)")
        if len(self._waiting) >= profile.max_waiting:
            raise EngineOverloaded(
                f"{self.model_name}: {len(self._waiting)} requests waiting "
                f"(max_waiting={profile.max_waiting})"
            )
        max_new = min(request.max_tokens, profile.max_model_len - prompt_len)
        seq = _Sequence(
            request=request,
            max_new_tokens=max_new,
            blocks=math.ceil((prompt_len + max_new) / profile.block_size),
            prompt_hashes=block_hashes(
                request.prompt_token_ids, profile.block_size, _salt(request)
            ),
            stream_key=stream_key(request),
            text=GeneratedText(request.sampling.stop),
            remote_kv=request.handoff is not None,
            arrived=self._clock(),
        )
        self._waiting.append(seq)
        self._by_id[request.request_id] = seq
        self._wakeup.set()
        return seq

    # ---------------------------------------------------------------- scheduler
    async def _scheduler_loop(self) -> None:
        try:
            while True:
                if not self._running and not self._waiting:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    self._planned_end = None
                    continue
                await self._step()
        except asyncio.CancelledError:
            raise
        # A bug must fail every request rather than hang them.
        except Exception as exc:
            _log.exception("%s scheduler failed", self.model_name)
            error = EngineError(f"{self.model_name} scheduler failed: {exc!r}")
            for seq in [*self._running, *self._waiting]:
                seq.outbox.put_nowait(error)
                self._release(seq)
            self._loop_task = None

    async def _step(self) -> None:
        profile = self.profile
        now = self._clock()
        started = now
        if self._planned_end is not None:
            # Back-to-back steps: absorb the previous step's oversleep (bounded), so
            # real-time runs keep the modelled rate.
            started = max(min(now, self._planned_end), now - _MAX_CATCH_UP_S)
        admitted = self._admit()
        for seq in admitted:
            seq.scheduled = started
        batch = list(self._running)
        drafts = {  # request id -> draft tokens, for the sequences past their prefill
            s.request.request_id: self._drafts.drafted(s.max_new_tokens - s.num_generated)
            for s in batch
            if s.prefilled and self._drafts.enabled
        }
        duration = profile.decode_base_s + profile.decode_s_per_seq * len(batch)
        duration += profile.spec_s_per_token * sum(drafts.values())
        if admitted:
            uncached = sum(
                seq.prompt_len - seq.cached_tokens - seq.pulled_tokens for seq in admitted
            )
            duration += profile.prefill_base_s + profile.prefill_s_per_token * uncached
            duration += sum(seq.adapter_load_s or 0.0 for seq in admitted)
        self._planned_end = started + duration
        await self._sleep(max(0.0, self._planned_end - self._clock()))
        self._steps += 1
        self._busy_s += duration
        self.telemetry.busy(duration)
        computed = sum(s.prompt_len - s.cached_tokens - s.pulled_tokens for s in admitted)
        work = {
            s.request.request_id: Work(
                s.prompt_len - s.cached_tokens - s.pulled_tokens if s in admitted else 0,
                1 + drafts.get(s.request.request_id, 0),
            )
            for s in batch
            if self._by_id.get(s.request.request_id) is s
        }
        self._gpu.step(duration, work, profile.prefill_s_per_token, profile.decode_s_per_seq)
        for seq in batch:
            if self._by_id.get(seq.request.request_id) is not seq:
                continue  # aborted during the step
            if not seq.prefilled:
                seq.prefilled = True
                self._cache.insert(
                    seq.prompt_hashes,
                    seq.request.prompt_token_ids,
                    profile.block_size,
                    _salt(seq.request),
                    owner=seq.request.cache_salt,
                )
            drafted = drafts.get(seq.request.request_id, 0)
            if drafted:
                kept = self._drafts.accepted(seq.stream_key, seq.num_generated, drafted)
                self.telemetry.speculated(1, drafted, kept)
                self._advance(seq, 1 + kept)
            else:
                self._advance(seq)
        self._report(tokens=computed + len(batch) + sum(drafts.values()))

    def _admit(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        skipped: list[_Sequence] = []  # their adapter would be one too many in the batch
        budget, spent = self.profile.max_prefill_tokens_per_step, 0
        while self._waiting and len(self._running) < self.profile.max_batch_size:
            head = self._waiting[0]
            if head.blocks > self._free_blocks:
                break
            cost = 1 if head.remote_kv else head.prompt_len
            if budget is not None and admitted and spent + cost > budget:
                break
            self._waiting.popleft()
            adapter = head.request.adapter
            if adapter is not None:
                running = {s.request.adapter.name for s in self._running if s.request.adapter}
                if not self._loras.fits(adapter.name, running):
                    skipped.append(head)
                    continue
                head.adapter_load_s = self._loras.acquire(adapter.name, running)
            self._free_blocks -= head.blocks
            # At least the last prompt token is computed (as vLLM does).
            lookable = (head.prompt_len - 1) // self.profile.block_size
            hit_blocks = self._cache.lookup(head.prompt_hashes[:lookable])
            head.cached_tokens = hit_blocks * self.profile.block_size
            self._hit_tokens += head.cached_tokens
            if head.remote_kv:  # pulled: only the last prompt token is computed here
                head.pulled_tokens = max(0, head.prompt_len - 1 - head.cached_tokens)
            self._queried_tokens += head.prompt_len
            self.telemetry.prefix_lookup(head.prompt_len, head.cached_tokens)
            self._running.append(head)
            admitted.append(head)
            spent += cost
        self._waiting.extendleft(reversed(skipped))
        return admitted

    def _advance(self, seq: _Sequence, tokens: int = 1) -> None:
        """Give ``seq`` its next ``tokens`` tokens (fewer at a finish) and send what
        became visible."""
        finish: FinishReason | None = None
        for _ in range(tokens):
            token_id, eos_draw = draw_token(
                seq.stream_key, seq.num_generated, self.profile.vocab_size
            )
            seq.num_generated += 1
            seq.unsent_tokens += 1
            eos = not seq.request.sampling.ignore_eos and eos_draw < self.profile.eos_probability
            if eos or seq.text.append(token_id):  # a simulated EOS adds no word
                finish = "stop"
            elif seq.num_generated >= seq.max_new_tokens:
                finish = "length"
            if finish is not None:
                break
        now = self._clock()
        if seq.first_token is None:
            seq.first_token = now
        times = None
        if finish is not None:
            first = seq.first_token if seq.first_token is not None else now
            times = RequestTimes(seq.scheduled - seq.arrived, first - seq.scheduled, now - first)
        chunk = seq.text.take(final=finish is not None)
        if chunk is not None:
            seq.outbox.put_nowait(self._delta(seq, chunk, finish, times))
            seq.unsent_tokens = 0
        if times is not None:
            self._finished_total += 1
            self.telemetry.finished(times.queued_s, times.prefill_s, times.decode_s)
            self._release(seq)

    def _delta(
        self,
        seq: _Sequence,
        text: str,
        finish: FinishReason | None,
        times: RequestTimes | None = None,
    ) -> GenerationDelta:
        load_s, seq.adapter_load_s = seq.adapter_load_s, None
        rid = seq.request.request_id
        charged = self._gpu.close(rid) if finish is not None else self._gpu.charged(rid)
        gpu_s, seq.gpu_taken = charged - seq.gpu_taken, charged
        return GenerationDelta(
            text=text,
            num_new_tokens=seq.unsent_tokens,
            finish_reason=finish,
            stop_sequence=seq.text.matched if finish == "stop" else None,
            prompt_tokens=seq.prompt_len,
            cached_prompt_tokens=seq.cached_tokens,
            adapter_load_s=load_s,
            times=times,
            gpu_seconds=gpu_s,
        )

    def _abort_sequence(self, seq: _Sequence) -> None:
        if self._by_id.get(seq.request.request_id) is not seq:
            return
        self._aborted_total += 1
        self._release(seq)
        seq.outbox.put_nowait(self._delta(seq, "", "abort"))

    def _release(self, seq: _Sequence) -> None:
        """Drop ``seq`` from the queues and free its KV reservation."""
        if self._by_id.get(seq.request.request_id) is seq:
            del self._by_id[seq.request.request_id]
        if seq in self._running:
            self._running.remove(seq)
            self._free_blocks += seq.blocks
        elif seq in self._waiting:
            self._waiting.remove(seq)
        self._wakeup.set()  # freed capacity may admit a waiting request

    # ---------------------------------------------------------------- embed, stats
    async def embed(self, inputs: Sequence[str]) -> tuple[list[list[float]], int]:
        """Simulated embeddings: the normalised sum of per-token pseudo-random
        vectors, so texts sharing words point in similar directions."""
        if not self.supports_embed:
            raise EngineError(f"{self.model_name} was built for generation only")
        if self._loop_task is None:
            raise EngineNotReady(f"{self.model_name} is not started")
        vectors: list[list[float]] = []
        total_tokens = 0
        for text in inputs:
            token_ids = self.tokenize(text)
            total_tokens += len(token_ids)
            vectors.append(embedding(token_ids, self.profile.embedding_dim))
        profile = self.profile
        await self._sleep(profile.prefill_base_s + profile.prefill_s_per_token * total_tokens)
        return vectors, total_tokens

    def _report(self, tokens: int) -> None:
        used = self.profile.kv_capacity_blocks - self._free_blocks
        usage = used / self.profile.kv_capacity_blocks
        self.telemetry.step(len(self._running), len(self._waiting), usage, tokens)

    def knobs(self) -> dict[str, Any]:
        p = self.profile
        return {
            "max_num_seqs": p.max_batch_size,
            "max_num_batched_tokens": p.max_prefill_tokens_per_step,
            "enable_chunked_prefill": p.max_prefill_tokens_per_step is not None,
            "long_prefill_token_threshold": 0,
            "enable_prefix_caching": p.prefix_cache_blocks > 0,
            "max_model_len": p.max_model_len,
            "block_size": p.block_size,
            "kv_blocks": p.kv_capacity_blocks,
            "dtype": "simulated",
            "quantization": None,
        }

    def stats(self) -> EngineStats:
        used_blocks = self.profile.kv_capacity_blocks - self._free_blocks
        queried = self._queried_tokens
        t = self.telemetry
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_cache_usage=used_blocks / self.profile.kv_capacity_blocks,
            prefix_queried_tokens_total=t.prefix_queried_tokens_total,
            prefix_hit_tokens_total=t.prefix_hit_tokens_total,
            preemptions_total=t.preemptions_total,
            steps_total=t.steps_total,
            busy_seconds_total=t.busy_seconds_total,
            spec_drafts_total=t.spec_drafts_total,
            spec_draft_tokens_total=t.spec_draft_tokens_total,
            spec_accepted_tokens_total=t.spec_accepted_tokens_total,
            aborted_total=self._aborted_total,
            finished_total=self._finished_total,
            extra={
                "prefix_cache_hit_tokens": float(self._hit_tokens),
                "prefix_cache_queried_tokens": float(queried),
                "prefix_cache_hit_rate": self._hit_tokens / queried if queried else 0.0,
                "prefix_cache_blocks": float(len(self._cache)),
                "prefix_cache_evictions": float(self._cache.evictions),
                "kv_used_tokens": float(used_blocks * self.profile.block_size),
                "kv_capacity_tokens": float(
                    self.profile.kv_capacity_blocks * self.profile.block_size
                ),
                "steps": float(self._steps),
                "busy_s": self._busy_s,
                **(
                    {"prefills_total": float(self._prefills_total), **self._received.as_extra()}
                    if self.supports_handoff
                    else {}
                ),
                **(
                    {
                        "adapter_loads_total": float(self._loras.loads_total),
                        "adapter_load_seconds_total": self._loras.load_seconds_total,
                    }
                    if self._loras.enabled
                    else {}
                ),
            },
            adapters=self._loras.held(),
        )


def _salt(request: GenerationRequest) -> str | None:
    """Prefix-block salt: the tenant's cache salt, and the adapter (as vLLM keys blocks
    by LoRA)."""
    if request.adapter is None:
        return request.cache_salt
    return f"{request.cache_salt or ''}\x00lora:{request.adapter.name}"
