"""``build_app``: the one builder every serve config (and the RayService CR) imports.

    serve run serve_configs/local.yaml      # import_path: app.builders:build_app

It validates the arguments, reads settings once, resolves model weights (preparing
the embedded models when needed), and binds the three deployments:
OpenAiIngress → (route snapshot from) ModelRouter, and one LLMServer per model. The
ingress also gets its layer-1 configuration (state store URL, JWT and admin settings,
prompt tokenizers and prices per model).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from app.adapters.registry import AdapterBase, S3Defaults
from app.api.ingress import IngressOptions, OpenAiIngress
from app.config import AppArgs, ModelSpec
from app.disagg.config import Disaggregation, PrefillRole
from app.dispatch.disagg import DisaggregatedPool
from app.engine.factory import EngineConfig, SimulatedEngineConfig
from app.engine.settings import EngineSettings
from app.engine.simulated import SimulationProfile
from app.engine.vllm_engine import S3Source, VLLMEngineConfig
from app.gateway.gatekeeper import GatewayConfig
from app.gateway.jwt_auth import JwtConfig
from app.models.prepare import prepare_model
from app.models.s3 import SCHEME as S3_SCHEME
from app.models.s3 import S3Location
from app.profiles.checks import model_dir_refusals
from app.routing.router import ModelRouter
from app.routing.spec import ModelProfile, load_routes
from app.routing.table import LocalModel, RouteTable, check_local_pools, default_spec
from app.scheduler.config import ReplicaRouting
from app.serving.llm_server import LLMServer
from app.settings import Settings, load_settings

log = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
# A directory on a volume mounted where the replicas run (a PVC on the GPU workers), not
# where the application is built: checked by the replica when its engine starts.
VOLUME_PREFIX = "volume:"

# On a 2-core box every replica asks Ray for no CPU; vLLM sizes its own threads.
_NO_CPU = {"num_cpus": 0}
SETTLE_MARGIN_S = 15.0
SWITCHYARD_ROUTER = "app.scheduler.ray_router:SwitchyardRouter"
ROUTING_STATS_PERIOD_S = 2.0  # Ray polls each replica's routing stats this often


# The engine arguments a model spec declares under the engine's own names.
ENGINE_FIELDS_FROM_SPEC: set[str] = set(VLLMEngineConfig.model_fields) & set(ModelSpec.model_fields)


def is_replica_side(source: str | None) -> bool:
    """Whether the weights of ``source`` are found by the replica on its own node."""
    return source is not None and source.startswith((VOLUME_PREFIX, S3_SCHEME))


def resolve_source(source: str, settings: Settings) -> Path:
    """Directory of an HF model for ``source`` (preparing an embedded model once; a
    ``volume:`` path is taken as it is, for the replica to check; an ``s3://`` source is
    this node's cache directory for it, which the replica fills on its own node)."""
    if source.startswith(S3_SCHEME):
        location = S3Location.parse(source, settings.s3_endpoint_url, settings.s3_region)
        return location.cache_dir(settings.models_dir)
    if source.startswith(VOLUME_PREFIX):
        path = Path(source[len(VOLUME_PREFIX) :])
        if not path.is_absolute():
            raise ValueError(f"model source {source!r}: a volume path must be absolute")
        return path
    if source.startswith(EMBEDDED_PREFIX):
        name = source[len(EMBEDDED_PREFIX) :]
        return prepare_model(name, settings.models_dir, progress=None).path
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"model source {source!r} is not a directory with a config.json")
    return path


def simulation_profile(spec: ModelSpec) -> SimulationProfile:
    """The simulated engine's capacity from the model's own knobs (its batch, prefill
    budget, KV budget and window) where its ``simulation`` block does not set them, so
    a serving profile shapes the simulated engine as it shapes vLLM."""
    sim = spec.simulation or SimulationProfile()
    own = sim.model_fields_set
    update: dict[str, Any] = {}
    if "max_model_len" not in own:
        update["max_model_len"] = spec.max_model_len
    if spec.profile is not None or "max_num_seqs" in spec.model_fields_set:
        if "max_batch_size" not in own:
            update["max_batch_size"] = spec.max_num_seqs
        if "max_prefill_tokens_per_step" not in own and spec.max_num_batched_tokens:
            update["max_prefill_tokens_per_step"] = spec.max_num_batched_tokens
        if "kv_capacity_tokens" not in own and spec.kv_cache_memory_bytes is not None:
            update["kv_capacity_tokens"] = spec.kv_cache_memory_bytes // sim.kv_bytes_per_token
    return SimulationProfile.model_validate({**sim.model_dump(exclude_unset=True), **update})


