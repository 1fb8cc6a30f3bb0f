"""Model selection: a request's model name becomes a model, a pool, and fallbacks.

Rule (seed 000 CH4-2 §5, CH4-3 §3), per request, first match wins:
1. lookup — a model, a plain alias, or a policy alias (``app.routing.policy`` drops the
   candidates that break a hard limit — the request's own quality floor included — and
   scores the rest); unknown → None (404);
2. canary — ``random() < canary.weight`` → the canary pool. It comes before the tenant
   override so the canary sample is drawn from every tenant alike (a tenant with a
   dedicated pool would otherwise never see the canary, biasing its metrics);
3. tenant override — the tenant's dedicated pool;
4. speculative decoding — ``max_tokens > draft.min_output_tokens`` (default 1024; an
   unset max_tokens counts as the rest of the context) → the draft pool, unless its
   measured draft acceptance (``app.routing.acceptance``) is below
   ``draft.min_acceptance``: then the next step decides (the header says ``speculative=
   off (…)``);
5. default — the model's pool.
The endpoint, with the lookup: a request that names its endpoint (``chat``,
``completion``, ``embeddings``) must reach a model of that endpoint's task
(``ENDPOINT_TASKS``: generate or embed) — the model itself, an alias's target, or a
policy alias's candidates (those of another task are not considered); otherwise
``WrongEndpoint`` (a 400 naming the model's task), so before any tokenizing, admission
or dispatch. A lookup without an endpoint (``/ready``, tools) is not checked.
Fallbacks: the model's default pool (when another step chose) then its ``fallbacks``,
each pool at most once, never the chosen one.

A ``RouteTable`` is an immutable, versioned snapshot compiled from a ``RoutesSpec``;
the router deployment owns the current one and gateways decide locally on a copy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from app.routing.classes import classify as classify_request
from app.routing.policy import Candidate, PolicyChoice, choose, features
from app.routing.spec import (
    LocalPool,
    ModelProfile,
    PolicyAlias,
    RoutesSpec,
    UpstreamPool,
    adapter_base,
)

# The task a model must have to answer on an endpoint (``app.request.Endpoint``).
ENDPOINT_TASKS: Mapping[str, str] = {"chat": "generate", "completion": "generate",
                                     "messages": "generate", "responses": "generate",
                                     "embeddings": "embed"}  # fmt: skip
# What a task serves, and where a client asks for it (the 400's advice).
TASK_USES: Mapping[str, tuple[str, str]] = {
    "generate": ("text generation",
                 "/v1/chat/completions, /v1/completions, /v1/responses or /v1/messages"),
    "embed": ("embeddings", "/v1/embeddings"),
}


@dataclass(frozen=True)
class LocalModel:
    """A model served by an LLMServer deployment of this application."""

    deployment: str
    task: str
    max_model_len: int
    profile: str | None = None  # its serving profile (app.profiles)
    slo: Mapping[str, float] = field(default_factory=dict)  # that profile's SLO (p95s, ms)
    slots: int | None = None  # sequences its engines run at once, all replicas (the most)
    replicas: int = 1  # its engine replicas (the most)


class Routable(Protocol):
    """What a route decision reads of a request: the gateway's ``InferenceRequest``
    itself, or a ``RouteRequest`` made for a lookup (``/ready``, tools, tests)."""

    @property
    def model(self) -> str: ...
    @property
    def tenant(self) -> str | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def prompt_text(self) -> str: ...
    @property
    def quality_floor(self) -> float | None: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...
    @property
    def batch(self) -> bool: ...


@dataclass(frozen=True)
class RouteRequest:
    """A route lookup without a client request behind it."""

    model: str
    tenant: str | None = None
    max_tokens: int | None = None
    prompt_tokens: int = 0  # an estimate is enough: policy context checks use it
    prompt_text: str = ""
    quality_floor: float | None = None  # the request's own floor (policy aliases)
    endpoint: str | None = None  # None: any task answers (a lookup, not a request)
    stream: bool = False
    batch: bool = False  # marked as batch work (service_tier flex, x-switchyard-class)


@dataclass(frozen=True)
class RouteDecision:
    requested: str
    model: str
    pool: str
    step: str  # canary | tenant | class | speculative | default
    fallbacks: tuple[str, ...] = ()
    via: str | None = None  # alias | policy
    request_class: str | None = None
    policy: PolicyChoice | None = None
    # A LoRA adapter (``base:adapter``) the routes chose: an alias to it, or the
    # model's canary or tenant override. None: the request's own choice stands.
    adapter: str | None = None
    adapter_required: bool = False  # named by the alias: a missing one is a 404
    profile: str | None = None  # the serving profile of the chosen pool's model
    quality: str | None = None  # a policy's pick: the quality it used (``quality_note``)
    speculative: str | None = None  # the draft pool's health, when step 4 applied (``Draft.note``)


@dataclass(frozen=True)
class ModelRoute:
    """A public model as /v1/models lists it."""

    model: str
    pool: str
    task: str
    max_model_len: int
    profile: str | None = None
    slo: Mapping[str, float] = field(default_factory=dict)


class NoRouteFits(Exception):
    """A policy alias whose every candidate breaks a hard limit for this request."""

    def __init__(self, alias: str, dropped: Mapping[str, str]) -> None:
        reasons = ", ".join(f"{m} ({why})" for m, why in sorted(dropped.items()))
        super().__init__(f"No model behind `{alias}` fits this request: {reasons}.")
        self.alias = alias
        self.dropped = dict(dropped)


class WrongEndpoint(Exception):
    """The requested model (or what its alias names) serves another task than the
    endpoint's: chat to an embedding model, embeddings to a generation model."""

    def __init__(self, requested: str, model: str, task: str, endpoint: str) -> None:
        what, where = TASK_USES.get(task, (f"task {task}", "the endpoint of that task"))
        named = f"`{requested}`" if requested == model else f"`{requested}` (model `{model}`)"
        super().__init__(f"{named} serves {what} (task {task}); use {where}.")
        self.requested = requested
        self.model = model
        self.task = task
        self.endpoint = endpoint


