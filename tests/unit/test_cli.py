"""Tests for the ``switchyard`` CLI (typer's CliRunner, real model preparation)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app, main
from app.models.store import MANIFEST_NAME, Manifest
from app.settings import Settings

runner = CliRunner()


def invoke(settings: Settings, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), obj=settings)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache")


def test_prepare_prints_name_path_and_checksum(settings: Settings) -> None:
    code, out, _ = invoke(settings, "models", "prepare", "minilm")
    assert code == 0
    path = settings.models_dir / "minilm"
    manifest = Manifest.from_json((path / MANIFEST_NAME).read_text())
    assert manifest is not None
    assert out == f"minilm\t{path}\tsha256:{manifest.sha256}\n"


def test_prepare_twice_gives_the_same_line(settings: Settings) -> None:
    first = invoke(settings, "models", "prepare", "minilm", "minilm")
    second = invoke(settings, "models", "prepare", "minilm", "--verify")
    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    assert first[1].count("\n") == 1  # a repeated name is prepared once


def test_cache_dir_option_overrides_settings(settings: Settings, tmp_path: Path) -> None:
    code, out, _ = invoke(settings, "models", "prepare", "minilm", "--cache-dir", str(tmp_path))
    assert code == 0
    assert out.split("\t")[1] == str(tmp_path / "models" / "minilm")
    assert not settings.models_dir.exists()


def test_path_prints_only_the_path(settings: Settings) -> None:
    assert invoke(settings, "models", "prepare", "minilm")[0] == 0
    code, out, err = invoke(settings, "models", "path", "minilm")
    assert (code, out, err) == (0, f"{settings.models_dir / 'minilm'}\n", "")


def test_path_of_an_unprepared_model_fails_with_the_fix(settings: Settings) -> None:
    code, out, err = invoke(settings, "models", "path", "smollm2")
    assert code == 1
    assert out == ""
    assert "switchyard models prepare smollm2" in err


def list_rows(settings: Settings) -> dict[str, list[str]]:
    code, out, _ = invoke(settings, "models", "list")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "STATE", "SERVED", "AS", "SHA256", "PATH"]
    return {line.split()[0]: line.split() for line in lines}


def test_list_shows_state_of_every_model(settings: Settings) -> None:
    assert invoke(settings, "models", "prepare", "minilm")[0] == 0
    rows = list_rows(settings)
    assert rows["minilm"][1] == "ready"
    assert rows["minilm"][-1] == str(settings.models_dir / "minilm")
    assert rows["smollm2"][1:3] == ["missing", "SmolLM2-135M-Instruct"]

    (settings.models_dir / "minilm" / "vocab.txt").write_text("damaged")
    assert list_rows(settings)["minilm"][1] == "invalid"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("models", "prepare", "gpt-5"), id="unknown-name"),
        pytest.param(("models", "prepare", "minilm", "--all"), id="names-and-all"),
        pytest.param(("models", "path", "gpt-5"), id="unknown-path"),
        pytest.param(("models", "fetch", "s3://bucket-only"), id="s3-without-prefix"),
    ],
)
def test_bad_arguments_are_usage_errors(settings: Settings, args: tuple[str, ...]) -> None:
    code, out, _ = invoke(settings, *args)
    assert code == 2
    assert out == ""
    assert not settings.models_dir.exists()


def test_settings_come_from_the_environment_when_not_given(tmp_path: Path) -> None:
    result = runner.invoke(app, ["models", "list"], env={"SWITCHYARD_CACHE_DIR": str(tmp_path)})
    assert result.exit_code == 0
    assert str(tmp_path / "models" / "minilm") in result.stdout


def test_main_is_the_console_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["switchyard", "models", "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0


def test_fetch_downloads_an_s3_model_once_into_the_cache(
    settings: Settings, tmp_path: Path, s3_endpoint: str
) -> None:
    from tests.s3_server import upload_folder

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.bin").write_bytes(b"w" * 5000)
    upload_folder(s3_endpoint, model, "cli-models", "m")
    settings = settings.model_copy(update={"s3_endpoint_url": s3_endpoint})
    code, out, err = invoke(settings, "models", "fetch", "s3://cli-models/m")
    assert code == 0 and "downloaded" in err
    dest = Path(out.strip())
    assert dest.parent == settings.models_dir / "s3"
    assert (dest / "weights.bin").read_bytes() == b"w" * 5000
    code, out2, err = invoke(settings, "models", "fetch", "s3://cli-models/m", "--verify")
    assert (code, out2) == (0, out) and "already on this node" in err
    code, _, err = invoke(settings, "models", "fetch", "s3://cli-models/absent")
    assert code == 1 and "no config.json" in err


def test_quantize_writes_the_directory_and_prints_it(
    settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "tiny-w8a8"
    code, out, err = invoke(settings, "models", "quantize", str(tiny_model_dir), str(dest))
    assert code == 0, err
    assert out.strip() == str(dest)
    assert '"int-quantized"' in (dest / "config.json").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--scheme", "int3"), "w8a8, w4a16"),
        (("--scheme", "w4a16", "--group-size", "48"), "not a multiple of group"),
    ],
)
def test_quantize_refuses_with_the_reason(
    settings: Settings, tiny_model_dir: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    code, _, err = invoke(settings, "models", "quantize", str(tiny_model_dir),
                          str(tmp_path / "q"), *args)  # fmt: skip
    assert code != 0 and message in " ".join(err.split())


def test_quantize_an_unprepared_embedded_model_says_how(
    settings: Settings, tmp_path: Path
) -> None:
    code, _, err = invoke(settings, "models", "quantize", "smollm2", str(tmp_path / "q"))
    assert code != 0 and "switchyard models prepare smollm2" in " ".join(err.split())