def engine_config(spec: ModelSpec, settings: Settings) -> VLLMEngineConfig | SimulatedEngineConfig:
    # A router in precise mode follows what each engine reports holding.
    kv_events = spec.routing is not None and spec.routing.prefix.mode == "precise"
    if spec.engine == "simulated":
        profile = simulation_profile(spec)
        if spec.disaggregation is not None:
            profile = profile.model_copy(update={"kv_connector": True})
        return SimulatedEngineConfig(
            served_name=spec.id,
            task=spec.task,
            profile=profile,
            publish_kv_events=kv_events,
            hourly_usd=spec.replica_hourly_usd,
        )
    assert spec.source is not None
    s3 = None
    if spec.source.startswith(S3_SCHEME):
        s3 = S3Source(
            url=spec.source, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region
        )
    model_path = resolve_source(spec.source, settings)
    if spec.task == "generate":
        kv_dtype = str(spec.engine_kwargs.get("kv_cache_dtype", "auto"))
        kv_dtype = spec.vllm_dtype(spec.dtype, spec.task) if kv_dtype == "auto" else kv_dtype
        problems = model_dir_refusals(spec, model_path, kv_dtype)
        if problems:
            raise ValueError(f"model {spec.id!r}: " + "; ".join(problems))
    return VLLMEngineConfig.model_validate(
        {
            # The engine arguments come from the model spec: every field both declare is
            # taken by name (one rule, no field-by-field copy); the rest is derived here.
            **spec.model_dump(include=ENGINE_FIELDS_FROM_SPEC),
            "kv_cache_memory_bytes": spec.kv_cache_bytes,  # the profile's budget applied
            "model_path": model_path,
            "s3": s3,
            "served_name": spec.id,
            "hourly_usd": spec.replica_hourly_usd,
            "cache_root": settings.vllm_cache_dir,
            "publish_kv_events": kv_events,
            "adapters_dir": settings.models_dir / "adapters",
            "kv_connector": spec.disaggregation.connector if spec.disaggregation else None,
            "pd_role": "decode" if spec.disaggregation else None,
            "settings": EngineSettings.model_validate(
                spec.model_dump(include=set(EngineSettings.model_fields))
            ),
        }
    )


def prefill_engine_config(
    decode: VLLMEngineConfig | SimulatedEngineConfig, role: PrefillRole
) -> VLLMEngineConfig | SimulatedEngineConfig:
    """The prefill role's engine: the decode role's, with the role's own knobs."""
    if isinstance(decode, SimulatedEngineConfig):
        return decode
    update: dict[str, Any] = {"pd_role": "prefill", "publish_kv_events": False}
    if role.max_num_seqs is not None:
        update["max_num_seqs"] = role.max_num_seqs
    if role.kv_cache_memory_bytes is not None:
        update["kv_cache_memory_bytes"] = role.kv_cache_memory_bytes
    return decode.model_copy(update=update)


def router_config(routing: ReplicaRouting) -> dict[str, Any]:
    """Ray's ``RequestRouterConfig`` for Switchyard's replica router with ``routing``."""
    return {
        "request_router_class": SWITCHYARD_ROUTER,
        "request_router_kwargs": routing.model_dump(mode="json"),
        # how soon a new replica's KV-event endpoint reaches the routers
        "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
    }


def replica_options(spec: ModelSpec) -> dict[str, Any]:
    """Ray resources of one ``LLMServer`` replica.

    Rule: on CPU the replica actor asks for ``num_cpus`` (0 by default, the 2-core
    recipe). On one GPU it asks for ``num_gpus: 1`` of the ``accelerator`` type. Across
    ``world_size`` = TP x PP GPUs it gets a placement group: one bundle per GPU worker,
    ``{"GPU": 1, "accelerator_type:<type>": 0.001}``, with the replica actor's own
    ``{"CPU": num_cpus}`` added to the first bundle (the actor runs there, beside its
    first worker — the shape Ray Serve LLM uses); ``STRICT_PACK`` keeps a tensor-parallel
    group on one node, ``PACK`` lets pipeline stages spread."""
    if not spec.on_gpu:
        return {"ray_actor_options": {"num_cpus": spec.num_cpus}}
    accelerator = {f"accelerator_type:{spec.accelerator}": 0.001}
    if spec.world_size == 1:
        return {
            "ray_actor_options": {
                "num_cpus": spec.num_cpus,
                "num_gpus": 1,
                "accelerator_type": spec.accelerator,
            }
        }
    bundles: list[dict[str, float]] = [{"GPU": 1, **accelerator} for _ in range(spec.world_size)]
    if spec.num_cpus:
        bundles[0] = {"CPU": spec.num_cpus, **bundles[0]}
    return {
        "ray_actor_options": {"num_cpus": spec.num_cpus},
        "placement_group_bundles": bundles,
        "placement_group_strategy": "STRICT_PACK" if spec.pipeline_parallel_size == 1 else "PACK",
    }


