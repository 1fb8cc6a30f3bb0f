"""The application's arguments (what ``serve_configs/*.yaml`` pass to ``build_app``).

Every config model forbids unknown fields, so a typo in a serve config fails at
start-up with the path of the bad field.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from app.disagg.config import Disaggregation
from app.engine.lora import LoraSettings
from app.engine.settings import EngineSettings
from app.engine.simulated import SimulationProfile
from app.models.s3 import SCHEME as S3_SCHEME
from app.models.s3 import S3Location
from app.profiles.catalog import Backpressure
from app.profiles.checks import refusals
from app.profiles.resolve import ProfileRef, apply_profile
from app.routing.spec import Pricing, RoutesSpec
from app.scheduler.config import ReplicaRouting
from app.schema import Strict


class ResponsesConfig(Strict):
    """Stored responses of the Responses API (``app.responses``): how long one is kept,
    and how large it may be."""

    ttl_s: float = Field(
        default=30 * 86400.0,
        gt=0,
        description="A stored response (and the chain it continues) can be retrieved and "
        "continued with previous_response_id for this long after it was written.",
    )
    max_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="A response whose stored form (the chain's messages so far, its input "
        "items and the answer) is larger is served but not stored (`store` false in it).",
    )


class SessionsConfig(Strict):
    """Agent sessions (the ``x-session-id`` header): when one ends, its SLO, how long a
    cancellation holds."""

    idle_s: float = Field(
        default=300.0,
        gt=0,
        description="A session ends this long after its last call was admitted or ended; "
        "its duration, calls and SLO outcome are then counted in the session metrics.",
    )
    cancel_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description="After POST /v1/sessions/{id}/cancel, new calls of the session get 409 "
        "for this long; then the id may be used again.",
    )
    slo_ms: float | None = Field(
        default=None,
        gt=0,
        description="The session SLO (wall time from its first call's start to its last "
        "call's end) for every tenant; a request's `x-switchyard-session-slo-ms` wins.",
    )
    tenant_slo_ms: dict[str, float] = Field(
        default_factory=dict, description="Per-tenant session SLOs, over `slo_ms`."
    )

    @field_validator("tenant_slo_ms")
    @classmethod
    def _positive(cls, slos: dict[str, float]) -> dict[str, float]:
        bad = [t for t, ms in slos.items() if not ms > 0]
        if bad:
            raise ValueError(f"session SLOs must be positive: {bad!r}")
        return slos

    def slo_for(self, tenant: str) -> float | None:
        return self.tenant_slo_ms.get(tenant, self.slo_ms)


class FairnessArgs(Strict):
    """Fair sharing of a saturated model (``app.fairness.queue``): past its engine slots
    (replicas × max_num_seqs, split among the ingress replicas), requests wait at the
    ingress in priority bands, the tenant with the least weighted service first."""

    enabled: bool = Field(
        default=True,
        description="false: requests go to the engines first come, first served (their "
        "own queues), with no bands and no shedding here.",
    )
    max_waiting: int = Field(
        default=256, ge=1, description="Requests waiting per model and ingress replica."
    )
    max_wait_s: float = Field(
        default=30.0, gt=0, description="Longest wait for a slot before 503 queue_timeout."
    )
    input_weight: float = Field(default=1.0, ge=0, description="VTC weight of a prompt token.")
    output_weight: float = Field(default=2.0, gt=0, description="VTC weight of an output token.")
    headroom: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Share of a model's slots (at least one; 0: none) kept for requests "
        "that are not batch and whose tenant holds less than its fair part of them.",
    )
    headroom_sigmas: float | None = Field(
        default=1.0,
        ge=0,
        description="Raise the headroom to the light requests' recent demand: their mean "
        "slots D plus this many √D, less what they hold (app.fairness.reserve; null: the "
        "fixed headroom alone).",
    )
    engine_max_waiting: int = Field(
        default=2,
        ge=0,
        description="An engine with more requests waiting than this is full: while every "
        "replica's last report says full, no more requests start than run.",
    )
    engine_max_kv_usage: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="An engine whose KV cache is at least this full is full (as above).",
    )
    engine_stale_s: float = Field(
        default=5.0,
        gt=0,
        description="A replica's report older than this is ignored: the model's slots "
        "alone decide (fail open).",
    )
    max_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Per engine replica: a request starts only while the prompt tokens of "
        "started requests still waiting for their first token are fewer (none: no cap).",
    )
    max_kv_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Per engine replica: a request starts only while the started requests "
        "reserve fewer KV tokens, each its prompt plus the most output tokens it may "
        "produce (none: no cap).",
    )


class KvCacheIsolation(Strict):
    """Who may reuse whose prefix cache. An ``isolated`` tenant's prompts carry a cache
    salt derived from the tenant (vLLM's ``cache_salt``), so its cached KV blocks are
    never hit by another tenant's prompts (a timing side channel otherwise); ``shared``
    tenants' prompts carry none and share the cache with each other."""

    default: Literal["isolated", "shared"] = Field(
        default="isolated", description="For every tenant not listed below."
    )
    tenants: dict[str, Literal["isolated", "shared"]] = Field(
        default_factory=dict, description="Per-tenant choice over the default."
    )

    def salt(self, tenant: str) -> str | None:
        """The cache salt of ``tenant``'s prompts (None: the shared cache)."""
        if self.tenants.get(tenant, self.default) == "shared":
            return None
        return hashlib.sha256(f"switchyard-kv:{tenant}".encode()).hexdigest()[:32]


class TracingArgs(Strict):
    """Traces of requests (``app.observability.tracing``): off without an endpoint."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces endpoint, e.g. http://otel-collector:4318/v1/traces; "
        "unset: no spans are built or sent (a caller's traceparent is still propagated).",
    )
    service_name: str = Field(default="switchyard", min_length=1)
    sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of traces started here that are exported; a caller's "
        "traceparent decides for its own trace.",
    )
    export_delay_ms: int = Field(
        default=1000, ge=1, description="How long spans wait to be sent in one batch."
    )


class GatewayArgs(Strict):
    """Layer-1 policy: who may call without credentials, and how budgets behave."""

    anonymous_tenant: str | None = Field(
        default=None,
        description="Local development only: requests without credentials act as this "
        "tenant (a warning is logged at start-up). Unset, credentials are required.",
    )
    min_output_tokens: int = Field(
        default=16, ge=1, description="Refuse (429 insufficient_quota) below this allowance."
    )
    budget_margin_tokens: int = Field(
        default=0, ge=0, description="Token budgets keep this much unspent (the seed's reserve)."
    )
    reservation_ttl_s: float = Field(default=60.0, gt=0)
    on_store_failure: Literal["fail_closed", "fail_open"] = "fail_closed"
    store_timeout_s: float = Field(default=0.5, gt=0)
    metrics_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants that get their own label value in the tenant metrics; every "
        "other tenant is 'other'. An allow-list, so labels stay bounded and do not depend "
        "on the order tenants arrive in.",
    )
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    kv_cache: KvCacheIsolation = Field(default_factory=KvCacheIsolation)
    fairness: FairnessArgs = Field(default_factory=FairnessArgs)
    tracing: TracingArgs = Field(default_factory=TracingArgs)
    metrics_include_engines: bool = Field(
        default=False,
        description="GET /metrics also shows the engine family (ray_switchyard_engine_*) "
        "from the Ray metrics export of the node the answering ingress replica runs on: "
        "one URL for a single-node setup (make run). Leave it off where Prometheus "
        "scrapes Ray's export itself (KubeRay's PodMonitor), or it counts them twice.",
    )
    metrics_enabled: bool = Field(
        default=True,
        description="false: the gateway observes no metrics (GET /metrics serves none); "
        "for measuring what they cost (benchmarks/metrics_cost.py).",
    )
    public_metrics: Literal["tenant_free", "none", "all"] = Field(
        default="tenant_free",
        description="What GET /metrics serves without credentials: 'tenant_free' (every "
        "family without a tenant label), 'none' (404) or 'all' (a trusted network only). "
        "With `Authorization: Bearer <admin token>` it serves every family.",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tenant_label_cap" in data:
            raise ValueError(
                "tenant_label_cap was removed: list the tenants that get their own metrics "
                "label in metrics_tenants (every other tenant is 'other')"
            )
        return data

    @field_validator("metrics_tenants")
    @classmethod
    def _labelable(cls, tenants: list[str]) -> list[str]:
        bad = [t for t in tenants if not t or t == "other"]
        if bad:
            raise ValueError(f"metrics_tenants may not contain {bad!r} (empty or 'other')")
        return list(dict.fromkeys(tenants))


class RequestLimits(Strict):
    """What one request may ask, checked before any tokenizing or engine work (400
    naming the param beyond them)."""

    max_messages: int = Field(default=4096, ge=1, description="Messages per chat request.")
    max_prompt_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="UTF-8 bytes of all prompt text (message contents, or the prompt).",
    )
    max_embedding_inputs: int = Field(
        default=2048, ge=1, description="Inputs per embeddings request (the OpenAI API's cap)."
    )
    max_embedding_tokens: int = Field(
        default=300_000, ge=1, description="Tokens of all inputs of one embeddings request."
    )


class Autoscaling(Strict):
    """Ray Serve autoscaling of one model's LLMServer replicas: Ray adds replicas while
    the ongoing requests per replica stay above ``target_ongoing_requests`` for
    ``upscale_delay_s`` and removes them after ``downscale_delay_s`` below it. Worker
    pods follow through KubeRay's autoscaler; no other autoscaler (no CPU HPA) may act
    on these replicas."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)
    target_ongoing_requests: float = Field(default=16.0, gt=0)
    upscale_delay_s: float = Field(default=30.0, ge=0)
    downscale_delay_s: float = Field(default=600.0, ge=0)
    initial_replicas: int | None = Field(default=None, ge=0)
    look_back_period_s: float | None = Field(
        default=None, gt=0, description="Window of load Ray averages (Ray's default 30 s)."
    )
    metrics_interval_s: float | None = Field(
        default=None, gt=0, description="How often replicas report their load (Ray: 10 s)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}"
            )
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError("initial_replicas must lie within [min_replicas, max_replicas]")
        return self


def vllm_tool_parsers() -> list[str]:
    """The tool parsers the installed vLLM registers (sorted)."""
    from vllm.tool_parsers import ToolParserManager

    return sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers})


