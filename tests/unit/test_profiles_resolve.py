"""A model's ``profile:`` fills the knobs it leaves unset; its own win; a tuned file's
values sit over the catalogue's; ``routing: off`` keeps the replica router off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.config import ModelSpec
from app.profiles.catalog import CATALOGUE, PROFILES
from app.profiles.resolve import FLAT_KNOBS, PROJECT_ROOT, ProfileRef, apply_profile


def _model(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"id": "m", "engine": "simulated", **fields})


@pytest.mark.parametrize("name", PROFILES)
def test_every_knob_of_the_profile_reaches_the_model(name: str) -> None:
    m = _model(profile=name)
    bundle = CATALOGUE[name]
    for knob in FLAT_KNOBS:
        want = getattr(bundle, knob)
        if want is not None:
            assert getattr(m, knob) == want, knob
    assert m.routing is not None and m.routing.scorers == bundle.routing_scorers
    assert m.profile is not None and m.profile.bundle().slo == bundle.slo


@pytest.mark.parametrize(
    ("fields", "knob", "want"),
    [
        ({"max_num_seqs": 4, "max_ongoing_requests": 4}, "max_num_seqs", 4),
        ({"max_model_len": 1024}, "max_model_len", 1024),
        ({"enable_prefix_caching": True}, "enable_prefix_caching", True),
        ({"max_queued_requests": 3}, "max_queued_requests", 3),
    ],
)
def test_a_knob_set_on_the_model_wins(fields: dict[str, Any], knob: str, want: Any) -> None:
    assert getattr(_model(profile="interactive", **fields), knob) == want


def test_routing_off_and_a_routing_block_without_scorers() -> None:
    assert _model(profile="long_context", routing="off").routing is None
    assert _model(routing="off").routing is None
    partial = _model(profile="long_context", routing={"load": {"abs_threshold": 4}})
    assert partial.routing is not None
    assert partial.routing.scorers == CATALOGUE["long_context"].routing_scorers
    assert partial.routing.load.abs_threshold == 4
    own = _model(profile="long_context", routing={"scorers": {"load": 1.0}})
    assert own.routing is not None and own.routing.scorers == {"load": 1.0}
    assert _model().routing is None  # no profile: Ray's default replica choice


def test_autoscaling_target_and_pd_threshold_fill_only_what_is_unset() -> None:
    scaled = _model(profile="interactive", autoscaling_config={"max_replicas": 3})
    assert scaled.autoscaling_config is not None
    assert scaled.autoscaling_config.target_ongoing_requests == 6
    own = _model(
        profile="interactive",
        autoscaling_config={"max_replicas": 3, "target_ongoing_requests": 2},
    )
    assert own.autoscaling_config is not None
    assert own.autoscaling_config.target_ongoing_requests == 2
    pd = _model(profile="long_context", disaggregation={})
    assert pd.disaggregation is not None and pd.disaggregation.min_uncached_tokens == 1024


def test_a_tuned_file_sits_over_the_catalogue_and_the_slo_override_over_both(
    tmp_path: Path,
) -> None:
    tuned = tmp_path / "interactive-cpu.yaml"
    tuned.write_text(
        yaml.safe_dump(
            {
                "profile": "interactive",
                "max_num_seqs": 6,
                "max_ongoing_requests": 6,
                "slo": {"ttft_p95_ms": 900},
                "measured": {"prefill_tokens_per_s": 4000, "hardware": "2-core CPU"},
            }
        )
    )
    m = _model(profile={"name": "interactive", "file": str(tuned), "slo": {"itl_p95_ms": 80}})
    assert (m.max_num_seqs, m.max_ongoing_requests) == (6, 6)
    assert m.max_num_batched_tokens == CATALOGUE["interactive"].max_num_batched_tokens
    assert m.profile is not None
    bundle = m.profile.bundle()
    assert (bundle.slo.ttft_p95_ms, bundle.slo.itl_p95_ms) == (900, 80)
    assert bundle.measured.prefill_tokens_per_s == 4000


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("fast", "throughput"),  # unknown name: the choices are listed
        ({"name": "interactive", "knob": 1}, "Extra inputs are not permitted"),
        ({"name": "interactive", "file": "/nonexistent/p.yaml"}, "cannot be read"),
    ],
)
def test_bad_profile_references_are_refused(profile: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _model(profile=profile)


def test_a_file_of_another_profile_or_with_an_unknown_knob_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "t.yaml"
    other.write_text(yaml.safe_dump({"profile": "throughput"}))
    with pytest.raises(ValidationError, match="is a 'throughput' profile, not 'interactive'"):
        _model(profile={"name": "interactive", "file": str(other)})
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"profile": "interactive", "max_num_seq": 4}))
    with pytest.raises(ValidationError, match="max_num_seq"):
        _model(profile={"name": "interactive", "file": str(typo)})


def test_apply_profile_leaves_a_model_without_one_alone() -> None:
    data = {"id": "m", "max_num_seqs": 3}
    assert apply_profile(data) is data
    assert ProfileRef.model_validate("throughput").name == "throughput"


@pytest.mark.parametrize(
    ("fields", "router_on"),
    [
        ({}, False),
        ({"num_replicas": 2}, True),  # more than one replica: Switchyard's router
        ({"num_replicas": 2, "routing": "off"}, False),
        ({"autoscaling_config": {"max_replicas": 3}}, True),
        ({"autoscaling_config": {"max_replicas": 1}}, False),
        ({"profile": "throughput"}, True),
        ({"profile": "throughput", "routing": "off"}, False),
    ],
)
def test_who_picks_the_replica(fields: dict[str, Any], router_on: bool) -> None:
    assert (_model(**fields).routing is not None) is router_on


def test_a_knob_in_engine_kwargs_is_the_models_own_and_a_gpu_keeps_its_kv_sizing() -> None:
    m = ModelSpec.model_validate({
        "id": "g", "source": "/m", "accelerator": "L4", "profile": "interactive",
        "engine_kwargs": {"max_model_len": 4096, "gpu_memory_utilization": 0.85},
    })  # fmt: skip
    assert m.max_model_len == 4096
    assert m.kv_cache_memory_bytes is None and m.kv_cache_bytes is None  # vLLM sizes it
    assert _model(profile="interactive").kv_cache_memory_bytes == 1024**3  # CPU: the bundle's


SHIPPED = sorted((PROJECT_ROOT / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_a_shipped_profile_file_is_found_from_any_working_directory(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(path.read_text())
    ref = ProfileRef(name=data["profile"], file=f"profiles/{path.name}")
    bundle = ref.bundle()
    for knob in FLAT_KNOBS:
        if knob in data:
            got = getattr(bundle, knob)
            assert (got.model_dump() if hasattr(got, "model_dump") else got) == data[knob]
    # a file of that name in the working directory wins over the shipped one
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / path.name).write_text(
        yaml.safe_dump({"profile": data["profile"], "max_num_seqs": 3, "max_ongoing_requests": 3})
    )
    assert ProfileRef(name=data["profile"], file=f"profiles/{path.name}").bundle().max_num_seqs == 3


def test_shipped_profile_files_exist() -> None:
    assert {p.name for p in SHIPPED} >= {
        "interactive-cpu.yaml",
        "long_context-cpu.yaml",
        "throughput-cpu.yaml",
    }
