"""The routes file: where requests can go (pools), the public models with their
profiles and per-model routing rules, and aliases (plain or policy).

    pools:
      smol:   {kind: local, model: SmolLM2-135M-Instruct}     # an LLMServer deployment
      vendor: {kind: openai, base_url: http://host:8000/v1, model: their-name,
               api_key_env: VENDOR_KEY, timeout_s: 60, max_concurrency: 64}
    models:
      chat:
        pool: smol
        profile: {input_per_1m: 0.1, output_per_1m: 0.4, quality: 0.6, max_context: 2048,
                  p95_ttft_ms: 150, p95_itl_ms: 25}
        classes: {pools: {long_context: smol-long}}        # by request class (app.routing.classes)
        draft: {pool: smol-spec, min_output_tokens: 1024}    # max_tokens above it → draft pool
                                                             # (min_acceptance: 0.4)
        canary: {pool: smol-next, weight: 0.05}
        tenants: {acme: smol-acme}
        fallbacks: [vendor]
    aliases:
      gpt-4o-mini: chat
      auto: {policy: {candidates: [chat, big], quality_floor: 0.5}}

An adapter named here (an alias target, a canary's or a tenant's ``adapter``) is the
full id ``base:adapter`` of a model in ``models``. Adapters are registered at run time on
a served model id, so that base must be both. The adapter is looked up in the adapter
registry per request.

Every model forbids unknown fields; cross-references are checked so a bad file fails
``switchyard routes check`` (and a hot reload) with the path of the bad field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from app.routing.classes import ClassRouting
from app.routing.measured import MeasuredQuality, MeasuredQualityError, resolve
from app.schema import StrictFrozen
from app.state.protocol import Price

NAME = r"^[A-Za-z0-9._:/\-]+$"


class LocalPool(StrictFrozen):
    """An in-cluster LLMServer deployment, named by the served model id."""

    kind: Literal["local"] = "local"
    model: str = Field(min_length=1)


class UpstreamPool(StrictFrozen):
    """An external OpenAI-compatible server (another vLLM, SGLang, Ollama, a vendor)."""

    kind: Literal["openai"]
    base_url: str = Field(pattern=r"^https?://", description="Up to and including /v1")
    model: str = Field(min_length=1, description="The model name the upstream expects")
    api_key_env: str | None = None
    api_key_file: Path | None = None
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_concurrency: int = Field(default=64, ge=1)
    tokenizer: str | None = Field(
        default=None, description="A local model id whose tokenizer approximates this one"
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> UpstreamPool:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give api_key_env or api_key_file, not both")
        return self


Pool = Annotated[LocalPool | UpstreamPool, Field(discriminator="kind")]


class Pricing(StrictFrozen):
    """US dollars per million tokens; cached input defaults to the input price."""

    input_per_1m: float = Field(default=0.0, ge=0)
    output_per_1m: float = Field(default=0.0, ge=0)
    cached_input_per_1m: float | None = Field(default=None, ge=0)

    def price(self) -> Price:
        """US dollars per token."""
        cached = self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m
        return Price(self.input_per_1m / 1e6, self.output_per_1m / 1e6, cached / 1e6)


class ModelProfile(Pricing):
    quality: float | MeasuredQuality = Field(
        default=0.5, description="0–1: a number, or {measured: <eval report JSON>}."
    )
    max_context: int = Field(default=2048, ge=16)
    p95_ttft_ms: float | None = Field(default=None, ge=0)
    p95_itl_ms: float | None = Field(default=None, ge=0)

    @field_validator("quality")
    @classmethod
    def _in_unit_range(cls, q: float | MeasuredQuality) -> float | MeasuredQuality:
        if isinstance(q, float | int) and not 0 <= q <= 1:
            raise ValueError("quality must be between 0 and 1")
        return q

    @property
    def quality_score(self) -> float:
        """The quality policy routing uses, declared or measured."""
        q = self.quality
        return q.score if isinstance(q, MeasuredQuality) else float(q)

    def quality_note(self) -> str:
        """For the route header: ``0.62 (measured 2026-12-07)`` or ``0.6 (declared)``."""
        q = self.quality
        if isinstance(q, MeasuredQuality):
            return f"{q.score:.3g} (measured {q.date[:10] or 'undated'})"
        return f"{float(q):.3g} (declared)"


class Draft(StrictFrozen):
    """Speculative decoding: requests asking for more than ``min_output_tokens`` go to
    ``pool`` (a vLLM pool with a ``speculative_config``) while its measured draft
    acceptance (``app.routing.acceptance``) is not below ``min_acceptance``."""

    pool: str
    min_output_tokens: int = Field(default=1024, ge=1)
    min_acceptance: float = Field(
        default=0.4,
        ge=0,
        le=1,
        description="Below this measured acceptance the model's own pool answers "
        "(seed 003 §5.3); 0: never held off.",
    )

    def note(self, acceptance: float | None) -> tuple[bool, str]:
        """Whether the draft pool may answer at ``acceptance`` (None: not measured
        yet), and the route header's word on it."""
        if acceptance is None:
            return True, "unmeasured"
        if acceptance < self.min_acceptance:
            return False, f"off (acceptance {acceptance:.2f} < {self.min_acceptance:.2f})"
        return True, f"acceptance {acceptance:.2f}"


