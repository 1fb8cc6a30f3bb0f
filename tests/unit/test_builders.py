from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.schema import ServeDeploySchema

from app.adapters.registry import AdapterBase
from app.builders import (
    adapter_bases,
    build_app,
    build_application,
    engine_config,
    replica_options,
    resolve_source,
    route_table,
    simulation_profile,
)
from app.config import AppArgs, ModelSpec
from app.engine.factory import SimulatedEngineConfig
from app.engine.vllm_engine import VLLMEngineConfig, engine_args
from app.models.s3 import S3Location
from app.profiles.catalog import CATALOGUE
from app.profiles.resolve import PROJECT_ROOT, load_bundle
from app.routing.table import RouteRequest
from app.settings import Settings


def _settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path, data_dir=tmp_path / "data")


def test_resolve_source_accepts_an_hf_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path), _settings(tmp_path)) == tmp_path


def test_resolve_source_rejects_a_non_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        resolve_source(str(tmp_path / "missing"), _settings(tmp_path))


def test_engine_config_per_engine(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    vllm = engine_config(
        ModelSpec(id="m", source=str(tmp_path), max_model_len=512, kv_cache_memory_bytes=2**26),
        _settings(tmp_path),
    )
    assert isinstance(vllm, VLLMEngineConfig)
    assert (vllm.model_path, vllm.max_model_len, vllm.served_name) == (tmp_path, 512, "m")
    assert vllm.cache_root == tmp_path / "vllm"
    sim = engine_config(
        ModelSpec(id="s", engine="simulated", max_model_len=300), _settings(tmp_path)
    )
    assert isinstance(sim, SimulatedEngineConfig)
    assert sim.profile.max_model_len == 300
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    spec = engine_config(
        ModelSpec(id="d", source=str(tmp_path), speculative_config=ngram), _settings(tmp_path)
    )
    assert isinstance(spec, VLLMEngineConfig) and spec.speculative_config == ngram
    with pytest.raises(ValueError, match="speculative_config needs the vllm engine"):
        ModelSpec(id="x", engine="simulated", speculative_config=ngram)


@pytest.mark.parametrize(
    ("fields", "hourly"),
    [
        ({}, 0.0),
        ({"gpu_hourly_usd": 0.1}, 0.1),  # CPU: one replica's share of its node
        ({"gpu_hourly_usd": 2.5, "accelerator": "H100", "tensor_parallel_size": 2}, 5.0),
        ({"gpu_hourly_usd": 2.5, "accelerator": "L4", "num_gpus": 1}, 2.5),
    ],
)
def test_a_replica_is_priced_at_its_gpus_hourly_price(
    tmp_path: Path, fields: dict[str, object], hourly: float
) -> None:
    (tmp_path / "config.json").write_text("{}")
    for engine in ({"source": str(tmp_path)}, {"engine": "simulated"}):
        if "accelerator" in fields and "engine" in engine:
            continue  # the simulated engine takes no GPU placement
        spec = ModelSpec.model_validate({"id": "m", **engine, **fields})
        assert engine_config(spec, _settings(tmp_path)).hourly_usd == pytest.approx(hourly)


def test_a_lora_block_reaches_the_engine_and_the_adapter_bases(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    lora = {"max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 8}
    spec = ModelSpec.model_validate({"id": "m", "source": str(tmp_path), "lora": lora})
    engines = {
        "m": engine_config(spec, _settings(tmp_path)),
        "plain": engine_config(ModelSpec(id="plain", source=str(tmp_path)), _settings(tmp_path)),
        "sim": engine_config(ModelSpec(id="sim", engine="simulated"), _settings(tmp_path)),
    }
    m = engines["m"]
    assert isinstance(m, VLLMEngineConfig) and m.lora is not None
    assert engine_args(m)["max_lora_rank"] == 8 and engine_args(m)["enable_lora"] is True
    assert "enable_lora" not in engine_args(engines["plain"])  # type: ignore[arg-type]
    bases = adapter_bases(engines)
    assert set(bases) == {"m", "plain"}  # vLLM text models only
    assert bases["m"] == AdapterBase(m.lora, tmp_path) and bases["plain"].lora is None
    for bad in ({"engine": "simulated"}, {"task": "embed", "source": str(tmp_path)}):
        with pytest.raises(ValueError, match="lora needs the vllm engine and task generate"):
            ModelSpec.model_validate({"id": "x", "lora": lora, **bad})


def test_route_table_maps_every_model_to_its_pool() -> None:
    args = AppArgs.model_validate(
        {
            "models": [
                {"id": "a", "engine": "simulated"},
                {"id": "b", "engine": "simulated", "task": "embed"},
            ]
        }
    )
    table = route_table(args)
    assert {r.model: table.deployment(r.pool) for r in table.models()} == {
        "a": "LLMServer-a",
        "b": "LLMServer-b",
    }
    assert [(r.model, r.task) for r in table.models()] == [("a", "generate"), ("b", "embed")]
    assert table.default_model() == "a"


def test_route_table_from_a_routes_file(tmp_path: Path) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        "pools: {main: {kind: local, model: a}}\n"
        "models: {public: {pool: main, profile: {input_per_1m: 2}}}\n"
    )
    args = AppArgs.model_validate(
        {"models": [{"id": "a", "engine": "simulated"}], "routes_file": str(routes)}
    )
    table = route_table(args)
    assert [r.model for r in table.models()] == ["public"]
    assert table.deployment("main") == "LLMServer-a"
    profile = table.profile("public")
    assert profile is not None and profile.price().input == 2e-6
    routes.write_text("pools: {main: {kind: local, model: zz}}\nmodels: {p: {pool: main}}\n")
    with pytest.raises(ValueError, match=r"pools\.main\.model"):
        route_table(args)


def test_build_app_binds_the_three_deployments(tmp_path: Path) -> None:
    args = AppArgs.model_validate(
        {
            "models": [
                {"id": "a", "engine": "simulated", "pricing": {"input_per_1m": 2.0}},
                {"id": "b", "engine": "simulated"},
            ]
        }
    )
    settings = _settings(tmp_path).model_copy(update={"jwt_jwks": "jwks.json"})
    app = build_application(args, settings)
    ingress = app._bound_deployment
    assert ingress.name == "OpenAiIngress"
    router, servers, table, _, gateway = ingress.init_args
    assert gateway.state_url == f"sqlite:///{tmp_path / 'data' / 'state.db'}"
    assert table.profile("a").price().input == 2.0e-6  # type: ignore[union-attr]
    assert sorted(gateway.tokenizers) == ["a", "b"]
    assert gateway.jwt is not None and gateway.jwt.jwks == "jwks.json"
    assert gateway.admin_token is None
    assert router._bound_deployment.name == "ModelRouter"
    assert sorted(s._bound_deployment.name for s in servers.values()) == [
        "LLMServer-a",
        "LLMServer-b",
    ]
    assert table.version == 1 and table.default_model() == "a"


def test_a_routes_file_absent_here_is_read_by_the_router(tmp_path: Path) -> None:
    """On a cluster the routes file is mounted where the ModelRouter runs: the builder
    passes an absolute path it cannot read on to the router; a relative one it refuses."""
    models = [{"id": "a", "engine": "simulated"}]
    elsewhere = tmp_path / "mounted-on-the-router-node" / "routes.yaml"
    args = AppArgs.model_validate({"models": models, "routes_file": str(elsewhere)})
    app = build_application(args, _settings(tmp_path))
    router, _, table, _, _ = app._bound_deployment.init_args
    assert router._bound_deployment.init_args[1] == str(elsewhere)
    assert [r.model for r in table.models()] == ["a"]  # the default, until the router's
    relative = AppArgs.model_validate({"models": models, "routes_file": "nowhere/routes.yaml"})
    with pytest.raises(ValueError, match="give an absolute path"):
        build_application(relative, _settings(tmp_path))


SERVE_CONFIGS = sorted(Path(__file__).parents[2].joinpath("serve_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=[p.name for p in SERVE_CONFIGS])
def test_serve_configs_import_the_builder_with_valid_args(path: Path) -> None:
    config = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    for app in config.applications:
        assert app.import_path == "app.builders:build_app"
        AppArgs.model_validate(app.args)


def test_ray_calls_build_app_the_way_serve_run_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`serve run CONFIG` calls the builder with the config's args dict only."""
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path))
    app = call_user_app_builder_with_args_if_necessary(
        build_app, {"models": [{"id": "s", "engine": "simulated"}]}
    )
    assert app._bound_deployment.name == "OpenAiIngress"


A100 = {"accelerator_type:A100": 0.001}


@pytest.mark.parametrize(
    ("fields", "options"),
    [
        ({}, {"ray_actor_options": {"num_cpus": 0.0}}),  # the 2-core recipe
        ({"num_cpus": 2}, {"ray_actor_options": {"num_cpus": 2}}),
        ({"accelerator": "A100", "num_cpus": 1},
         {"ray_actor_options": {"num_cpus": 1, "num_gpus": 1, "accelerator_type": "A100"}}),
        ({"accelerator": "A100", "tensor_parallel_size": 2, "num_cpus": 1},
         {"ray_actor_options": {"num_cpus": 1},
          "placement_group_bundles": [{"CPU": 1, "GPU": 1, **A100}, {"GPU": 1, **A100}],
          "placement_group_strategy": "STRICT_PACK"}),
        ({"accelerator": "A100", "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
         {"ray_actor_options": {"num_cpus": 0.0},
          "placement_group_bundles": [{"GPU": 1, **A100}] * 4,
          "placement_group_strategy": "PACK"}),
    ],
    ids=["cpu", "cpu-reserved", "one-gpu", "tp2-one-node", "tp2-pp2-spread"],
)  # fmt: skip
def test_replica_placement(fields: dict[str, object], options: dict[str, object]) -> None:
    spec = ModelSpec.model_validate({"id": "m", "source": "/models/m", **fields})
    assert replica_options(spec) == options


def test_the_llmserver_deployment_carries_the_placement(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    args = AppArgs.model_validate({"models": [
        {"id": "g", "source": str(tmp_path), "accelerator": "L4", "tensor_parallel_size": 2,
         "num_cpus": 1},
    ]})  # fmt: skip
    app = build_application(args, _settings(tmp_path))
    servers = app._bound_deployment.init_args[1]  # OpenAiIngress(router, servers, ...)
    replica = servers["LLMServer-g"]._bound_deployment._replica_config
    assert replica.placement_group_strategy == "STRICT_PACK"
    assert replica.placement_group_bundles == [
        {"CPU": 1, "GPU": 1, "accelerator_type:L4": 0.001},
        {"GPU": 1, "accelerator_type:L4": 0.001},
    ]
    assert replica.ray_actor_options["num_cpus"] == 1


def test_autoscaling_replaces_a_fixed_replica_count(tmp_path: Path) -> None:
    scaling = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}
    args = AppArgs.model_validate(
        {"models": [{"id": "s", "engine": "simulated", "autoscaling_config": scaling}]}
    )
    app = build_application(args, _settings(tmp_path))
    deployment = app._bound_deployment.init_args[1]["LLMServer-s"]._bound_deployment
    auto = deployment._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 4, 16)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"num_replicas": 2, "autoscaling_config": {"max_replicas": 3}}, "both decide"),
        ({"autoscaling_config": {"min_replicas": 3, "max_replicas": 2}}, "above max_replicas"),
        ({"autoscaling_config": {"max_replicas": 2, "initial_replicas": 5}}, "initial_replicas"),
    ],
)
def test_autoscaling_conflicts_are_refused(model: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AppArgs.model_validate({"models": [{"id": "s", "engine": "simulated", **model}]})


def test_a_volume_source_is_resolved_by_the_replica_not_the_builder(tmp_path: Path) -> None:
    """The builder (driver) does not mount the GPU workers' volume: it neither checks the
    path nor gives the ingress a tokenizer for that model."""
    assert resolve_source("volume:/models/qwen", _settings(tmp_path)) == Path("/models/qwen")
    with pytest.raises(ValueError, match="must be absolute"):
        resolve_source("volume:models/qwen", _settings(tmp_path))
    args = AppArgs.model_validate({"models": [
        {"id": "q", "source": "volume:/models/qwen", "accelerator": "L4"},
        {"id": "s", "engine": "simulated"},
    ]})  # fmt: skip
    app = build_application(args, _settings(tmp_path))
    gateway = app._bound_deployment.init_args[4]
    assert set(gateway.tokenizers) == {"s"}


def test_an_s3_source_is_fetched_by_the_replica_into_its_nodes_cache(tmp_path: Path) -> None:
    """The builder neither lists nor downloads an s3:// source: the engine config names
    the URL, the settings' endpoint and region, and this node's cache directory for it."""
    settings = _settings(tmp_path).model_copy(
        update={"s3_endpoint_url": "http://127.0.0.1:9", "s3_region": "eu-west-1"}
    )
    args = AppArgs.model_validate({"models": [
        {"id": "q", "source": "s3://models/team/qwen", "accelerator": "L4"},
        {"id": "s", "engine": "simulated"},
    ]})  # fmt: skip
    app = build_application(args, settings)
    _, servers, _, _, gateway = app._bound_deployment.init_args
    (config,) = servers["LLMServer-q"]._bound_deployment.init_args
    assert config.s3 is not None
    assert (config.s3.url, config.s3.endpoint_url, config.s3.region) == (
        "s3://models/team/qwen", "http://127.0.0.1:9", "eu-west-1",
    )  # fmt: skip
    location = S3Location.parse("s3://models/team/qwen", "http://127.0.0.1:9")
    assert config.model_path == location.cache_dir(settings.models_dir)  # what the fetch fills
    assert config.model_path.name.startswith("qwen-") and not config.model_path.exists()
    assert set(gateway.tokenizers) == {"s"}
    with pytest.raises(ValueError, match="s3://BUCKET/PREFIX"):
        AppArgs.model_validate({"models": [{"id": "q", "source": "s3://models"}]})


@pytest.mark.parametrize(("mode", "publish"), [("approximate", False), ("precise", True)])
def test_a_routed_pool_gets_our_router_and_precise_mode_makes_engines_publish(
    tmp_path: Path, mode: str, publish: bool
) -> None:
    routing = {"prefix": {"mode": mode, "block_size": 128}}
    args = AppArgs.model_validate(
        {"models": [{"id": "s", "engine": "simulated", "num_replicas": 2, "routing": routing}]}
    )
    app = build_application(args, _settings(tmp_path))
    bound = app._bound_deployment.init_args[1]["LLMServer-s"]._bound_deployment
    router = bound._deployment_config.request_router_config
    assert router.request_router_class == "app.scheduler.ray_router:SwitchyardRouter"
    assert router.request_router_kwargs["prefix"]["mode"] == mode
    assert router.request_routing_stats_period_s == 2.0
    assert bound.init_args[0].publish_kv_events is publish


def test_a_disaggregated_model_gets_a_prefill_deployment_and_a_connector(
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    args = AppArgs.model_validate(
        {
            "models": [
                {
                    "id": "pd",
                    "source": str(model_dir),
                    "num_replicas": 2,
                    "max_num_seqs": 8,
                    "routing": {},
                    "disaggregation": {
                        "prefill": {"num_replicas": 3, "max_num_seqs": 2},
                        "min_uncached_tokens": 256,
                    },
                },
                {"id": "plain", "engine": "simulated"},
            ]
        }
    )
    app = build_application(args, _settings(tmp_path))
    _, servers, _, options, _ = app._bound_deployment.init_args
    assert sorted(servers) == ["LLMServer-pd", "LLMServer-pd-prefill", "LLMServer-plain"]
    decode = servers["LLMServer-pd"]._bound_deployment
    prefill = servers["LLMServer-pd-prefill"]._bound_deployment
    assert decode._deployment_config.num_replicas == 2
    assert prefill._deployment_config.num_replicas == 3
    router = prefill._deployment_config.request_router_config
    assert router.request_router_class == "app.scheduler.ray_router:SwitchyardRouter"
    assert router.request_router_kwargs["scorers"] == {"prefix": 2.0, "load": 1.0}
    d_engine, p_engine = decode.init_args[0], prefill.init_args[0]
    assert (d_engine.pd_role, p_engine.pd_role) == ("decode", "prefill")
    assert (d_engine.max_num_seqs, p_engine.max_num_seqs) == (8, 2)
    assert d_engine.kv_connector == p_engine.kv_connector is not None
    kv = engine_args(d_engine)["kv_transfer_config"]
    assert (kv.kv_connector, kv.kv_role, kv.kv_buffer_device) == ("NixlConnector", "kv_both", "cpu")
    assert kv.kv_load_failure_policy == "fail"
    assert kv.kv_connector_extra_config == {"kv_lease_duration": 30}
    assert "kv_transfer_config" not in engine_args(
        d_engine.model_copy(update={"kv_connector": None})
    )
    pool = options.disaggregated["LLMServer-pd"]
    assert (pool.decode, pool.prefill) == ("LLMServer-pd", "LLMServer-pd-prefill")
    assert pool.settings.min_uncached_tokens == 256 and pool.decode_routing is not None
    assert list(options.disaggregated) == ["LLMServer-pd"]


def test_a_disaggregated_simulated_model_turns_on_the_simulated_hand_off(tmp_path: Path) -> None:
    spec = ModelSpec(id="s", engine="simulated", disaggregation={})  # type: ignore[arg-type]
    config = engine_config(spec, _settings(tmp_path))
    assert isinstance(config, SimulatedEngineConfig) and config.profile.kv_connector


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"id": "e", "engine": "simulated", "task": "embed", "disaggregation": {}},
            "task generate",
        ),
        (
            {"id": "l", "source": "embedded:tiny-llama", "lora": {}, "disaggregation": {}},
            "LoRA adapters is not supported",
        ),
        ({"id": "x", "engine": "simulated", "disaggregation": {"modes": "auto"}}, "modes"),
    ],
)
def test_disaggregation_conflicts_are_refused(model: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec.model_validate(model)


def test_a_profiled_pool_gets_its_backpressure_router_and_metadata(tmp_path: Path) -> None:
    args = AppArgs.model_validate(
        {"models": [{"id": "i", "engine": "simulated", "profile": "interactive"},
                    {"id": "plain", "engine": "simulated"}]}
    )  # fmt: skip
    app = build_application(args, _settings(tmp_path))
    servers = app._bound_deployment.init_args[1]
    config = servers["LLMServer-i"]._bound_deployment._deployment_config
    assert (config.backpressure_config.status_code, config.backpressure_config.retry_after_s) == (
        503, 1.0,
    )  # fmt: skip
    assert (config.max_ongoing_requests, config.max_queued_requests) == (8, 16)
    assert config.request_router_config.request_router_class.endswith("SwitchyardRouter")
    plain = servers["LLMServer-plain"]._bound_deployment._deployment_config
    assert plain.backpressure_config.retry_after_s is None  # Ray's default
    assert "SwitchyardRouter" not in plain.request_router_config.request_router_class
    table = route_table(args)
    rows = {r.model: r for r in table.models()}
    assert rows["i"].profile == "interactive"
    assert rows["i"].slo == {"ttft_p95_ms": 1500, "itl_p95_ms": 150}
    assert rows["plain"].profile is None


def test_a_kv_budget_the_models_config_cannot_hold_fails_the_build(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
              "hidden_size": 576, "max_position_embeddings": 8192}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    # float32: 46,080 B/token; 1 GiB holds 23,296 tokens < 16 × 2,048
    spec = ModelSpec(
        id="m", source=str(tmp_path), dtype="float32", profile="interactive", max_num_seqs=16,
        max_ongoing_requests=16,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"model 'm': max_num_seqs: 16 sequences .* would preempt"):
        engine_config(spec, _settings(tmp_path))
    fits = spec.model_copy(update={"dtype": "bfloat16"})
    assert isinstance(engine_config(fits, _settings(tmp_path)), VLLMEngineConfig)


@pytest.mark.parametrize(
    ("model", "want"),
    [
        # no profile, no own knobs: the simulation's defaults, the model's window
        ({"max_model_len": 512}, {"max_model_len": 512, "max_batch_size": 32,
                                  "max_prefill_tokens_per_step": None}),
        # a profile's batch, prefill budget and KV budget (2 GiB / 46,080 B = 46,603 tokens)
        ({"profile": "long_context"}, {"max_model_len": 8192, "max_batch_size": 16,
                                       "max_prefill_tokens_per_step": 2048,
                                       "kv_capacity_tokens": 46603}),
        # the simulation block's own values win
        ({"profile": "interactive", "simulation": {"max_batch_size": 3}},
         {"max_batch_size": 3, "max_prefill_tokens_per_step": 512}),
    ],
)  # fmt: skip
def test_the_simulated_engine_takes_the_models_knobs(
    model: dict[str, object], want: dict[str, object]
) -> None:
    profile = simulation_profile(ModelSpec.model_validate({"id": "s", "engine": "simulated",
                                                           **model}))  # fmt: skip
    assert {k: getattr(profile, k) for k in want} == want


def test_the_pool_config_turns_the_pool_features_on() -> None:
    path = Path(__file__).parents[2] / "serve_configs" / "pool.yaml"
    args = AppArgs.model_validate(yaml.safe_load(path.read_text())["applications"][0]["args"])
    models = {m.id: m for m in args.models}
    chat, long = models["smol-chat"], models["smol-long"]
    assert chat.profile is not None and chat.profile.name == "interactive"
    assert long.profile is not None and long.profile.name == "long_context"
    assert long.num_replicas == 2 and long.routing is not None
    # the CPU measurement's file over the catalogue (profiles/long_context-cpu.yaml)
    catalogue = CATALOGUE["long_context"].long_prefill_token_threshold
    assert long.long_prefill_token_threshold == 128 != catalogue
    assert chat.profile.file == "profiles/interactive-cpu.yaml"
    assert chat.max_num_seqs == load_bundle(PROJECT_ROOT / chat.profile.file).max_num_seqs
    assert long.routing.prefix.mode == "precise"
    assert long.routing.scorers["prefix"] > long.routing.scorers["load"]  # prefix-heavy
    assert chat.routing is not None
    assert chat.routing.scorers["load"] > chat.routing.scorers["prefix"]  # load-heavy
    table = route_table(args)
    decide = table.decide
    long_prompt = decide(RouteRequest("SmolLM2-135M-Instruct", prompt_tokens=3000, max_tokens=64))
    short = decide(RouteRequest("SmolLM2-135M-Instruct", prompt_tokens=30, max_tokens=64,
                                stream=True))  # fmt: skip
    assert long_prompt is not None and (long_prompt.pool, long_prompt.profile) == (
        "long", "long_context",
    )  # fmt: skip
    assert short is not None and (short.pool, short.profile) == ("chat", "interactive")
    assert table.max_model_len("SmolLM2-135M-Instruct") == 8192