class ModelSpec(EngineSettings):
    """One served model: its public id, where its weights come from, its engine, and
    (``EngineSettings``) where its replicas run and the vLLM knobs for GPU clusters."""

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/\-]+$")
    engine: Literal["vllm", "simulated"] = "vllm"
    task: Literal["generate", "embed"] = "generate"
    source: str | None = Field(
        default=None,
        description="'embedded:smollm2', 'embedded:minilm', 'embedded:tiny-llama', a "
        "directory holding an HF model, 'volume:/path' (a directory on a volume mounted "
        "where the replicas run, checked there) or 's3://bucket/prefix' (object storage, "
        "downloaded once per node by the replica). Required for the vLLM engine.",
    )
    max_model_len: int = Field(default=2048, ge=16)
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        ge=16 * 1024**2,
        description="KV cache size; default 512 MiB on CPU, on a GPU what "
        "gpu_memory_utilization leaves.",
    )
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(default=32, ge=1)
    max_waiting: int = Field(default=256, ge=0)
    enforce_eager: bool = True
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    simulation: SimulationProfile | None = None
    num_replicas: int = Field(default=1, ge=1)
    autoscaling_config: Autoscaling | None = Field(
        default=None, description="Scale the replicas with load instead of num_replicas."
    )
    max_ongoing_requests: int = Field(default=256, ge=1)
    max_queued_requests: int = Field(default=512, ge=-1)
    backpressure: Backpressure | None = Field(
        default=None,
        description="The status (503 or 429) and Retry-After of a request the pool's queue "
        "(max_queued_requests) cannot take; absent: 503 with the gateway's Retry-After.",
    )
    profile: ProfileRef | None = Field(
        default=None,
        description="A serving profile (throughput, interactive, long_context, or a tuned "
        "profile file): fills every knob this model leaves unset (app.profiles).",
    )
    pricing: Pricing = Field(default_factory=Pricing)
    gpu_hourly_usd: float = Field(
        default=0.0,
        ge=0,
        description="US dollars per hour of one GPU (on CPU: of one replica's share of its "
        "node): each request's engine seconds (its share of every step it was in) are "
        "priced at this x the replica's GPUs, on the ledger as gpu_cost_usd.",
    )

    @property
    def replica_hourly_usd(self) -> float:
        """One replica's accelerators per hour (at least one unit on CPU)."""
        return self.gpu_hourly_usd * max(1, self.num_gpus or 0)

    tool_parser: str | None = Field(
        default=None,
        description="vLLM's tool parser for this model's own tool-call syntax (hermes, "
        "llama3_json, pythonic …): needed for tool_choice 'auto'; 'required' and a named "
        "function work without it (structured outputs).",
    )
    routing: ReplicaRouting | None = Field(
        default=None,
        description="Switchyard's replica router for this model's replicas (prefix, load "
        "and session affinity); absent: Ray Serve's default (power of two choices), "
        "unless a profile turns it on; 'off': never.",
    )
    lora: LoraSettings | None = Field(
        default=None,
        description="Serve LoRA adapters of this model (addressed 'model:adapter', "
        "registered with `switchyard adapters add`); absent: the base only.",
    )
    speculative_config: dict[str, Any] | None = Field(
        default=None,
        description="vLLM speculative decoding for this model's pool (a routes file's draft "
        "pool), passed to the engine as is.",
    )
    disaggregation: Disaggregation | None = Field(
        default=None,
        description="Prefill/decode disaggregation: this model's replicas are the decode "
        "role, and a second deployment prefills long prompts for them, per request "
        "(app.disagg).",
    )

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: Any) -> Any:
        return apply_profile(data) if isinstance(data, dict) else data

    @field_validator("source")
    @classmethod
    def _source(cls, source: str | None) -> str | None:
        if source is not None and source.startswith(S3_SCHEME):
            S3Location.parse(source)  # raises naming the problem
        return source

    @model_validator(mode="after")
    def _engine_fields(self) -> ModelSpec:
        if self.engine == "vllm" and self.source is None:
            raise ValueError(f"model {self.id!r}: the vllm engine needs a 'source'")
        if self.engine == "simulated" and self.speculative_config is not None:
            raise ValueError(f"model {self.id!r}: speculative_config needs the vllm engine")
        if self.tool_parser is not None:
            if self.engine != "vllm":
                raise ValueError(f"model {self.id!r}: tool_parser needs the vllm engine")
            known = vllm_tool_parsers()
            if self.tool_parser not in known:
                raise ValueError(
                    f"model {self.id!r}: unknown tool_parser {self.tool_parser!r}; the "
                    f"installed vLLM offers {', '.join(known)}"
                )
        if self.lora is not None and (self.engine != "vllm" or self.task != "generate"):
            raise ValueError(f"model {self.id!r}: lora needs the vllm engine and task generate")
        if self.engine == "vllm" and self.simulation is not None:
            raise ValueError(
                f"model {self.id!r}: 'simulation' applies to the simulated engine only"
            )
        if self.routing is not None and self.routing.prefix.mode == "precise":
            engine_block = (self.simulation or SimulationProfile()).block_size
            if self.engine == "simulated" and self.routing.prefix.block_size != engine_block:
                raise ValueError(
                    f"model {self.id!r}: precise routing hashes the engine's own KV blocks: "
                    f"routing.prefix.block_size must be {engine_block}, the simulated "
                    "engine's block_size"
                )
        if self.disaggregation is not None:
            if self.task != "generate":
                raise ValueError(f"model {self.id!r}: disaggregation needs task generate")
            if self.lora is not None:
                raise ValueError(
                    f"model {self.id!r}: disaggregation with LoRA adapters is not supported "
                    "yet (both engines would have to load each adapter)"
                )
        if self.autoscaling_config is not None and "num_replicas" in self.model_fields_set:
            raise ValueError(
                f"model {self.id!r}: num_replicas and autoscaling_config would both decide "
                "the replica count: give one"
            )
        problems = refusals(self)
        if problems:
            raise ValueError(f"model {self.id!r}: " + "; ".join(problems))
        if self.engine == "vllm":
            try:
                self.check_against_vllm()
            except ValueError as exc:
                raise ValueError(f"model {self.id!r}: {exc}") from None
        elif self.on_gpu or self.engine_kwargs or self.quantization is not None:
            raise ValueError(
                f"model {self.id!r}: the simulated engine runs on CPU and takes no vLLM "
                "engine settings (accelerator, quantization, engine_kwargs)"
            )
        return self

    @property
    def kv_cache_bytes(self) -> int | None:
        """What the engine gets: the configured size, 512 MiB on CPU, or None on a GPU
        (vLLM then sizes the cache from gpu_memory_utilization)."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        return None if self.on_gpu else 512 * 1024**2

    @property
    def pool(self) -> str:
        """Name of the LLMServer deployment serving this model (the decode role of a
        disaggregated model)."""
        return "LLMServer-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.id)

    @property
    def prefill_pool(self) -> str:
        """Name of the prefill role's deployment of a disaggregated model."""
        return self.pool + "-prefill"


