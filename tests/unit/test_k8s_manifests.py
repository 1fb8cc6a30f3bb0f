"""``k8s/``: every manifest is valid for Kubernetes (core kinds against the Kubernetes
schemas, RayService against the vendored KubeRay v1.7.0 CRD), and every serveConfigV2
is a Serve config whose applications build with the real ``AppArgs`` — so a manifest
that would fail at deploy time fails here, without a cluster."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.k8s_validation import K8S, KUBERNETES, documents, serve_config, validate

MANIFESTS = [(p.name, i, d) for p in sorted(K8S.glob("*.yaml")) for i, d in enumerate(documents(p))]


@pytest.mark.parametrize(
    ("name", "index", "doc"), MANIFESTS, ids=[f"{n}#{i}" for n, i, _ in MANIFESTS]
)
def test_every_manifest_is_valid(name: str, index: int, doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_gpu_rayservice_places_llmservers_on_gpus() -> None:
    (doc,) = documents(K8S / "rayservice-gpu.yaml")
    (args,) = serve_config(doc)
    (model,) = args.models
    assert (model.accelerator, model.num_gpus, model.quantization) == ("L4", 1, "awq")
    assert model.autoscaling_config is not None and model.autoscaling_config.max_replicas == 4
    groups = {g["groupName"]: g for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    gpu = groups["gpu-l4"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert doc["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    env = {e["name"] for e in gpu["containers"][0]["env"]}
    assert {"SWITCHYARD_STATE_URL", "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"} <= env


def test_no_autoscaler_but_rays_acts_on_the_replicas() -> None:
    kinds = {d["kind"] for _, _, d in MANIFESTS}
    assert "HorizontalPodAutoscaler" not in kinds


def _broken(mutate: Any) -> dict[str, Any]:
    (doc,) = documents(K8S / "rayservice-gpu.yaml")
    doc = copy.deepcopy(doc)
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda d: d["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].pop("groupName"),
         jsonschema.ValidationError),
        (lambda d: d["spec"]["rayClusterConfig"].update(enableInTreeAutoscaling="yes"),
         jsonschema.ValidationError),
        (lambda d: d["spec"].update(serveConfigV2=d["spec"]["serveConfigV2"].replace(
            "quantization: awq", "quantization: awqq")), ValueError),
        (lambda d: d["spec"].update(serveConfigV2=d["spec"]["serveConfigV2"].replace(
            "max_ongoing_requests: 32", "max_ongoing_request: 32")), ValueError),
    ],
    ids=["worker-group-without-name", "autoscaling-not-a-bool", "unknown-quantization",
         "misspelt-field"],
)  # fmt: skip
def test_what_would_fail_at_deploy_time_fails_here(mutate: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        validate(_broken(mutate))


def test_a_core_manifest_with_a_bad_field_fails() -> None:
    (service,) = documents(K8S / "service.yaml")
    service["spec"]["ports"][0]["port"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES, strict=True)