def engine_replicas(spec: ModelSpec) -> int:
    """The most replicas the model may have."""
    scaling = spec.autoscaling_config
    return scaling.max_replicas if scaling is not None else spec.num_replicas


def engine_slots(spec: ModelSpec) -> int:
    """Sequences the model's engines run at once with the most replicas it may have
    (the fair queue's cap, ``app.fairness.queue``)."""
    per_replica = (
        simulation_profile(spec).max_batch_size if spec.engine == "simulated" else spec.max_num_seqs
    )
    return engine_replicas(spec) * per_replica


def route_table(app_args: AppArgs, version: int = 1, read_file: bool = True) -> RouteTable:
    """The first route table: from the routes file, the inline routes, or (neither) one
    public model per served model. Local pools must name served models. With
    ``read_file`` False a routes file is left to the router (its node has it): the table
    is then the one-model-per-model default, which the router replaces at start."""
    local = {
        m.id: LocalModel(
            deployment=m.pool,
            task=m.task,
            max_model_len=m.max_model_len,
            profile=m.profile.name if m.profile else None,
            slo=m.profile.bundle().slo.model_dump(exclude_none=True) if m.profile else {},
            slots=engine_slots(m),
            replicas=engine_replicas(m),
        )
        for m in app_args.models
    }
    if app_args.routes_file is not None and read_file:
        spec = load_routes(Path(app_args.routes_file))  # resolved by build_application
    elif app_args.routes is not None:
        spec = app_args.routes
    else:
        profiles = {
            m.id: ModelProfile(**m.pricing.model_dump(), max_context=m.max_model_len)
            for m in app_args.models
        }
        spec = default_spec(local, profiles)
        if app_args.default_model is not None:
            spec = spec.model_copy(update={"default_model": app_args.default_model})
    check_local_pools(spec, local)
    return RouteTable(version=version, spec=spec, local=local)


def locate_routes_file(routes_file: str) -> tuple[str, bool]:
    """The path the router replica reads, and whether it is on this node too (then it
    is checked here, before anything deploys). A file absent here must be given as an
    absolute path: it is read where the router runs (a ConfigMap mounted there)."""
    path = Path(routes_file).expanduser()
    if path.is_file():
        return str(path.resolve()), True
    if not path.is_absolute():
        raise ValueError(
            f"routes_file {routes_file!r} is not on this node: give an absolute path, which "
            "the ModelRouter replica reads on its own node"
        )
    log.info("routes_file %s is not on this node: the ModelRouter replica reads it", path)
    return str(path), False


def journal_dir(settings: Settings) -> Path:
    """The settlement journal of one state store: a journal replays only into the store
    it was written for, even when applications on other stores share the data dir."""
    store = hashlib.sha256(settings.resolved_state_url.encode()).hexdigest()[:16]
    return settings.journal_dir / store


def gateway_config(
    app_args: AppArgs, settings: Settings, engines: dict[str, EngineConfig]
) -> GatewayConfig:
    """Layer-1 configuration for the ingress: state store, credentials, tokenizers, prices."""
    jwt = None
    if settings.jwt_jwks is not None:
        jwt = JwtConfig(
            jwks=settings.jwt_jwks,
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            algorithms=settings.jwt_algorithms,
            tenant_claim=settings.jwt_tenant_claim,
            team_claim=settings.jwt_team_claim,
            user_claim=settings.jwt_user_claim,
        )
    # A model on a replica-side volume or in object storage has no tokenizer where the
    # ingress runs: its prompts are counted by the replica (and bounded here when a
    # budget needs them).
    remote = {m.id for m in app_args.models if is_replica_side(m.source)}
    return GatewayConfig(
        args=app_args.gateway,
        state_url=settings.resolved_state_url,
        jwt=jwt,
        admin_token=settings.admin_token,
        tokenizers={k: v for k, v in engines.items() if k not in remote},
        journal_dir=journal_dir(settings),
    )


def adapter_bases(engines: dict[str, EngineConfig]) -> dict[str, AdapterBase]:
    """The served text models adapters may extend, with their LoRA settings and, where
    the weights are on this node, their directory (registration checks target modules
    against it)."""
    return {
        name: AdapterBase(c.lora, c.model_path if c.s3 is None else None)
        for name, c in engines.items()
        if isinstance(c, VLLMEngineConfig) and c.task == "generate"
    }


