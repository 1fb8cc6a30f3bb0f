"""One request, one outcome: the two types the whole request path shares.

``InferenceRequest`` is built once, by the parse stage of the ingress (after the caller
is known), and is passed as it is through route → admit → dispatch → replica (and an
upstream). Two stages change it, once each, on the same type: route names the LoRA
adapter that answers (``with_adapter``), and admission adds the token ids the gateway
counted, the ``max_tokens`` a budget allows and the band it was granted (``admitted``).
The replica turns it into the engine's ``GenerationRequest`` (token ids, the same
``SamplingOptions`` object, the band as the engine's priority).

``Outcome`` is how the request went, filled in while it runs (``add`` per delta, the
dispatch's pool and attempts, the phases it passed, the final status) and read once
when it ends: the metrics, the ledger record, the decision log line and the trace are
all derived from it.

``ReplicaNote`` is the one thing that travels back up inside the request: the replica
router (on Ray's router thread, in the ingress's process) writes its choice there and
the ingress reads it once the answer's first delta is in — one note per request,
shared by its copies, never a process-wide table; it does not travel to the replica.

``TraceContext`` is the request's W3C trace context (``traceparent``): the caller's, or
a new trace started at the ingress; it travels inside the request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, get_args

from app.engine.protocol import (
    GenerationDelta,
    RequestTimes,
    SamplingOptions,
    TokenLogprob,
    ToolCallDelta,
)
from app.state.records import AdapterRecord, LedgerStatus, Priority

# the API a request came through ("messages": Anthropic's, "responses": OpenAI's
# Responses; the engine request of both is chat)
Endpoint = Literal["chat", "completion", "embeddings", "messages", "responses"]
BANDS: tuple[Priority, ...] = get_args(Priority)  # highest first


@dataclass(frozen=True)
class Caller:
    """Who is calling, after authentication."""

    tenant: str
    team: str | None = None
    user: str | None = None
    key_id: str | None = None
    via: str = "key"  # key | jwt | anonymous


@dataclass(frozen=True)
class Prompt:
    """The canonical prompt: what the client sent — chat ``messages``, a completion's
    ``text`` or ``token_ids``, embedding ``inputs`` — plus, when a local tokenizer
    counted it at the ingress, the ``token_ids`` the engine will see and the model
    whose tokenizer made them (``tokenized_for``)."""

    messages: tuple[dict[str, Any], ...] | None = None  # role, content (+ tool calls)
    tools: tuple[dict[str, Any], ...] | None = None  # the functions the model may call
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    tokenized_for: str | None = None  # None with token_ids: the client's own ids
    inputs: tuple[str, ...] | None = None  # embeddings

    @property
    def client_ids(self) -> bool:
        """The client sent token ids (a completion prompt): valid for any engine."""
        return self.token_ids is not None and self.tokenized_for is None

    def ids_for(self, model: str) -> tuple[int, ...] | None:
        """Token ids an engine serving ``model`` can use as they are, if any."""
        if self.client_ids or (self.tokenized_for is not None and self.tokenized_for == model):
            return self.token_ids
        return None

    def counted(self, model: str, token_ids: tuple[int, ...]) -> Prompt:
        """This prompt with the ids ``model``'s tokenizer made of it (the client's own
        ids stay what they are: valid for every engine)."""
        if self.client_ids:
            return self
        return replace(self, token_ids=token_ids, tokenized_for=model)

    @property
    def view(self) -> str:
        """The prompt as text (routing features, byte limits, estimates)."""
        if self.messages is not None:
            return "\n".join(m.get("content") or "" for m in self.messages)
        if self.inputs is not None:
            return "\n".join(self.inputs)
        return self.text or ""

    def estimate_tokens(self) -> int:
        """A rough length for routing (policy context checks): ~3 bytes a token."""
        if self.client_ids:
            assert self.token_ids is not None
            return len(self.token_ids)
        return len(self.view.encode()) // 3 + 4 * len(self.messages or ())

    def upper_bound_tokens(self) -> int:
        """No byte-level tokenizer makes more tokens than bytes (plus template tokens)."""
        if self.client_ids:
            assert self.token_ids is not None
            return len(self.token_ids)
        return len(self.view.encode()) + 16 * len(self.messages or ()) + 16


@dataclass(frozen=True)
class ToolChoice:
    """How the answer may call the prompt's tools: ``auto`` (the model decides, its
    output parsed by the model's tool parser), ``required`` (one call or more,
    constrained), or ``named`` (that function, constrained to its parameters)."""

    mode: Literal["auto", "required", "named"]
    name: str | None = None  # the function, when named


class ReplicaChoice(Protocol):
    """What the ingress reads of the replica router's choice (the route header, the
    decision log, the metrics); ``app.scheduler.loop.Decision`` is one."""

    @property
    def replica(self) -> str: ...
    @property
    def scorer(self) -> str: ...
    @property
    def matched_blocks(self) -> int: ...
    @property
    def prompt_blocks(self) -> int: ...
    @property
    def load(self) -> float: ...
    @property
    def totals(self) -> dict[str, float]: ...
    @property
    def index_blocks(self) -> int: ...
    @property
    def timings_ns(self) -> dict[str, int]: ...
    def header(self) -> str: ...


class ReplicaNote:
    """Where the replica router leaves its choice for the ingress (module docstring):
    written once per routing on the router's thread (one reference assignment), read on
    the ingress's loop after the first delta; a retried attempt's routing overwrites it.
    Pickled empty: it stays in this process."""

    def __init__(self) -> None:
        self.choice: ReplicaChoice | None = None

    def write(self, choice: ReplicaChoice) -> None:
        self.choice = choice

    def read(self) -> ReplicaChoice | None:
        return self.choice

    def __reduce__(self) -> tuple[type[ReplicaNote], tuple[()]]:
        return (ReplicaNote, ())


@dataclass(frozen=True)
class InferenceRequest:
    """One client request, as every layer sees it (module docstring)."""

    id: str  # the gateway's request id: ledger, logs, response id, engine ids
    endpoint: Endpoint
    model: str  # what the client asked for (an id, an alias)
    prompt: Prompt
    max_tokens: int | None = None  # per choice, asked (or the default); None: the window
    n: int = 1  # choices
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stream: bool = False
    batch: bool = False  # batch work (service_tier "flex" or x-switchyard-class: throughput)
    # the band it asked for (x-switchyard-priority); once admitted, the band it was granted
    priority: Priority | None = None
    include_usage: bool = False
    caller: Caller | None = None
    session_id: str | None = None
    session_slo_ms: float | None = None  # this request's session SLO, when it set one
    client_request_id: str | None = None
    quality_floor: float | None = None
    tool_choice: ToolChoice | None = None  # None: plain text (no tools, or "none")
    user: str | None = None  # the OpenAI `user` field (a session key for replica routing)
    # The LoRA adapter ``model`` names (``base:adapter``), resolved at the ingress; the
    # route decision is the base's.
    adapter: AdapterRecord | None = None
    cache_salt: str | None = None  # from the tenant (``gateway.kv_cache``), never the client
    trace: TraceContext | None = None
    # The replica router's choice, read by the ingress (``ReplicaNote``).
    replica_note: ReplicaNote = field(default_factory=ReplicaNote, compare=False, repr=False)

    # What the router reads (``app.routing.table.Routable``).
    @property
    def tenant(self) -> str | None:
        return self.caller.tenant if self.caller is not None else None

    @property
    def prompt_tokens(self) -> int:
        return self.prompt.estimate_tokens()

    @property
    def prompt_text(self) -> str:
        return self.prompt.view

    def engine_id(self, attempt: int) -> str:
        """The engine's request id of one dispatch attempt, derived from the gateway's."""
        return f"{self.id}-{attempt}"

    def with_adapter(self, adapter: AdapterRecord) -> InferenceRequest:
        """The request as route leaves it when an adapter answers (module docstring)."""
        return replace(self, adapter=adapter)

    def admitted(
        self,
        token_ids: tuple[int, ...] | None,
        counted_by: str | None,
        max_tokens: int | None,
        band: Priority | None = None,
    ) -> InferenceRequest:
        """The request as admission leaves it (module docstring): with the ids
        ``counted_by``'s tokenizer made of its prompt, when the gateway counted them, the
        allowance as ``max_tokens`` and the band it was granted."""
        request = self
        if token_ids is not None and counted_by is not None:
            request = request.with_prompt(request.prompt.counted(counted_by, token_ids))
        if band is not None and band != request.priority:
            request = replace(request, priority=band)
        return request.with_allowance(max_tokens)

    def engine_priority(self) -> int:
        """Its band as the engine's scheduling priority, lower first (``BANDS`` order)."""
        return BANDS.index(self.priority or "standard")

    def with_allowance(self, max_tokens: int | None) -> InferenceRequest:
        return self if max_tokens == self.max_tokens else replace(self, max_tokens=max_tokens)

    def with_prompt(self, prompt: Prompt) -> InferenceRequest:
        return replace(self, prompt=prompt)