LiveLatency = Callable[[str], tuple[float | None, float | None]]  # pool → (p95 TTFT, ITL) ms
Acceptance = Callable[[str], float | None]  # pool → measured draft acceptance (or None)


def no_live(pool: str) -> tuple[float | None, float | None]:
    return None, None


def no_acceptance(pool: str) -> float | None:
    return None


@dataclass(frozen=True)
class RouteTable:
    version: int
    spec: RoutesSpec
    local: Mapping[str, LocalModel] = field(default_factory=dict)  # model id → deployment

    # ---- lookups -----------------------------------------------------------------------

    def deployment(self, pool: str) -> str | None:
        """The LLMServer deployment behind a local pool (None for upstream pools)."""
        spec = self.spec.pools.get(pool)
        if isinstance(spec, LocalPool):
            local = self.local.get(spec.model)
            return local.deployment if local else None
        return None

    def local_model(self, pool: str) -> LocalModel | None:
        """The served model behind a local pool (None for upstream pools)."""
        spec = self.spec.pools.get(pool)
        return self.local.get(spec.model) if isinstance(spec, LocalPool) else None

    def upstream(self, pool: str) -> UpstreamPool | None:
        spec = self.spec.pools.get(pool)
        return spec if isinstance(spec, UpstreamPool) else None

    def pool_model(self, pool: str) -> str | None:
        """The local model id a local pool serves (its tokenizer counts prompts)."""
        spec = self.spec.pools.get(pool)
        if isinstance(spec, LocalPool):
            return spec.model
        return spec.tokenizer if isinstance(spec, UpstreamPool) else None

    def profile(self, model: str) -> ModelProfile | None:
        m = self.spec.models.get(model)
        return m.profile if m is not None else None

    def max_model_len(self, model: str) -> int:
        """The context window of a public model (0 when unknown): its pool's, or the
        widest of its class pools' (a long prompt goes to the long-context pool)."""
        m = self.spec.models.get(model)
        if m is None:
            return 0
        pools = [m.pool, *(m.classes.pools.values() if m.classes else ())]
        return max(self._pool_window(p, m.profile.max_context) for p in pools)

    def window(self, decision: RouteDecision) -> int:
        """The context window of the pool a decision chose."""
        m = self.spec.models.get(decision.model)
        return self._pool_window(decision.pool, m.profile.max_context if m else 0)

    def _pool_window(self, pool: str, upstream: int) -> int:
        local = self.local_model(pool)
        return local.max_model_len if local else upstream

    def task(self, model: str) -> str:
        """The task of a public model: its local model's; an upstream pool generates."""
        pool = self.spec.pools[self.spec.models[model].pool]
        local = self.local.get(pool.model) if isinstance(pool, LocalPool) else None
        return local.task if local else "generate"

    def _fits(self, model: str, endpoint: str | None) -> bool:
        wanted = ENDPOINT_TASKS.get(endpoint) if endpoint is not None else None
        return wanted is None or self.task(model) == wanted

    def default_model(self) -> str | None:
        if self.spec.default_model is not None:
            return self.spec.default_model
        generating = [r.model for r in self.models() if r.task == "generate"]
        return generating[0] if generating else None

    def models(self) -> list[ModelRoute]:
        out = []
        for name, m in self.spec.models.items():
            pool = self.spec.pools[m.pool]
            local = self.local.get(pool.model) if isinstance(pool, LocalPool) else None
            served = (local.profile, local.slo) if local else (None, {})
            out.append(ModelRoute(name, m.pool, self.task(name), self.max_model_len(name), *served))
        return sorted(out, key=lambda r: r.model)

    # ---- the decision --------------------------------------------------------------------

    def decide(
        self,
        request: Routable,
        rand: Callable[[], float] = random.random,
        live: LiveLatency = no_live,
        acceptance: Acceptance = no_acceptance,
    ) -> RouteDecision | None:
        name, via, choice, adapter = request.model, None, None, None
        required = False  # the alias named the adapter: a missing one is a 404
        if name not in self.spec.models:
            target = self.spec.aliases.get(name)
            if target is None:
                return None
            if isinstance(target, PolicyAlias):
                choice = self._choose(name, target, request, live)
                name, via = choice.model or "", "policy"
            elif target not in self.spec.models:  # an adapter of a model
                name, via, adapter = adapter_base(target) or target, "alias", target
                required = True
            else:
                name, via = target, "alias"
        endpoint = request.endpoint
        if not self._fits(name, endpoint):
            assert endpoint is not None
            raise WrongEndpoint(request.model, name, self.task(name), endpoint)
        model = self.spec.models[name]
        tenant = model.tenant(request.tenant) if request.tenant is not None else None
        klass, speculative = None, None
        if model.classes is not None:
            klass = classify_request(
                model.classes,
                prompt_tokens=request.prompt_tokens,
                max_tokens=request.max_tokens,
                stream=request.stream,
                batch=request.batch,
            )
        if model.canary is not None and rand() < model.canary.weight:
            pool, step = model.canary.pool or model.pool, "canary"
            adapter = adapter or model.canary.adapter
        elif tenant is not None:
            pool, step = tenant.pool or model.pool, "tenant"
            adapter = adapter or tenant.adapter
        elif klass is not None and model.classes is not None and klass in model.classes.pools:
            pool, step = model.classes.pools[klass], "class"
        elif model.draft is not None and self._long(request, model.profile) > (
            model.draft.min_output_tokens
        ):
            use, speculative = model.draft.note(acceptance(model.draft.pool))
            pool, step = (model.draft.pool, "speculative") if use else (model.pool, "default")
        else:
            pool, step = model.pool, "default"
        fallbacks = tuple(p for p in dict.fromkeys([model.pool, *model.fallbacks]) if p != pool)
        return RouteDecision(
            requested=request.model,
            model=name,
            pool=pool,
            step=step,
            fallbacks=fallbacks,
            via=via,
            request_class=klass or (choice.request_class if choice else None),
            policy=choice,
            adapter=adapter,
            adapter_required=required,
            profile=local.profile if (local := self.local_model(pool)) else None,
            quality=model.profile.quality_note() if via == "policy" else None,
            speculative=speculative,
        )

    @staticmethod
    def _long(request: Routable, profile: ModelProfile) -> int:
        if request.max_tokens is not None:
            return request.max_tokens
        return max(0, profile.max_context - request.prompt_tokens)

    def _choose(
        self, alias: str, target: PolicyAlias, request: Routable, live: LiveLatency
    ) -> PolicyChoice:
        names = target.policy.candidates
        fitting = [m for m in names if self._fits(m, request.endpoint)]
        if not fitting:  # every candidate serves another task
            raise WrongEndpoint(alias, names[0], self.task(names[0]), str(request.endpoint))
        candidates = []
        for model in fitting:
            m = self.spec.models[model]
            ttft, itl = live(m.pool)
            candidates.append(Candidate(model, m.profile, ttft, itl))
        if request.max_tokens is not None:
            wanted = request.max_tokens
        else:  # the rest of the largest candidate's context
            widest = max(c.profile.max_context for c in candidates)
            wanted = max(0, widest - request.prompt_tokens)
        f = features(request.prompt_text, request.prompt_tokens, wanted, request.tenant)
        policy = target.policy
        if request.quality_floor is not None:
            floor = max(policy.quality_floor or 0.0, request.quality_floor)
            policy = policy.model_copy(update={"quality_floor": floor})
        choice = choose(policy, candidates, f)
        if choice.model is None:
            raise NoRouteFits(alias, choice.dropped)
        return choice


def default_spec(
    models: Mapping[str, LocalModel], prices: Mapping[str, ModelProfile]
) -> RoutesSpec:
    """Without a routes file: every served model is a public model on its own pool."""
    return RoutesSpec.model_validate(
        {
            "pools": {m: {"kind": "local", "model": m} for m in models},
            "models": {m: {"pool": m, "profile": prices[m].model_dump()} for m in models},
        }
    )


def check_local_pools(spec: RoutesSpec, local: Mapping[str, LocalModel]) -> None:
    """Raise ``ValueError`` naming every local pool whose model this app does not serve."""
    bad = [
        f"pools.{name}.model: {pool.model!r} is not among the served models {sorted(local)}"
        for name, pool in spec.pools.items()
        if isinstance(pool, LocalPool) and pool.model not in local
    ]
    bad += [
        f"pools.{name}.tokenizer: {pool.tokenizer!r} is not among the served models"
        for name, pool in spec.pools.items()
        if isinstance(pool, UpstreamPool) and pool.tokenizer and pool.tokenizer not in local
    ]
    if bad:
        raise ValueError("; ".join(bad))
