"""``helm/switchyard``: ``helm lint --strict`` passes, and every rendering — the CPU
default, two GPU pools (TP 2 with AWQ, one L4), the seed's practice config — is valid
for Kubernetes, for the KubeRay v1.7.0 CRD and for ``AppArgs``, with Ray's token
authentication on, Ray reachable only as its NetworkPolicies mean it and its dashboard
inside the cluster; values.schema.json refuses what must not deploy. A real Helm
(v3.8.1, extracted by ``make helm``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.builders import route_table
from app.config import AppArgs
from app.routing.spec import RoutesSpec
from tests.k8s_validation import (
    NAMESPACE,
    ROOT,
    Peer,
    admitted,
    dashboard_exposure,
    lockdown_violations,
    parse,
    ray_pods,
    serve_config,
    validate,
)

CHART = ROOT / "helm" / "switchyard"
HELM = Path(sys.executable).with_name("helm")
VALUES = {
    "cpu-default": None,
    "gpu-two-pools": CHART / "ci" / "gpu-two-pools-values.yaml",
    "seed-practice": CHART / "ci" / "seed-practice-values.yaml",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.is_file(), f"{HELM} is missing: run `make helm` (make test does)"
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


def render(values: Path | None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "sy", str(CHART), "--kube-version", "1.33.0", *extra]
    if values is not None:
        args += ["-f", str(values)]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return parse(result.stdout)


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.mark.parametrize("name", list(VALUES))
def test_helm_lint_strict(name: str) -> None:
    values = VALUES[name]
    result = helm("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", list(VALUES))
def test_every_rendering_is_valid(name: str) -> None:
    docs = render(VALUES[name])
    for doc in docs:
        validate(doc)
    kinds = by_kind(docs)
    assert len(kinds["RayService"]) == 1 and "HorizontalPodAutoscaler" not in kinds


def test_two_gpu_pools_get_their_gpus_and_placement() -> None:
    kinds = by_kind(render(VALUES["gpu-two-pools"]))
    (rs,) = kinds["RayService"]
    (args,) = serve_config(rs)
    big, chat, long = args.models
    assert (big.tensor_parallel_size, big.num_gpus, big.quantization) == (2, 2, "awq")
    for small in (chat, long):
        assert (small.accelerator, small.num_gpus) == ("L4", 1)
    # the design card's shape: profiled pools, routed by class, replica router on, and a
    # long-context pool with prefill/decode disaggregation
    assert chat.profile is not None and chat.profile.name == "interactive"
    assert long.profile is not None and long.profile.name == "long_context"
    assert chat.routing is not None and long.routing is not None
    assert long.routing.prefix.mode == "precise" and long.disaggregation is not None
    (cm,) = [c for c in kinds["ConfigMap"] if "routes.yaml" in c["data"]]
    routes = yaml.safe_load(cm["data"]["routes.yaml"])
    assert routes["models"]["llama-8b"]["classes"]["pools"] == {
        "interactive": "chat", "long_context": "long",
    }  # fmt: skip
    table = route_table(
        args.model_copy(update={"routes_file": None, "routes": RoutesSpec.model_validate(routes)})
    )
    assert table.max_model_len("llama-8b") == 32768  # the long-context pool's window
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu-a100", "gpu-l4"}
    gpus = {
        name: g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        for name, g in groups.items()
        if name.startswith("gpu-")
    }
    assert gpus == {"gpu-a100": "2", "gpu-l4": "1"}
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Ingress", "StatefulSet"} <= set(
        kinds
    )
    (ingress,) = kinds["Ingress"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/limit-rps"] == "50"


def test_the_seeds_practice_config_renders_one_to_one() -> None:
    (rs,) = by_kind(render(VALUES["seed-practice"]))["RayService"]
    (args,) = serve_config(rs)
    (m,) = args.models
    assert (m.quantization, m.gpu_memory_utilization, m.max_model_len) == ("awq", 0.85, 4096)
    assert m.autoscaling_config is not None
    assert (m.autoscaling_config.max_replicas, m.autoscaling_config.target_ongoing_requests) == (
        1, 16,
    )  # fmt: skip
    assert m.max_ongoing_requests == 32


def test_a_routes_file_becomes_a_mounted_configmap(tmp_path: Path) -> None:
    routes = {"pools": {"local": {"kind": "local", "model": "smollm2"}},
              "models": {"chat": {"pool": "local"}}}  # fmt: skip
    values = tmp_path / "routes.yaml"
    values.write_text(yaml.safe_dump({"routes": routes}))
    kinds = by_kind(render(None, "-f", str(values)))
    (cm,) = kinds["ConfigMap"]
    assert yaml.safe_load(cm["data"]["routes.yaml"]) == routes
    (rs,) = kinds["RayService"]
    (args,) = serve_config(rs)
    assert isinstance(args, AppArgs) and args.routes_file == "/etc/switchyard/routes.yaml"
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "routes", "mountPath": "/etc/switchyard", "readOnly": True} in head[
        "containers"
    ][0]["volumeMounts"]


def test_s3_model_sources_get_the_endpoint_and_credentials_from_the_secret(
    tmp_path: Path,
) -> None:
    values = tmp_path / "s3.yaml"
    values.write_text(yaml.safe_dump({
        "objectStore": {"endpointUrl": "http://minio.storage:9000", "region": "eu-west-1"},
        "models": [{"id": "q", "source": "s3://models/qwen", "accelerator": "L4"}],
    }))  # fmt: skip
    (rs,) = by_kind(render(None, "-f", str(values)))["RayService"]
    (args,) = serve_config(rs)
    assert args.models[0].source == "s3://models/qwen"
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert env["SWITCHYARD_S3_ENDPOINT_URL"]["value"] == "http://minio.storage:9000"
    assert env["SWITCHYARD_S3_REGION"]["value"] == "eu-west-1"
    secret = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "switchyard-secrets", "key": "aws-secret-access-key",
                      "optional": True}  # fmt: skip
    plain = {
        e["name"]
        for e in by_kind(render(None))["RayService"][0]["spec"]["rayClusterConfig"][
            "headGroupSpec"
        ]["template"]["spec"]["containers"][0]["env"]
    }
    assert "SWITCHYARD_S3_ENDPOINT_URL" not in plain  # unset: AWS S3 itself


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gpuGroups": [{"name": "a", "gpusPerPod": 1, "replicas": 1, "minReplicas": 1,
                         "maxReplicas": 2, "resources": {}, "hpa": {"cpu": 80}}]}, "hpa"),
        ({"models": [{"id": "m", "num_replicas": 2, "autoscaling_config": {"max_replicas": 3}}]},
         "models"),
        ({"redis": {"enabled": False}}, "redis.url is required"),
        ({"image": {"tag": ""}}, "tag"),
        ({"networkPolicy": {"kuberayNamespace": "Ray_System", "ingressNamespace": "x",
                            "monitoringNamespace": "y"}}, "kuberayNamespace"),
    ],
    ids=["no-hpa-on-gpu-replicas", "two-replica-deciders", "redis-url", "image-tag",
         "namespace-name"],
)  # fmt: skip
def test_the_schema_refuses_what_must_not_deploy(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("template", "sy", str(CHART), "--kube-version", "1.33.0", "-f", str(path))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_the_alert_rules_ship_as_a_prometheusrule_unchanged() -> None:
    """The PrometheusRule carries grafana/alerts/switchyard.rules.yaml's groups as they
    are (their ``{{ $value }}`` templates are Prometheus's, not Helm's)."""
    (rule,) = by_kind(render(None, "--set", "monitoring.enabled=true"))["PrometheusRule"]
    rules = yaml.safe_load((ROOT / "grafana" / "alerts" / "switchyard.rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules["groups"]
    assert "PrometheusRule" not in by_kind(render(None))  # monitoring off: none


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar() -> None:
    docs = by_kind(render(None, "--set", "monitoring.enabled=true"))["ConfigMap"]
    (board,) = [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    committed = (ROOT / "grafana" / "dashboards" / "switchyard.json").read_text()
    assert json.loads(board["data"]["switchyard.json"]) == json.loads(committed)


@pytest.mark.parametrize("name", list(VALUES))
def test_ray_is_locked_in_every_rendering(name: str) -> None:
    docs = render(VALUES[name])
    kinds = by_kind(docs)
    (rs,) = kinds["RayService"]
    auth = rs["spec"]["rayClusterConfig"]["authOptions"]
    assert auth == {"mode": "token", "secretName": "switchyard-secrets"}
    assert lockdown_violations(docs, monitoring="PodMonitor" in kinds) == []
    assert dashboard_exposure(docs) == []
    # `helm test`'s pod asks /ready through the serve port, and nothing else
    (test_pod,) = kinds["Pod"]
    tester = Peer(NAMESPACE, test_pod["metadata"]["labels"])
    for group, labels in ray_pods(rs).items():
        assert admitted(docs, NAMESPACE, labels, tester, 8000), group
        assert not admitted(docs, NAMESPACE, labels, tester, 8265), group


def test_the_admitted_namespaces_are_values() -> None:
    docs = render(None, "--set", "networkPolicy.ingressNamespace=traefik",
                  "--set", "networkPolicy.kuberayNamespace=ray-system")  # fmt: skip
    (rs,) = by_kind(docs)["RayService"]
    head = ray_pods(rs)["headgroup"]
    for namespace, labels, port, expected in [
        ("traefik", {}, 8000, True),
        ("ingress-nginx", {}, 8000, False),
        ("ray-system", {"app.kubernetes.io/name": "kuberay-operator"}, 8265, True),
        ("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"}, 8265, False),
    ]:
        assert admitted(docs, NAMESPACE, head, Peer(namespace, labels), port) is expected


# `kubectl create secret generic switchyard-secrets` with its continuation lines
SECRET_COMMAND = r"kubectl create secret generic switchyard-secrets(?:[^\n]*\\\n)*[^\n]*"


def test_the_documented_secret_holds_every_key_the_chart_reads() -> None:
    """docs/deploy.md's `kubectl create secret` gives each key the pods need and Ray's."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    (command,) = re.findall(SECRET_COMMAND, text)
    given = set(re.findall(r"--from-literal=([\w-]+)=", command))
    (rs,) = by_kind(render(None))["RayService"]
    auth = rs["spec"]["rayClusterConfig"]["authOptions"]
    needed = {"auth_token"} if auth["mode"] == "token" else set()  # KubeRay's key
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    for env in head["containers"][0]["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            needed.add(ref["key"])
    assert needed == {"admin-token", "auth_token"} and needed <= given, (needed, given)
