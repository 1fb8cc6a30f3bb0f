"""Validation of Kubernetes manifests without a cluster, shared by the ``k8s/`` and the
Helm chart tests: core kinds against the Kubernetes schemas (strict), RayService against
the vendored KubeRay v1.7.0 CRD, Prometheus Operator kinds by their required fields, and
each serveConfigV2 through Ray's ``ServeDeploySchema`` and Switchyard's ``AppArgs``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from ray.serve.schema import ServeDeploySchema

from app.config import AppArgs

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
CRD = K8S / "schemas" / "kuberay-v1.7.0" / "ray.io_rayservices.yaml"
KUBERNETES = "1.33"
PROMETHEUS_OPERATOR = {
    "PodMonitor": "podMetricsEndpoints",
    "ServiceMonitor": "endpoints",
    "PrometheusRule": "groups",
}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(path: Path) -> list[dict[str, Any]]:
    return parse(path.read_text())


def parse(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=Loader) if d]


@functools.cache
def rayservice_schema() -> dict[str, Any]:
    (crd,) = documents(CRD)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def validate(doc: dict[str, Any]) -> None:
    """Raise when Kubernetes (or the operator owning the kind) would refuse ``doc``."""
    kind = doc.get("kind")
    if kind == "RayService":
        assert doc["apiVersion"] == "ray.io/v1"
        jsonschema.validate(doc, rayservice_schema())
        serve_config(doc)
    elif kind in PROMETHEUS_OPERATOR:  # no schema vendored: the fields it needs
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert kind == "PrometheusRule" or doc["spec"]["selector"]
        assert doc["spec"][PROMETHEUS_OPERATOR[kind]]
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def serve_config(doc: dict[str, Any]) -> list[AppArgs]:
    config = ServeDeploySchema.model_validate(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    out = []
    for app in config.applications:
        assert app.import_path == "app.builders:build_app", app.import_path
        out.append(AppArgs.model_validate(app.args))
    return out