class AppArgs(Strict):
    models: list[ModelSpec] = Field(min_length=1)
    default_model: str | None = None
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    ingress_replicas: int = Field(default=1, ge=1)
    ingress_max_ongoing_requests: int = Field(
        default=1024, ge=1, description="Requests one OpenAiIngress replica handles at once."
    )
    ready_timeout_s: float = Field(default=60.0, gt=0)
    route_refresh_s: float = Field(default=5.0, gt=0)
    gateway: GatewayArgs = Field(default_factory=GatewayArgs)
    limits: RequestLimits = Field(default_factory=RequestLimits)
    graceful_shutdown_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="On shutdown an ingress replica lets streams run this long, then ends "
        "them with an error event (billing what they produced) and settles everything.",
    )
    routes_file: str | None = Field(
        default=None,
        description="A routes file (see app/routing/spec.py), hot-reloaded when it changes.",
    )
    routes: RoutesSpec | None = Field(
        default=None, description="The routes inline (no hot reload from a file)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AppArgs:
        if self.routes_file is not None and self.routes is not None:
            raise ValueError("give routes_file or routes, not both")
        ids = [m.id for m in self.models]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate model ids: {dupes}")
        if self.default_model is None:
            generators = [m.id for m in self.models if m.task == "generate"]
            self.default_model = generators[0] if generators else None
        elif self.default_model not in ids:
            raise ValueError(f"default_model {self.default_model!r} is not among models {ids}")
        return self