def adapter_base(target: str) -> str | None:
    """``base:adapter`` → base; None when ``target`` cannot name an adapter."""
    base, sep, name = target.rpartition(":")
    return base if sep and base and name else None


class Target(StrictFrozen):
    """Where a canary share or a tenant goes: another pool, a LoRA adapter of this model
    (``base:adapter``), or both. Absent pool: the model's own."""

    pool: str | None = None
    adapter: str | None = Field(default=None, pattern=NAME)

    @model_validator(mode="after")
    def _something(self) -> Target:
        if self.pool is None and self.adapter is None:
            raise ValueError("give a pool, an adapter, or both")
        if self.adapter is not None and adapter_base(self.adapter) is None:
            raise ValueError(f"adapter {self.adapter!r} is not base:adapter")
        return self


class Canary(Target):
    weight: float = Field(ge=0, le=1)


class PublicModel(StrictFrozen):
    pool: str
    profile: ModelProfile = Field(default_factory=ModelProfile)
    classes: ClassRouting | None = Field(
        default=None, description="Pools per request class (app.routing.classes)."
    )
    draft: Draft | None = None
    canary: Canary | None = None
    tenants: dict[str, str | Target] = Field(default_factory=dict)
    fallbacks: list[str] = Field(default_factory=list)

    def tenant(self, tenant: str) -> Target | None:
        """The tenant's override as a target (a plain string is a pool)."""
        got = self.tenants.get(tenant)
        return Target(pool=got) if isinstance(got, str) else got

    def pools(self) -> list[tuple[str, str]]:
        """(field path, pool name) of every pool this model refers to."""
        out = [("pool", self.pool)]
        if self.classes is not None:
            out += [(f"classes.pools.{c}", p) for c, p in self.classes.pools.items()]
        if self.draft is not None:
            out.append(("draft.pool", self.draft.pool))
        if self.canary is not None and self.canary.pool is not None:
            out.append(("canary.pool", self.canary.pool))
        for t in self.tenants:
            target = self.tenant(t)
            if target is not None and target.pool is not None:
                out.append((f"tenants.{t}", target.pool))
        out += [(f"fallbacks[{i}]", p) for i, p in enumerate(self.fallbacks)]
        return out

    def adapters(self) -> list[tuple[str, str]]:
        """(field path, adapter id) of every adapter this model's routes name."""
        out = []
        if self.canary is not None and self.canary.adapter is not None:
            out.append(("canary.adapter", self.canary.adapter))
        for t in self.tenants:
            target = self.tenant(t)
            if target is not None and target.adapter is not None:
                out.append((f"tenants.{t}.adapter", target.adapter))
        return out