_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context: the trace, the caller's span (the parent of this request's
    root span; None when the trace starts here) and whether the trace is sampled."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str | None = None  # 16 lowercase hex digits
    sampled: bool = True

    @staticmethod
    def parse(header: str | None) -> TraceContext | None:
        """``traceparent`` (version 00, or a later version read as 00), or None when it
        is absent or malformed: the request then starts a trace of its own."""
        if header is None:
            return None
        parts = header.strip().split("-")
        if len(parts) < 4 or (parts[0] == "00" and len(parts) != 4):
            return None
        version, trace_id, parent_id, flags = parts[:4]
        if (
            len(version) != 2 or version == "ff" or len(trace_id) != 32
            or len(parent_id) != 16 or len(flags) != 2
            or not set(version + trace_id + parent_id + flags) <= _HEX
            or trace_id == "0" * 32 or parent_id == "0" * 16
        ):  # fmt: skip
            return None
        return TraceContext(trace_id, parent_id, bool(int(flags, 16) & 1))

    @staticmethod
    def new(sampled: bool = True) -> TraceContext:
        import secrets

        return TraceContext(secrets.token_hex(16), None, sampled)

    def traceparent(self, span_id: str) -> str:
        """The header a callee gets, with ``span_id`` as its parent."""
        return f"00-{self.trace_id}-{span_id}-{'01' if self.sampled else '00'}"

    def span_id(self, name: str, request_id: str) -> str:
        """A span id of this trace, derived from its name and the request: the ingress
        can name a span's id before the span is exported (a callee's parent)."""
        import hashlib

        digest = hashlib.blake2b(f"{self.trace_id}/{request_id}/{name}".encode(), digest_size=8)
        return digest.hexdigest() if digest.digest() != bytes(8) else "0" * 15 + "1"


