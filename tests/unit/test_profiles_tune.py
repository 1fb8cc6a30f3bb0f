"""``switchyard profile tune``: the selection rule on hand-made curves (app.profiles.tune),
one real tune on the simulated engine through the CLI (a profile file the loader and the
checks take, a curve of the expected shape, the report), and the CLI's argument errors.
No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from app.cli.main import app
from app.cli.profile import parse_knob, parse_slo
from app.config import ModelSpec
from app.models.kv_budget import kv_shape
from app.profiles.catalog import CATALOGUE, Bundle, ProfileName, Slo
from app.profiles.checks import kv_refusals, refusals
from app.profiles.resolve import load_bundle
from app.profiles.tune import (
    NoSettingMeetsSlo,
    Point,
    Quantiles,
    best_points,
    choose,
    concurrencies,
    sweep_values,
    tuned_bundle,
    violations,
)
from app.settings import Settings
from tests.unit.test_profiles_checks import SMOL  # SmolLM2-135M's shape, for the KV checks

RUNNER = CliRunner()
SLO = Slo(ttft_p95_ms=1500, itl_p95_ms=150)


def pt(
    value: int,
    c: int,
    goodput: float,
    ttft: float = 500,
    itl: float = 50,
    errors: float = 0.0,
    batch: int | None = None,
) -> Point:
    """A point at knob value ``value`` (also the batch unless ``batch``), concurrency ``c``."""
    return Point(
        value=value,
        max_num_seqs=batch or value,
        concurrency=c,
        requests=100,
        goodput=goodput,
        output_tokens_per_s=goodput * 100,
        error_rate=errors,
        ttft_ms=Quantiles(p50=ttft / 2, p95=ttft, p99=ttft * 1.2),
        itl_ms=Quantiles(p50=itl / 2, p95=itl, p99=itl * 1.2),
        prefill_tokens_per_s=2000.0 if c == 1 else None,
    )


# ---- the rule ---------------------------------------------------------------------

BROKEN = {"ttft": 2500.0}  # breaks the TTFT SLO of 1,500 ms

CASES: list[tuple[str, ProfileName, list[Point], tuple[int, int]]] = [
    (
        "raising the batch pays until p95 breaks: the last good setting is kept",
        "interactive",
        [
            pt(4, 1, 1),
            pt(4, 4, 3),
            pt(8, 1, 1),
            pt(8, 8, 5),
            pt(16, 1, 1),
            pt(16, 16, 7),
            pt(32, 1, 1),
            pt(32, 32, 12, **BROKEN),
            pt(32, 16, 9, itl=400),
        ],
        (16, 16),
    ),
    (
        "a setting breaking the SLO at every point is never chosen, whatever its goodput",
        "interactive",
        [pt(4, 1, 1), pt(4, 4, 3), pt(64, 1, 50, **BROKEN), pt(64, 64, 90, **BROKEN)],
        (4, 4),
    ),
    (
        "an error rate over the budget breaks the SLO",
        "interactive",
        [pt(4, 4, 3), pt(8, 8, 6, errors=0.05)],
        (4, 4),
    ),
    (
        "equal goodput: the smaller value (less memory)",
        "interactive",
        [pt(8, 8, 5), pt(16, 16, 5), pt(32, 16, 5, batch=32)],
        (8, 8),
    ),
    (
        "within the tie tolerance (2%): the smaller value",
        "interactive",
        [pt(8, 8, 5.0), pt(16, 16, 5.05)],
        (8, 8),
    ),
    (
        "beyond the tie tolerance: the higher goodput",
        "interactive",
        [pt(8, 8, 5.0), pt(16, 16, 6.0)],
        (16, 16),
    ),
    (
        "a setting's best point is its highest-goodput concurrency meeting the SLO",
        "long_context",
        [pt(8, 1, 1), pt(8, 4, 4), pt(8, 8, 3.5), pt(8, 12, 3, **BROKEN)],
        (8, 4),
    ),
    (
        "interactive: a concurrency above max_num_seqs is no candidate",
        "interactive",
        [pt(8, 8, 4), pt(8, 12, 6)],
        (8, 8),
    ),
    (
        "throughput: a concurrency below max_num_seqs is no candidate",
        "throughput",
        [pt(8, 4, 9), pt(8, 8, 6), pt(8, 12, 7)],
        (8, 12),
    ),
]


@pytest.mark.parametrize(
    ("profile", "curve", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_rule_chooses_the_best_good_setting(
    profile: ProfileName, curve: list[Point], expected: tuple[int, int]
) -> None:
    chosen = choose(curve, SLO, profile)
    assert (chosen.value, chosen.concurrency) == expected


def test_a_broken_setting_has_no_best_point() -> None:
    curve = [pt(4, 4, 3), pt(8, 1, 2, **BROKEN), pt(8, 8, 9, itl=300)]
    best = best_points(curve, SLO, "interactive")
    assert best[8] is None and best[4] == curve[0]
    assert violations(curve[2], SLO) == ["ITL p95 300 ms > 150 ms"]


def test_nothing_meeting_the_slo_is_an_error_naming_it_and_the_best_p95_seen() -> None:
    curve = [
        pt(4, 1, 0, ttft=1800, itl=210),
        pt(4, 4, 0, ttft=2600, itl=180),
        pt(8, 8, 0, **BROKEN),
    ]
    with pytest.raises(NoSettingMeetsSlo) as caught:
        choose(curve, SLO, "interactive")
    message = str(caught.value)
    assert "ttft_p95_ms=1500,itl_p95_ms=150" in message
    assert "TTFT p95 1800 ms (max_num_seqs=4, concurrency 1)" in message
    assert "ITL p95 50 ms (max_num_seqs=8, concurrency 8)" in message


def test_points_meeting_the_slo_only_where_the_checks_refuse_are_named() -> None:
    with pytest.raises(NoSettingMeetsSlo, match="throughput pool's checks refuse"):
        choose([pt(8, 1, 2), pt(8, 8, 6, **BROKEN)], SLO, "throughput")
    with pytest.raises(NoSettingMeetsSlo, match="nothing was measured"):
        choose([], SLO, "throughput")


@pytest.mark.parametrize(
    ("batch", "factors", "expected"),
    [(8, (0.5, 1.0, 1.5), [1, 4, 8, 12]), (1, (0.5, 1.0, 1.5), [1, 2]), (64, (1.0,), [1, 64])],
)
def test_concurrencies_are_relative_to_the_batch(
    batch: int, factors: tuple[float, ...], expected: list[int]
) -> None:
    assert concurrencies(batch, factors) == expected


def test_the_sweep_includes_the_profiles_own_value() -> None:
    assert sweep_values("max_num_seqs", 12, [4, 16]) == [4, 12, 16]
    assert sweep_values("max_num_seqs", 8) == [4, 8, 16, 32, 64]


def test_the_tuned_bundle_passes_the_loader_and_the_checks(tmp_path: Path) -> None:
    curve = [pt(4, 1, 1), pt(4, 4, 3), pt(8, 1, 1), pt(8, 4, 4), pt(8, 8, 6)]
    chosen = choose(curve, SLO, "interactive")
    bundle = tuned_bundle("interactive", SLO, "max_num_seqs", chosen, curve, "test CPU")
    assert (bundle.max_num_seqs, bundle.max_ongoing_requests) == (8, 8)
    assert bundle.target_ongoing_requests == 6  # the catalogue's 6/8 of it
    assert bundle.measured.prefill_tokens_per_s == 2000 and bundle.slo == SLO
    assert bundle.max_num_batched_tokens == CATALOGUE["interactive"].max_num_batched_tokens
    _assert_loadable(_write(tmp_path / "i.yaml", bundle), "interactive")


def _write(path: Path, bundle: Bundle) -> Path:
    path.write_text(yaml.safe_dump(bundle.model_dump(mode="json", exclude_none=True)))
    return path


def _assert_loadable(path: Path, profile: str) -> ModelSpec:
    assert load_bundle(path).profile == profile
    model = ModelSpec(id="m", engine="simulated", profile={"name": profile, "file": str(path)})
    assert refusals(model) == []
    assert kv_refusals(model, kv_shape(SMOL, "float32"), 8192) == []
    return model


# ---- end to end on the simulated engine, through the CLI --------------------------


def test_a_tune_on_the_simulated_engine_writes_a_loadable_profile_and_a_report(
    tmp_path: Path, settings: Settings
) -> None:
    out, reports = tmp_path / "profiles" / "interactive-sim.yaml", tmp_path / "reports"
    args = [
        "profile",
        "tune",
        "--profile",
        "interactive",
        "--engine",
        "simulated",
        "--slo",
        "ttft_p95_ms=5000,itl_p95_ms=2000",
        "--knob",
        "max_num_seqs=4,8",
        "--concurrency",
        "1",
        "--duration-s",
        "3",
        "--warmup-s",
        "1",
        "--input-tokens",
        "64",
        "--output-tokens",
        "8",
        "--out",
        str(out),
        "--report-dir",
        str(reports),
    ]
    result = RUNNER.invoke(app, args, obj=settings)
    assert result.exit_code == 0, result.output
    stem = reports / "profile-tune-interactive-sim"
    written = [Path(line) for line in result.stdout.split()]
    assert written == [
        out,
        stem.with_suffix(".json"),
        stem.with_suffix(".md"),
        stem.with_suffix(".png"),
    ]
    assert all(p.stat().st_size > 0 for p in written)
    assert result.stderr.count(" c=") == 4  # one progress line per point

    report: dict[str, Any] = json.loads(stem.with_suffix(".json").read_text())
    points = [Point.model_validate(p) for p in report["curve"]]
    assert [(p.value, p.concurrency) for p in points] == [(4, 1), (4, 4), (8, 1), (8, 8)]
    assert all(p.goodput > 0 and p.error_rate == 0 for p in points if p.concurrency == 1)
    assert all(p.ttft_ms.p95 and p.itl_ms.p95 and p.output_tokens_per_s > 0 for p in points)

    model = _assert_loadable(out, "interactive")
    bundle = load_bundle(out)
    chosen = Point.model_validate(report["chosen"])
    assert bundle.max_num_seqs == chosen.value in (4, 8)
    assert model.max_num_seqs == chosen.value
    assert bundle.max_ongoing_requests == chosen.concurrency <= chosen.value
    assert bundle.slo == Slo(ttft_p95_ms=5000, itl_p95_ms=2000)
    assert bundle.measured.prefill_tokens_per_s and bundle.measured.prefill_tokens_per_s > 0
    assert bundle.measured.hardware and "simulat" in bundle.measured.hardware
    markdown = stem.with_suffix(".md").read_text()
    for text in (
        "## Rule",
        "## Curve",
        "git_commit",
        "switchyard profile tune --profile "
        "interactive --slo ttft_p95_ms=5000,itl_p95_ms=2000 --engine simulated",
    ):
        assert text in markdown

    shown = RUNNER.invoke(app, ["profile", "show", str(out)], obj=settings)
    assert shown.exit_code == 0, shown.output
    assert yaml.safe_load(shown.stdout)["max_num_seqs"] == chosen.value


# ---- the CLI's arguments ----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--slo", "ttft_p95_ms=fast"], "is not a number"),
        (["--slo", "latency=100"], "KEY=MS"),
        (["--slo", "ttft_p95_ms=-5"], "must be > 0"),
        (["--slo", ","], "at least one"),
        (["--knob", "gpu_memory=1,2"], "one of max_num_seqs"),
        (["--knob", "max_num_seqs=4,x"], "whole numbers"),
        (["--concurrency", "0,1"], "positive numbers"),
        (["--set", "nofield"], "FIELD=VALUE"),
        (["--engine", "tgi"], "vllm or simulated"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    extra: list[str], message: str, settings: Settings
) -> None:
    args = ["profile", "tune", "--profile", "interactive", "--engine", "simulated", *extra]
    result = RUNNER.invoke(app, args, obj=settings)
    assert result.exit_code == 2
    assert message in result.output


def test_an_unknown_profile_exits_2(settings: Settings) -> None:
    result = RUNNER.invoke(app, ["profile", "tune", "--profile", "fast"], obj=settings)
    assert result.exit_code == 2 and "interactive" in result.output


def test_the_parsers() -> None:
    assert parse_slo("ttft=800, e2e_p95_ms=9000") == Slo(ttft_p95_ms=800, e2e_p95_ms=9000)
    assert parse_knob("max_num_batched_tokens=256,512") == ("max_num_batched_tokens", [256, 512])
    assert parse_knob("max_num_seqs") == ("max_num_seqs", None)


def test_show_prints_a_catalogue_profile_or_refuses_an_unknown_one(
    tmp_path: Path, settings: Settings
) -> None:
    shown = RUNNER.invoke(app, ["profile", "show", "long_context"], obj=settings)
    assert shown.exit_code == 0
    assert Bundle.model_validate(yaml.safe_load(shown.stdout)) == CATALOGUE["long_context"]
    missing = RUNNER.invoke(app, ["profile", "show", str(tmp_path / "nope.yaml")], obj=settings)
    assert missing.exit_code == 2 and "cannot be read" in missing.output


@pytest.mark.parametrize(
    ("rate", "ttft_ms", "seqs", "want_step", "want_threshold"),
    [
        (130.0, 1500, 4, 192, 192),  # a slow CPU: 512 tokens would take 3.9 s
        (2000.0, 1500, 8, 512, 256),  # fast enough: the catalogue's step stays
        (10.0, 1500, 8, 8, 8),  # never below the batch (8 tokens at 10/s still fit 1.5 s)
    ],
)
def test_an_interactive_step_budget_is_held_to_the_ttft_slo(
    rate: float, ttft_ms: float, seqs: int, want_step: int, want_threshold: int, tmp_path: Path
) -> None:
    chosen = pt(seqs, 1, 1.0).model_copy(update={"prefill_tokens_per_s": rate})
    slo = Slo(ttft_p95_ms=ttft_ms, itl_p95_ms=150)
    bundle = tuned_bundle("interactive", slo, "max_num_seqs", chosen, [chosen], "cpu")
    assert bundle.max_num_batched_tokens == want_step
    assert bundle.long_prefill_token_threshold == want_threshold
    _assert_loadable(_write(tmp_path / "i.yaml", bundle), "interactive")  # the checks pass


def test_a_throughput_step_budget_is_not_capped() -> None:
    chosen = pt(32, 1, 1.0).model_copy(update={"prefill_tokens_per_s": 10.0})
    bundle = tuned_bundle("throughput", Slo(ttft_p95_ms=100), "max_num_seqs", chosen, [chosen], "x")
    assert bundle.max_num_batched_tokens == CATALOGUE["throughput"].max_num_batched_tokens
