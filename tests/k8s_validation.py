"""Validation of Kubernetes manifests without a cluster, shared by the ``k8s/`` and the
Helm chart tests: core kinds against the Kubernetes schemas (strict), RayService against
the vendored KubeRay v1.7.0 CRD, Prometheus Operator kinds by their required fields, and
each serveConfigV2 through Ray's ``ServeDeploySchema`` and Switchyard's ``AppArgs``; and
who may connect to the Ray pods, by Kubernetes' NetworkPolicy rules."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
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


# --- Who may connect to what: NetworkPolicies evaluated as Kubernetes does -----------

KUBERAY_PROTECTED = ("ray.io/node-type", "ray.io/group", "ray.io/cluster")


@dataclass(frozen=True)
class Peer:
    """A pod opening a connection: its namespace and its labels."""

    namespace: str
    labels: Mapping[str, str]


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector applied to ``labels`` (an empty selector selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_matches(rule_peer: Mapping[str, Any], namespace: str, peer: Peer) -> bool:
    if "ipBlock" in rule_peer:
        raise NotImplementedError("ipBlock peers are not modelled")
    namespace_labels = {"kubernetes.io/metadata.name": peer.namespace}
    if "namespaceSelector" in rule_peer:
        in_namespace = selects(rule_peer["namespaceSelector"], namespace_labels)
    else:  # a podSelector alone: pods of the policy's own namespace
        in_namespace = peer.namespace == namespace
    return in_namespace and selects(rule_peer.get("podSelector"), peer.labels)


def _port_matches(ports: list[dict[str, Any]] | None, port: int) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        if "port" not in p:
            return True
        if isinstance(p["port"], str):
            raise NotImplementedError("named ports are not modelled")
        if p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


def admitted(
    docs: list[dict[str, Any]], namespace: str, pod: Mapping[str, str], peer: Peer, port: int
) -> bool:
    """Whether the NetworkPolicies among ``docs`` (all in ``namespace``) let ``peer`` open
    a TCP connection to ``port`` of a pod labelled ``pod``: a pod no policy selects for
    ingress takes anything; a selected one only what some rule of a selecting policy
    admits (policies add up, never subtract)."""
    selecting = [
        d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and "Ingress" in d["spec"].get("policyTypes", ["Ingress"])
        and selects(d["spec"]["podSelector"], pod)
    ]
    if not selecting:
        return True
    return any(
        (not rule.get("from") or any(_peer_matches(f, namespace, peer) for f in rule["from"]))
        and _port_matches(rule.get("ports"), port)
        for spec in selecting
        for rule in spec.get("ingress") or []
    )


def ray_pods(rayservice: dict[str, Any], cluster: str = "rc-x7k2p") -> dict[str, dict[str, str]]:
    """The labels of each group's Ray pods as KubeRay v1.7.0 sets them (``labelPod``):
    its own, overridden by the pod template's except the protected ones. ``cluster`` is
    the RayCluster's name, which KubeRay generates (and changes on upgrades)."""
    config = rayservice["spec"]["rayClusterConfig"]
    groups = [("head", "headgroup", config["headGroupSpec"])] + [
        ("worker", g["groupName"], g) for g in config.get("workerGroupSpecs") or []
    ]
    out = {}
    for node_type, name, group in groups:
        labels = {
            "ray.io/is-ray-node": "yes",
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": name,
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        template = (group["template"].get("metadata") or {}).get("labels") or {}
        labels |= {k: v for k, v in template.items() if k not in KUBERAY_PROTECTED}
        out[name] = labels
    return out


def dashboard_exposure(docs: list[dict[str, Any]]) -> list[str]:
    """What would put Ray's dashboard (or any Ray port) outside the cluster."""
    problems = []
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "RayService":
            head = d["spec"]["rayClusterConfig"]["headGroupSpec"]
            if head.get("serviceType", "ClusterIP") != "ClusterIP":
                problems.append(f"{name}: head Service type {head['serviceType']}")
            if head.get("enableIngress"):
                problems.append(f"{name}: head enableIngress")
        elif d["kind"] == "Service":
            spec = d["spec"]
            if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs"):
                problems.append(f"{name}: type {spec.get('type')}")
            if any(p.get("targetPort", p["port"]) == 8265 for p in spec["ports"]):
                problems.append(f"{name}: carries the dashboard port")
        elif d["kind"] == "Ingress":
            for rule in d["spec"].get("rules") or []:
                for path in rule["http"]["paths"]:
                    port = path["backend"]["service"]["port"]
                    if port != {"number": 8000}:
                        problems.append(f"{name}: backend port {port}")
    return problems


# Who tries to connect where, and whether the deployment must let them: (who, target,
# port, admitted, admitted when monitoring is on). The namespaces are the ones the
# manifests and the chart's defaults name (docs/deploy.md "Ray locked in the cluster").
NAMESPACE = "switchyard"
LOCKDOWN: list[tuple[str, str, int, bool, bool]] = [
    ("ray-pod", "ray", 6379, True, True),  # GCS
    ("ray-pod", "ray", 8265, True, True),  # dashboard
    ("ray-pod", "ray", 10001, True, True),  # Ray client
    ("ray-pod", "ray", 52365, True, True),  # dashboard agent
    ("ray-pod", "ray", 8080, True, True),  # metrics export
    ("ray-pod", "ray", 43117, True, True),  # a raylet, object manager or worker port
    ("ray-pod", "redis", 6379, True, True),
    ("stranger-pod", "ray", 6379, False, False),
    ("stranger-pod", "ray", 8265, False, False),
    ("stranger-pod", "ray", 10001, False, False),
    ("stranger-pod", "ray", 8000, False, False),
    ("stranger-pod", "ray", 8080, False, False),
    ("stranger-pod", "redis", 6379, False, False),
    ("other-rayservice-pod", "ray", 6379, False, False),
    ("other-rayservice-pod", "redis", 6379, False, False),
    ("other-namespace-pod", "ray", 10001, False, False),
    ("other-namespace-pod", "ray", 8000, False, False),
    ("kuberay-operator", "ray", 8265, True, True),  # Serve status, deploys
    ("kuberay-operator", "ray", 8000, True, True),  # the proxy's /-/healthz
    ("kuberay-operator", "ray", 6379, False, False),
    ("kuberay-operator", "ray", 10001, False, False),
    ("kuberay-namespace-pod", "ray", 8265, False, False),
    ("ingress-controller", "ray", 8000, True, True),
    ("ingress-controller", "ray", 8265, False, False),
    ("ingress-controller", "ray", 6379, False, False),
    ("ingress-controller", "redis", 6379, False, False),
    ("prometheus", "ray", 8080, False, True),
    ("prometheus", "ray", 8000, False, True),
    ("prometheus", "ray", 8265, False, False),
    ("prometheus", "redis", 6379, False, False),
]
OUTSIDERS = {
    "stranger-pod": Peer(NAMESPACE, {"app": "debug-shell"}),
    "other-namespace-pod": Peer("tenant-b", {"app": "debug-shell"}),
    "kuberay-operator": Peer("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"}),
    "kuberay-namespace-pod": Peer("kuberay-system", {"app": "debug-shell"}),
    "ingress-controller": Peer("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
    "prometheus": Peer("monitoring", {"app.kubernetes.io/name": "prometheus"}),
}


def lockdown_violations(docs: list[dict[str, Any]], monitoring: bool) -> list[str]:
    """Every LOCKDOWN line the NetworkPolicies among ``docs`` get wrong, for every Ray
    pod group of the rendering's RayService (as a target and, for ``ray-pod``, as the
    source too) and its Redis."""
    (rayservice,) = [d for d in docs if d["kind"] == "RayService"]
    pods = ray_pods(rayservice)
    redis = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("redis")
    ]
    targets = {"ray": list(pods.items()), "redis": [("redis", r) for r in redis]}
    assert targets["redis"], "no Redis StatefulSet in the rendering"
    other = {k: v for k, v in pods["headgroup"].items() if k != "app.kubernetes.io/instance"}
    peers = {
        **{k: [(k, v)] for k, v in OUTSIDERS.items()},
        "ray-pod": [(f"ray-pod {g}", Peer(NAMESPACE, labels)) for g, labels in pods.items()],
        "other-rayservice-pod": [
            ("other-rayservice-pod",
             Peer(NAMESPACE, other | {"app.kubernetes.io/instance": "another-app"}))
        ],
    }  # fmt: skip
    out = []
    for who, target, port, plain, monitored in LOCKDOWN:
        expected = monitored if monitoring else plain
        for source_name, source in peers[who]:
            for target_name, labels in targets[target]:
                if admitted(docs, NAMESPACE, labels, source, port) != expected:
                    verb = "admits" if not expected else "refuses"
                    out.append(f"{verb} {source_name} -> {target} {target_name}:{port}")
    return out
