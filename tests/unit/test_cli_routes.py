from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from app.cli.main import app

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "serve_configs" / "routes" / "example.yaml"
LOCAL = ROOT / "serve_configs" / "local.yaml"


def test_the_example_routes_file_checks_against_the_local_config() -> None:
    result = CliRunner().invoke(
        app, ["routes", "check", str(EXAMPLE), "--serve-config", str(LOCAL)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "ok: 2 pools, 2 models, 2 aliases"


def test_a_bad_field_is_named_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "routes.yaml"
    bad.write_text(EXAMPLE.read_text().replace("quality: 0.3", "quality: 3"))
    result = CliRunner().invoke(app, ["routes", "check", str(bad)])
    assert result.exit_code == 1
    assert "models.SmolLM2-135M-Instruct.profile.quality" in result.stderr


def test_local_pools_must_be_served_by_the_config(tmp_path: Path) -> None:
    other = tmp_path / "routes.yaml"
    other.write_text(EXAMPLE.read_text().replace("model: all-MiniLM-L6-v2", "model: nope"))
    result = CliRunner().invoke(
        app, ["routes", "check", str(other), "--serve-config", str(LOCAL)]
    )
    assert result.exit_code == 1 and "pools.minilm.model" in result.stderr


def test_a_stale_measured_quality_is_a_warning_not_an_error(tmp_path: Path) -> None:
    import json

    from app.eval.sets import LAYERS, load

    current = [load(layer).label for layer in LAYERS]
    routes = tmp_path / "routes.yaml"
    routes.write_text(EXAMPLE.read_text().replace("quality: 0.3", "quality: {measured: eval.json}"))

    def check(sets: list[str]) -> object:
        doc = {"meta": {"model": "SmolLM2-135M-Instruct", "date": "2026-12-07", "sets": sets},
               "overall": {"score": 0.25}}  # fmt: skip
        (tmp_path / "eval.json").write_text(json.dumps(doc))
        return CliRunner().invoke(app, ["routes", "check", str(routes)])

    fresh = check(current)
    assert fresh.exit_code == 0 and fresh.stderr == "", fresh.output
    old = check(["general v0 (000000000000)", *current[1:]])
    assert old.exit_code == 0 and old.stdout.strip() == "ok: 2 pools, 2 models, 2 aliases"
    assert "warning: models.SmolLM2-135M-Instruct.profile.quality (eval.json): the eval sets " \
           "changed since (general v0 (000000000000))" in " ".join(old.stderr.split())  # fmt: skip