def adapter_s3(settings: Settings) -> S3Defaults:
    """Object storage of ``s3://`` adapter sources, as for ``s3://`` models."""
    adapters_dir = settings.models_dir / "adapters"
    return S3Defaults(settings.s3_endpoint_url, settings.s3_region, adapters_dir)


def backpressure_options(spec: ModelSpec) -> dict[str, Any]:
    """Ray Serve's ``BackpressureConfig`` of a pool that sets ``backpressure``: the
    BackPressureError a full queue raises carries its status and Retry-After, which the
    ingress answers with (``app.api.errors``)."""
    if spec.backpressure is None:
        return {}
    from ray.serve.config import BackpressureConfig

    return {"backpressure_config": BackpressureConfig(**spec.backpressure.model_dump())}


def prefill_deployment(spec: ModelSpec, d: Disaggregation) -> Any:
    """The prefill role of a disaggregated model: LLMServer replicas of the same model
    whose ``prefill`` calls Switchyard's router places (prefix affinity, load)."""
    return serve.deployment(
        name=spec.prefill_pool,
        num_replicas=d.prefill.num_replicas,
        request_router_config=router_config(d.prefill.routing),
        max_ongoing_requests=d.prefill.max_ongoing_requests,
        health_check_period_s=10,
        health_check_timeout_s=30,
        **replica_options(spec),
    )(LLMServer)


def build_app(args: dict[str, Any]) -> Application:
    """The application builder serve configs import (Ray calls it with the config's
    ``args``): validate them, read settings once, build."""
    return build_application(AppArgs.model_validate(args), load_settings())


def build_application(app_args: AppArgs, settings: Settings) -> Application:
    """Build the Switchyard Ray Serve application from validated arguments."""
    servers = {}
    engines: dict[str, EngineConfig] = {}
    disaggregated: dict[str, DisaggregatedPool] = {}
    for spec in app_args.models:
        scaling: dict[str, Any] = (
            {"num_replicas": spec.num_replicas}
            if spec.autoscaling_config is None
            else {"autoscaling_config": spec.autoscaling_config.model_dump(exclude_none=True)}
        )
        if spec.routing is not None:  # Switchyard picks the replica (app.scheduler)
            scaling["request_router_config"] = router_config(spec.routing)
        deployment = serve.deployment(
            name=spec.pool,
            **scaling,
            max_ongoing_requests=spec.max_ongoing_requests,
            max_queued_requests=spec.max_queued_requests,
            **backpressure_options(spec),
            health_check_period_s=10,
            health_check_timeout_s=30,
            **replica_options(spec),
        )(LLMServer)
        engines[spec.id] = engine_config(spec, settings)
        servers[spec.pool] = deployment.bind(engines[spec.id])
        if spec.disaggregation is not None:
            servers[spec.prefill_pool] = prefill_deployment(spec, spec.disaggregation).bind(
                prefill_engine_config(engines[spec.id], spec.disaggregation.prefill)
            )
            disaggregated[spec.pool] = DisaggregatedPool(
                spec.pool, spec.prefill_pool, spec.disaggregation, spec.routing
            )
    here = True
    if app_args.routes_file is not None:  # replicas do not share the driver's cwd
        path, here = locate_routes_file(app_args.routes_file)
        app_args = app_args.model_copy(update={"routes_file": path})
    table = route_table(app_args, read_file=here)
    router = serve.deployment(name="ModelRouter", ray_actor_options=_NO_CPU)(ModelRouter)
    router_app = router.bind(table, app_args.routes_file)
    options = IngressOptions(
        max_body_bytes=app_args.max_body_bytes,
        ready_timeout_s=app_args.ready_timeout_s,
        route_refresh_s=app_args.route_refresh_s,
        limits=app_args.limits,
        graceful_shutdown_timeout_s=app_args.graceful_shutdown_timeout_s,
        log_level=settings.log_level,
        adapter_bases=adapter_bases(engines),
        adapter_s3=adapter_s3(settings),
        disaggregated=disaggregated,
        ingress_replicas=app_args.ingress_replicas,
    )
    ingress = serve.deployment(
        name="OpenAiIngress",
        num_replicas=app_args.ingress_replicas,
        max_ongoing_requests=app_args.ingress_max_ongoing_requests,
        ray_actor_options=_NO_CPU,
        # Ray force-kills a stopping replica after this: leave the drain its grace
        # plus time to end the remaining streams and write their settlements.
        graceful_shutdown_timeout_s=app_args.graceful_shutdown_timeout_s + SETTLE_MARGIN_S,
        graceful_shutdown_wait_loop_s=0.5,
    )(OpenAiIngress)
    gateway = gateway_config(app_args, settings, engines)
    return ingress.bind(router_app, servers, table, options, gateway)
