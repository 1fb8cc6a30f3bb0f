"""``switchyard adapters add|list|remove`` through typer's CliRunner on a SQLite store,
checked against a serve config's models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from app.cli.main import app
from app.models.tiny import build_tiny_lora
from app.settings import Settings

runner = CliRunner()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, cache_dir=tmp_path, state_url=None)


@pytest.fixture
def config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    model = {"id": "tiny", "source": str(tiny_model_dir), "lora": {"max_lora_rank": 8}}
    doc = {"applications": [{"import_path": "app.builders:build_app", "args": {"models": [model]}}]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def invoke(settings: Settings, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), obj=settings)
    return result.exit_code, result.stdout, result.stderr


def test_add_list_remove(settings: Settings, config: Path, tmp_path: Path) -> None:
    src = build_tiny_lora(tmp_path / "a1", seed=1)
    code, out, err = invoke(settings, "adapters", "add", "a1", "--base", "tiny", "--source",
                            str(src), "--tenant", "acme", "--config", str(config))  # fmt: skip
    assert code == 0, err
    assert out.strip() == "tiny:a1" and "rank 8" in err and "tenant acme" in err
    code, out, _ = invoke(settings, "adapters", "list", "--format", "json")
    (listed,) = json.loads(out)
    assert (listed["id"], listed["tenant"], listed["source"]) == ("tiny:a1", "acme", str(src))
    code, out, _ = invoke(settings, "adapters", "list", "--tenant", "globex", "--format", "json")
    assert json.loads(out) == []
    assert invoke(settings, "adapters", "remove", "tiny:a1")[0] == 0
    code, _, err = invoke(settings, "adapters", "remove", "tiny:a1")
    assert code == 1 and "no adapter 'tiny:a1'" in err


def test_a_rank_above_the_pool_limit_is_refused(
    settings: Settings, config: Path, tmp_path: Path
) -> None:
    src = build_tiny_lora(tmp_path / "big", seed=1, rank=16)
    code, _, err = invoke(settings, "adapters", "add", "big", "--base", "tiny", "--source",
                          str(src), "--config", str(config))  # fmt: skip
    assert code == 1 and "exceeds the pool's max_lora_rank 8" in err


def test_random_writes_an_adapter_the_base_accepts(
    settings: Settings, config: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "demo"
    code, out, err = invoke(settings, "adapters", "random", str(dest), "--base", "tiny",
                            "--config", str(config))  # fmt: skip
    assert code == 0, err
    assert out.strip() == str(dest) and "random rank-8 adapter of tiny" in err
    code, out, err = invoke(settings, "adapters", "add", "demo", "--base", "tiny", "--source",
                            str(dest), "--config", str(config))  # fmt: skip
    assert code == 0, err
    assert out.strip() == "tiny:demo"


def test_random_refuses_a_model_that_is_not_served(
    settings: Settings, config: Path, tmp_path: Path
) -> None:
    code, _, err = invoke(settings, "adapters", "random", str(tmp_path / "x"), "--base", "nope",
                          "--config", str(config))  # fmt: skip
    assert code == 2 and "nope is not a served model" in err
    assert not (tmp_path / "x").exists()