class Weights(StrictFrozen):
    quality: float = Field(default=0.5, ge=0)
    latency: float = Field(default=0.3, ge=0)
    cost: float = Field(default=0.2, ge=0)


class Policy(StrictFrozen):
    candidates: list[str] = Field(min_length=1)
    weights: Weights = Field(default_factory=Weights)
    quality_floor: float | None = Field(default=None, ge=0, le=1)
    tenant_quality_floors: dict[str, float] = Field(default_factory=dict)
    cost_ceiling_usd: float | None = Field(default=None, ge=0)
    latency_slo_ms: float | None = Field(default=None, gt=0)


class PolicyAlias(StrictFrozen):
    policy: Policy


class FallbackLimits(StrictFrozen):
    """Bounds of dispatch with fallbacks (``app.dispatch.fallback`` states the rule)."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    total_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds all attempts together have for a generation's first token, "
        "or for an embeddings request's vectors (plus embedding_input_s per input).",
    )
    embedding_input_s: float = Field(
        default=0.05,
        ge=0,
        description="Seconds each input of an embeddings request adds to total_timeout_s "
        "(the engine embeds every input before the reply): 2,048 inputs have 30 + 102 s. "
        "About five times a short input's cost on a 2-core CPU (MiniLM, float32).",
    )


class RoutesSpec(StrictFrozen):
    pools: dict[Annotated[str, Field(pattern=NAME)], Pool]
    models: dict[Annotated[str, Field(pattern=NAME)], PublicModel] = Field(min_length=1)
    # An alias names a model, a LoRA adapter of one (``base:adapter``) or a policy.
    aliases: dict[Annotated[str, Field(pattern=NAME)], str | PolicyAlias] = Field(
        default_factory=dict
    )
    default_model: str | None = None
    fallback: FallbackLimits = Field(default_factory=FallbackLimits)

    @model_validator(mode="after")
    def _references(self) -> RoutesSpec:
        errors: list[str] = []
        for name, model in self.models.items():
            for where, pool in model.pools():
                if pool not in self.pools:
                    errors.append(f"models.{name}.{where}: unknown pool {pool!r}")
            if model.pool in model.fallbacks:
                errors.append(f"models.{name}.fallbacks: lists its own pool {model.pool!r}")
            for where, adapter in model.adapters():
                if adapter_base(adapter) != name:
                    errors.append(f"models.{name}.{where}: {adapter!r} is not an adapter of {name}")
        for alias, target in self.aliases.items():
            if alias in self.models:
                errors.append(f"aliases.{alias}: shadows the model of the same name")
            names = [target] if isinstance(target, str) else target.policy.candidates
            for i, name in enumerate(names):
                if isinstance(target, str) and name not in self.models:
                    name = adapter_base(name) or name  # an adapter: its base must exist
                if name not in self.models:
                    where = "" if isinstance(target, str) else f".policy.candidates[{i}]"
                    errors.append(f"aliases.{alias}{where}: unknown model {name!r}")
        if self.default_model is not None and self.default_model not in self.models:
            errors.append(f"default_model: unknown model {self.default_model!r}")
        if errors:
            raise ValueError("; ".join(errors))
        return self


class RoutesFileError(ValueError):
    """A routes file that cannot be used; the message names the bad field."""


def describe(exc: ValidationError) -> str:
    """One line per problem: ``path.to.field: message``."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-",)))
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{path}: {msg}" if path else msg)
    return "\n".join(lines)


def parse_routes(text: str, source: str = "<routes>") -> RoutesSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RoutesFileError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RoutesFileError(f"{source}: the routes file must be a mapping")
    base = Path(source).parent if source != "<routes>" else Path.cwd()
    try:
        return RoutesSpec.model_validate(resolve(data, base))
    except MeasuredQualityError as exc:
        raise RoutesFileError(f"{source}: {exc}") from None
    except ValidationError as exc:
        raise RoutesFileError(f"{source}:\n{describe(exc)}") from None


def load_routes(path: Path) -> RoutesSpec:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RoutesFileError(f"{path}: {exc.strerror}") from None
    return parse_routes(text, str(path))
