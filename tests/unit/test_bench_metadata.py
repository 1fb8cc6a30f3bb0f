"""app.bench.metadata: every seed 003 §12 field, git commit detection in a temporary
repository, GPU detection through a fake ``nvidia-smi`` and probes that never fail."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.bench import metadata
from app.bench.metadata import (
    REQUIRED_FIELDS,
    collect_metadata,
    cpu_info,
    git_commit,
    gpu_info,
    ram_info,
)

# Seed 003 §12, "공개 벤치마크 필수 정보" (required information of a public benchmark), verbatim.
SEED_003_BLOCK = """
date:
git_commit:
model_id:
model_revision:
engine:
engine_version:
container_image:
gpu:
gpu_count:
driver:
cuda_or_rocm:
cpu:
ram:
prompt_dataset:
input_length_distribution:
output_length_distribution:
concurrency:
warmup:
duration:
sampling_parameters:
"""
SEED_003_FIELDS = re.findall(r"^(\w+):$", SEED_003_BLOCK, re.MULTILINE)
assert len(SEED_003_FIELDS) == 20


def _collect(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model_info": {"id": "smollm2", "object": "model", "root": "HuggingFaceTB/SmolLM2"},
        "engine": "vllm",
        "engine_version": "0.29.0",
        "dataset": "synthetic mix (seed 7)",
        "input_lengths": "short 64-256, chat 256-1024",
        "output_lengths": "short 32-128, chat 128-512",
        "concurrency": "ramp by rate: 2, 4, 8 req/s",
        "warmup": "10 s per stage",
        "duration": "60 s per stage",
        "sampling": {"temperature": 0.0, "ignore_eos": True},
    }
    return collect_metadata(**(kwargs | overrides))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    (path / "a.txt").write_text("a\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-q", "-m", "one")
    return path


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH without nvidia-smi (git stays reachable)."""
    import shutil

    git = shutil.which("git")
    assert git is not None
    bin_dir = tmp_path / "bin-nogpu"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(git)
    monkeypatch.setenv("PATH", str(bin_dir))


def _fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_required_fields_are_the_seed_list_in_order() -> None:
    assert list(REQUIRED_FIELDS) == SEED_003_FIELDS


def test_collect_returns_every_field_in_order_then_generator(no_gpu: None) -> None:
    meta = _collect()
    assert list(meta)[: len(REQUIRED_FIELDS)] == list(REQUIRED_FIELDS)
    assert list(meta)[-1] == "generator"
    for field in REQUIRED_FIELDS:
        assert meta[field] not in (None, ""), field
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", meta["date"])
    assert meta["model_id"] == "smollm2"
    assert meta["model_revision"] == "HuggingFaceTB/SmolLM2"
    assert (meta["engine"], meta["engine_version"]) == ("vllm", "0.29.0")
    assert meta["prompt_dataset"] == "synthetic mix (seed 7)"
    assert meta["concurrency"] == "ramp by rate: 2, 4, 8 req/s"
    assert meta["sampling_parameters"] == {"temperature": 0.0, "ignore_eos": True}
    assert (meta["gpu"], meta["gpu_count"], meta["driver"], meta["cuda_or_rocm"]) == (
        "none",
        0,
        "none",
        "none",
    )
    json.dumps(meta)  # JSON-able


def test_generator_block_has_no_machine_identity() -> None:
    gen = _collect()["generator"]
    assert gen["tool"] == "switchyard bench"
    assert gen["python"] == platform.python_version()
    assert gen["version"] == "0.1.0"
    assert set(gen) == {"tool", "version", "python", "platform"}
    node = platform.node()
    text = json.dumps(_collect())
    assert "hostname" not in text
    if len(node) >= 6:  # short names could match by chance
        assert node not in text


def test_model_revision_prefers_revision_then_root_else_unknown() -> None:
    meta = _collect(model_info={"id": "m", "root": "org/m", "revision": "3f2a"})
    assert meta["model_revision"] == "3f2a"
    meta = _collect(model_info=None, engine=None, engine_version=None)
    assert (meta["model_id"], meta["model_revision"]) == ("unknown", "unknown")
    assert (meta["engine"], meta["engine_version"]) == ("unknown", "unknown")


def test_container_image_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTAINER_IMAGE", raising=False)
    assert _collect()["container_image"] == "none (bare host)"
    monkeypatch.setenv("CONTAINER_IMAGE", "ghcr.io/x/switchyard:1.2")
    assert _collect()["container_image"] == "ghcr.io/x/switchyard:1.2"


def test_extra_fields_follow_the_required_ones_and_cannot_replace_them() -> None:
    meta = _collect(extra={"base_url": "http://h:8000", "tenant": "t1"})
    keys = list(meta)
    assert keys[len(REQUIRED_FIELDS) : len(REQUIRED_FIELDS) + 2] == ["base_url", "tenant"]
    assert keys[-1] == "generator"
    with pytest.raises(ValueError, match="git_commit"):
        _collect(extra={"git_commit": "forged"})


# ---- git ------------------------------------------------------------------------------


def test_git_commit_clean_dirty_and_outside(repo: Path, tmp_path: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert git_commit(repo) == head
    (repo / "untracked.txt").write_text("x\n")
    assert git_commit(repo) == head + "+dirty"
    (repo / "untracked.txt").unlink()
    (repo / "a.txt").write_text("changed\n")
    assert git_commit(repo) == head + "+dirty"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_commit(outside) == "unknown"


def test_collect_reads_the_current_directory_repo(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    assert _collect()["git_commit"] == _git(repo, "rev-parse", "HEAD")


def test_git_missing_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert git_commit(tmp_path) == "unknown"


# ---- GPU, CPU, RAM --------------------------------------------------------------------


def test_gpu_info_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        'case "$1" in\n'
        '  --query-gpu=*) printf "NVIDIA H200, 570.86.15\\nNVIDIA H200, 570.86.15\\n";;\n'
        '  *) echo "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |";;\n'
        "esac\n",
    )
    assert gpu_info() == {
        "gpu": "NVIDIA H200",
        "gpu_count": 2,
        "driver": "570.86.15",
        "cuda_or_rocm": "CUDA 12.8",
    }
    meta = _collect()
    assert (meta["gpu"], meta["gpu_count"]) == ("NVIDIA H200", 2)


def test_gpu_probe_failures_do_not_propagate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path, monkeypatch, "sleep 5\n")
    monkeypatch.setattr(metadata, "TIMEOUT_S", 0.2)
    assert gpu_info()["gpu_count"] == 0  # timed out
    (tmp_path / "bin" / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
    )
    assert gpu_info() == {"gpu": "none", "gpu_count": 0, "driver": "none", "cuda_or_rocm": "none"}


def test_cpu_and_ram_from_proc_files(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\n")
    assert cpu_info(cpuinfo) == f"AMD EPYC 7B13 ({os.cpu_count()} logical cores)"
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131899068 kB\nMemFree:  1 kB\n")
    assert ram_info(meminfo) == "125.8 GiB"
    assert ram_info(tmp_path / "missing") == "unknown"
    assert cpu_info(tmp_path / "missing").endswith("logical cores)")


def test_real_machine_cpu_and_ram_are_filled() -> None:
    meta = _collect()
    assert re.search(r"\(\d+ logical cores\)$", meta["cpu"])
    if Path("/proc/meminfo").exists():
        assert re.fullmatch(r"\d+\.\d GiB", meta["ram"])