@dataclass(eq=False)
class Choice:
    """One of a request's ``n`` answers, as its deltas arrive."""

    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string that ended it, when one did
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # streamed pieces

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True)
class QueueNote:
    """Its turn at a saturated model (``app.fairness.queue``): its band, how long it
    waited for a slot, its tenant's counter when it started, and why it was shed."""

    band: Priority
    waited_s: float
    counter: float = 0.0
    shed: str | None = None  # over_share | pool_full | queue_timeout
    service: float = 0.0  # weighted tokens charged to its tenant (prompt, then output)

    def header(self) -> str:
        return f"queue={round(self.waited_s * 1000)}ms; band={self.band}; vtc={round(self.counter)}"


@dataclass(eq=False)
class Outcome:
    """How one request went (module docstring). ``started`` is ``time.perf_counter()``."""

    endpoint: str
    status: LedgerStatus = "error"
    http_status: int = 0
    model_served: str | None = None
    pool: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    route_step: str | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)  # "pool:reason" per failed attempt
    started: float = field(default_factory=time.perf_counter)
    last_at: float | None = None
    itls: list[float] = field(default_factory=list)
    choices: dict[int, Choice] = field(default_factory=dict)  # by index
    # ``time.perf_counter()`` when the request passed each phase (identified, routed,
    # admitted, ended, settled): a trace's spans.
    marks: dict[str, float] = field(default_factory=dict)
    engine_times: RequestTimes | None = None  # the answering engine's, from its last delta
    handoff: tuple[float, float | None] | None = None  # P/D: prefill leg, hand-off (s)
    # Engine seconds charged to it and their price (app.engine.gpu_time), every leg and
    # choice summed; None where no engine reported any (an upstream pool).
    gpu_seconds: float | None = None
    gpu_cost_usd: float | None = None
    queue: QueueNote | None = None  # where a fair queue gated it

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.perf_counter())

    def add(self, delta: GenerationDelta) -> None:
        now = time.perf_counter()
        if delta.prompt_tokens:  # the latest count wins: an upstream's exact usage
            self.prompt_tokens = delta.prompt_tokens  # replaces the first delta's estimate
            self.cached_tokens = delta.cached_prompt_tokens
        self.completion_tokens += delta.num_new_tokens  # every choice's tokens
        choice = self.choice(delta.index)
        choice.logprobs.extend(delta.logprobs)
        choice.tool_calls.extend(delta.tool_calls)
        if delta.text or delta.tool_calls:
            if self.ttft_s is None:
                self.ttft_s = now - self.started
            elif self.last_at is not None:
                self.itls.append(now - self.last_at)
            self.last_at = now
            if delta.text:
                choice.parts.append(delta.text)
        if delta.finish_reason is not None:
            choice.finish_reason = delta.finish_reason
            choice.stop_sequence = delta.stop_sequence
        if delta.times is not None:
            self.engine_times = delta.times
        if delta.gpu_seconds is not None:
            self.gpu_seconds = (self.gpu_seconds or 0.0) + delta.gpu_seconds
            self.gpu_cost_usd = (self.gpu_cost_usd or 0.0) + (delta.gpu_cost_usd or 0.0)

    def choice(self, index: int) -> Choice:
        if index not in self.choices:
            self.choices[index] = Choice()
        return self.choices[index]

    @property
    def finished(self) -> int:
        """Choices that have their finish reason."""
        return sum(1 for c in self.choices.values() if c.finish_reason is not None)

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choice(0).text

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason."""
        return self.choices[0].finish_reason if 0 in self.choices else None

    @property
    def e2e_s(self) -> float:
        return time.perf_counter() - self.started
