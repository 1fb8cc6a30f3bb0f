"""``k8s/``: every manifest, and everything ``kubectl kustomize`` renders of each overlay
(a real kubectl v1.33, extracted by ``make kubectl``, offline), is valid for Kubernetes
(core kinds against the Kubernetes schemas, RayService against the vendored KubeRay
v1.7.0 CRD), every serveConfigV2 is a Serve config whose applications build with the
real ``AppArgs``; each of ``overlays/cpu`` and ``overlays/gpu`` is one consistent
deployment whose Secret comes from the values the user writes, the way the docs say;
and Ray is locked: token authentication on, reachable only as the NetworkPolicies
mean it to be, its dashboard never outside the cluster — so a manifest that would fail
or be open at deploy time fails here, without a cluster."""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.k8s_validation import (
    K8S,
    KUBERNETES,
    NAMESPACE,
    ROOT,
    Peer,
    admitted,
    dashboard_exposure,
    documents,
    lockdown_violations,
    parse,
    ray_pods,
    selects,
    serve_config,
    validate,
)

KUBECTL = Path(sys.executable).with_name("kubectl")
OVERLAYS = K8S / "overlays"
DEPLOYMENTS = ["cpu", "gpu"]
DOCS = [ROOT / "README.md", ROOT / "docs" / "deploy.md"]
FILES = sorted(
    p for p in K8S.rglob("*.yaml") if "schemas" not in p.parts and p.name != "kustomization.yaml"
)
MANIFESTS = [(str(p.relative_to(K8S)), i, d) for p in FILES for i, d in enumerate(documents(p))]
SECRETS_SNIPPET = re.compile(r"^cat > k8s/base/secrets\.env <<EOF\n.*?^EOF$", re.M | re.S)


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def snippets() -> list[tuple[str, str]]:
    """The commands README and docs/deploy.md give for writing k8s/base/secrets.env."""
    return [(p.name, m.group(0)) for p in DOCS for m in SECRETS_SNIPPET.finditer(p.read_text())]


def kustomize(root: Path, overlay: str) -> subprocess.CompletedProcess[str]:
    assert KUBECTL.is_file(), f"{KUBECTL} is missing: run `make kubectl` (make test does)"
    return subprocess.run(
        [str(KUBECTL), "kustomize", str(root / "k8s" / "overlays" / overlay)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def render(tmp_path_factory: pytest.TempPathFactory) -> Render:
    """What `kubectl kustomize` makes of overlays, in a copy of k8s/ whose secrets.env
    the first documented command wrote, run as documented (bash, from the root)."""
    root = tmp_path_factory.mktemp("k8s-overlays")
    shutil.copytree(K8S, root / "k8s", ignore=shutil.ignore_patterns("secrets.env"))
    (_, snippet), *_ = snippets()
    subprocess.run(["bash", "-euo", "pipefail", "-c", snippet], cwd=root, check=True)
    rendered: dict[str, list[dict[str, Any]]] = {}

    def render_(*overlays: str) -> list[dict[str, Any]]:
        for overlay in overlays:
            if overlay not in rendered:
                result = kustomize(root, overlay)
                assert result.returncode == 0, result.stderr
                rendered[overlay] = parse(result.stdout)
        return [copy.deepcopy(d) for o in overlays for d in rendered[o]]

    return render_


@pytest.mark.parametrize(
    ("name", "index", "doc"), MANIFESTS, ids=[f"{n}#{i}" for n, i, _ in MANIFESTS]
)
def test_every_manifest_is_valid(name: str, index: int, doc: dict[str, Any]) -> None:
    validate(doc)


@pytest.mark.parametrize("overlay", sorted(p.name for p in OVERLAYS.iterdir()))
def test_every_overlay_renders_and_every_object_is_valid(overlay: str, render: Render) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("overlay", DEPLOYMENTS)
def test_each_deployment_overlay_is_one_consistent_deployment(overlay: str, render: Render) -> None:
    docs = render(overlay)
    kinds = by_kind(docs)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), names
    (rs,) = kinds["RayService"]
    assert rs["metadata"]["name"] == "switchyard"
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    pods = ray_pods(rs)
    # the serve Service: every pod KubeRay marks as serving, of this RayService only
    services = {d["metadata"]["name"]: d for d in kinds["Service"]}
    selector = {"matchLabels": services["switchyard"]["spec"]["selector"]}
    for labels in pods.values():
        assert selects(selector, labels | {"ray.io/serve": "true"})
        assert not selects(selector, labels)  # not before KubeRay marks it serving
        other = labels | {"ray.io/serve": "true", "app.kubernetes.io/instance": "another-app"}
        assert not selects(selector, other)
    (ingress,) = kinds["Ingress"]
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            port = backend["port"]["number"]
            assert port in [p["port"] for p in services[backend["name"]]["spec"]["ports"]]
    # Redis: the state URL names its Service, which selects its pods
    (redis,) = kinds["StatefulSet"]
    templates = [g["template"]["spec"] for g in _groups(rs)]
    for spec in templates:
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        host = re.match(r"redis://([^:/]+)", env["SWITCHYARD_STATE_URL"]["value"])
        assert host is not None
        redis_service = services[host.group(1)]
        assert redis_service["spec"]["selector"] == redis["spec"]["template"]["metadata"]["labels"]
    # every Secret reference resolves in the rendered Secret
    secrets = {d["metadata"]["name"]: d for d in kinds["Secret"]}
    for spec in templates:
        for e in spec["containers"][0]["env"]:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                assert ref["key"] in secrets[ref["name"]]["data"], ref
    auth = rs["spec"]["rayClusterConfig"]["authOptions"]
    assert "auth_token" in secrets[auth["secretName"]]["data"]
    # volumes: every claim exists
    claims = {d["metadata"]["name"] for d in kinds.get("PersistentVolumeClaim", [])}
    for spec in templates:
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims


def _groups(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    config = rayservice["spec"]["rayClusterConfig"]
    return [config["headGroupSpec"], *config.get("workerGroupSpecs", [])]


def test_the_other_overlay_replaces_the_deployment_rather_than_adding_one(render: Render) -> None:
    """Applying gpu after cpu (or back) leaves one RayService under one Service."""
    cpu, gpu = ({(d["kind"], d["metadata"]["name"]) for d in render(o)} for o in DEPLOYMENTS)
    assert cpu <= gpu
    assert gpu - cpu == {("PersistentVolumeClaim", "switchyard-models")}


@pytest.mark.parametrize(("doc", "snippet"), snippets(), ids=[d for d, _ in snippets()])
def test_the_documented_secrets_env_gives_every_key_with_fresh_tokens(
    doc: str, snippet: str, tmp_path: Path
) -> None:
    shutil.copytree(K8S, tmp_path / "k8s", ignore=shutil.ignore_patterns("secrets.env"))
    subprocess.run(["bash", "-euo", "pipefail", "-c", snippet], cwd=tmp_path, check=True)
    result = kustomize(tmp_path, "cpu")
    assert result.returncode == 0, result.stderr
    (secret,) = by_kind(parse(result.stdout))["Secret"]
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(values) >= {"admin-token", "auth_token"}
    for key in ("admin-token", "auth_token"):
        assert re.fullmatch(r"[0-9a-f]{64}", values[key]), (key, values[key])
    assert values["admin-token"] != values["auth_token"]


def test_nothing_renders_without_the_users_secrets(tmp_path: Path) -> None:
    shutil.copytree(K8S, tmp_path / "k8s", ignore=shutil.ignore_patterns("secrets.env"))
    for overlay in DEPLOYMENTS:
        result = kustomize(tmp_path, overlay)
        assert result.returncode != 0
        assert "secrets.env" in result.stderr, result.stderr


def test_no_secret_and_no_token_is_committed() -> None:
    assert not [name for name, _, d in MANIFESTS if d["kind"] == "Secret"]
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "k8s/base/secrets.env"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, "k8s/base/secrets.env must be git-ignored"


def test_the_monitoring_overlay_targets_the_deployment(render: Render) -> None:
    monitoring = by_kind(render("monitoring"))
    assert set(monitoring) == {"PodMonitor", "ServiceMonitor", "NetworkPolicy"}
    (pod_monitor,) = monitoring["PodMonitor"]
    (service_monitor,) = monitoring["ServiceMonitor"]
    for overlay in DEPLOYMENTS:
        deployment = by_kind(render(overlay))
        (rs,) = deployment["RayService"]
        for group, labels in ray_pods(rs).items():
            assert selects(pod_monitor["spec"]["selector"], labels), group
        for spec in (g["template"]["spec"] for g in _groups(rs)):
            ports = {p["name"] for p in spec["containers"][0]["ports"]}
            assert "metrics" in ports
        scraped = [
            s for s in deployment["Service"]
            if selects(service_monitor["spec"]["selector"], s["metadata"]["labels"])
        ]  # fmt: skip
        assert [s["metadata"]["name"] for s in scraped] == ["switchyard"]
        (endpoint,) = service_monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in scraped[0]["spec"]["ports"]}
        credentials = endpoint["authorization"]["credentials"]
        (secret,) = [
            s for s in deployment["Secret"] if s["metadata"]["name"] == credentials["name"]
        ]
        assert credentials["key"] in secret["data"]


@pytest.mark.parametrize("overlay", DEPLOYMENTS)
def test_ray_requires_its_token(overlay: str, render: Render) -> None:
    (rs,) = by_kind(render(overlay))["RayService"]
    config = rs["spec"]["rayClusterConfig"]
    # KubeRay turns authentication on only for mode "token" (its default is no auth)
    assert config["authOptions"] == {"mode": "token", "secretName": "switchyard-secrets"}
    major, minor, _ = (int(x) for x in config["rayVersion"].split("."))
    assert (major, minor) >= (2, 52)  # Ray's token authentication, KubeRay's minimum


@pytest.mark.parametrize(
    ("overlays", "monitoring"),
    [(("cpu",), False), (("gpu",), False), (("cpu", "monitoring"), True),
     (("gpu", "monitoring"), True)],
    ids=["cpu", "gpu", "cpu+monitoring", "gpu+monitoring"],
)  # fmt: skip
def test_ray_is_reachable_only_from_its_own_pods_the_operator_and_the_ingress(
    overlays: tuple[str, ...], monitoring: bool, render: Render
) -> None:
    assert lockdown_violations(render(*overlays), monitoring) == []


@pytest.mark.parametrize("overlay", DEPLOYMENTS)
def test_the_dashboard_stays_inside_the_cluster(overlay: str, render: Render) -> None:
    docs = render(overlay)
    assert dashboard_exposure(docs) == []
    (rs,) = by_kind(docs)["RayService"]
    assert rs["spec"]["rayClusterConfig"]["headGroupSpec"]["serviceType"] == "ClusterIP"


def _drop_policy(docs: list[dict[str, Any]]) -> None:
    docs[:] = [d for d in docs if (d["kind"], d["metadata"]["name"]) != (
        "NetworkPolicy", "switchyard-ray")]  # fmt: skip


def _unlabel_a_worker_group(docs: list[dict[str, Any]]) -> None:
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][-1]["template"].pop("metadata")


def _admit_everyone(docs: list[dict[str, Any]]) -> None:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"
                 and d["metadata"]["name"] == "switchyard-ray"]  # fmt: skip
    policy["spec"]["ingress"].append({})


def _open_the_redis_port(docs: list[dict[str, Any]]) -> None:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"
                 and d["metadata"]["name"] == "switchyard-redis"]  # fmt: skip
    policy["spec"]["ingress"][0].pop("from")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [(_drop_policy, "admits stranger-pod -> ray headgroup:6379"),
     (_unlabel_a_worker_group, "admits stranger-pod -> ray gpu-l4:10001"),
     (_admit_everyone, "admits other-namespace-pod -> ray headgroup:8000"),
     (_open_the_redis_port, "admits stranger-pod -> redis redis:6379")],
    ids=["no-ray-policy", "unlabelled-worker-group", "allow-all-rule", "open-redis"],
)  # fmt: skip
def test_an_opening_in_the_lockdown_is_found(mutate: Any, expected: str, render: Render) -> None:
    docs = render("gpu")
    assert lockdown_violations(docs, monitoring=False) == []
    mutate(docs)
    assert expected in lockdown_violations(docs, monitoring=False)


@pytest.mark.parametrize(
    ("kind", "mutate", "expected"),
    [("RayService", lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"].update(
        serviceType="LoadBalancer"), "head Service type LoadBalancer"),
     ("RayService", lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"].update(
        enableIngress=True), "head enableIngress"),
     ("Service", lambda d: d["spec"].update(type="NodePort"), "type NodePort"),
     ("Service", lambda d: d["spec"]["ports"].append({"name": "dash", "port": 8265}),
      "carries the dashboard port"),
     ("Ingress", lambda d: d["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        .update(port={"number": 8265}), "backend port")],
    ids=["head-loadbalancer", "head-ingress", "nodeport", "dashboard-port", "ingress-8265"],
)  # fmt: skip
def test_an_exposed_dashboard_is_found(
    kind: str, mutate: Any, expected: str, render: Render
) -> None:
    docs = render("cpu")
    mutate(next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == "switchyard"))
    assert any(expected in p for p in dashboard_exposure(docs)), dashboard_exposure(docs)


def test_the_policy_model_follows_kubernetes_rules() -> None:
    """admitted() itself, on the corner cases the lockdown relies on."""
    policy = {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "db"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"role": "api"}}}],
                 "ports": [{"port": 5432}]},
                {"from": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": "ops"}},
                    "podSelector": {"matchLabels": {"role": "backup"}}}]},
            ],
        },
    }  # fmt: skip
    db, web = {"role": "db"}, {"role": "web"}
    cases = [
        (web, Peer("elsewhere", {}), 1, True),  # selected by no policy: open
        (db, Peer(NAMESPACE, {"role": "api"}), 5432, True),
        (db, Peer(NAMESPACE, {"role": "api"}), 22, False),  # port not listed
        (db, Peer("other", {"role": "api"}), 5432, False),  # podSelector alone: own namespace
        (db, Peer("ops", {"role": "backup"}), 22, True),  # no ports: every port
        (db, Peer("ops", {"role": "api"}), 5432, False),  # both selectors must match
        (db, Peer(NAMESPACE, {"role": "backup"}), 22, False),
    ]
    for pod, peer, port, expected in cases:
        assert admitted([policy], NAMESPACE, pod, peer, port) is expected, (pod, peer, port)


def test_the_gpu_rayservice_places_llmservers_on_gpus() -> None:
    (doc,) = documents(OVERLAYS / "gpu" / "rayservice.yaml")
    (args,) = serve_config(doc)
    chat, long = args.models
    for model in (chat, long):
        assert (model.accelerator, model.num_gpus, model.quantization) == ("L4", 1, "awq")
        assert model.kv_cache_memory_bytes is None  # the GPU sizes it, not the CPU profile
    assert chat.autoscaling_config is not None and chat.autoscaling_config.max_replicas == 4
    groups = {g["groupName"]: g for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    gpu = groups["gpu-l4"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert doc["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    env = {e["name"] for e in gpu["containers"][0]["env"]}
    assert {"SWITCHYARD_STATE_URL", "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"} <= env


def test_no_autoscaler_but_rays_acts_on_the_replicas(render: Render) -> None:
    kinds = {d["kind"] for o in DEPLOYMENTS for d in render(o)}
    assert "RayService" in kinds and "HorizontalPodAutoscaler" not in kinds


def _broken(mutate: Any) -> dict[str, Any]:
    (doc,) = documents(OVERLAYS / "gpu" / "rayservice.yaml")
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
        (lambda d: d["spec"]["rayClusterConfig"]["authOptions"].update(mode="tokens"),
         jsonschema.ValidationError),
        (lambda d: d["spec"].update(serveConfigV2=d["spec"]["serveConfigV2"].replace(
            "quantization: awq", "quantization: awqq")), ValueError),
        (lambda d: d["spec"].update(serveConfigV2=d["spec"]["serveConfigV2"].replace(
            "max_ongoing_requests: 32", "max_ongoing_request: 32")), ValueError),
    ],
    ids=["worker-group-without-name", "autoscaling-not-a-bool", "unknown-auth-mode",
         "unknown-quantization", "misspelt-field"],
)  # fmt: skip
def test_what_would_fail_at_deploy_time_fails_here(mutate: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        validate(_broken(mutate))


@pytest.mark.parametrize(
    ("path", "mutate"),
    [("base/service.yaml", lambda d: d["spec"]["ports"][0].update(port="eight thousand")),
     ("base/networkpolicies.yaml", lambda d: d["spec"]["ingress"][1].update(
        ports=[{"protocol": "TCP", "port": 8265, "endport": 8266}]))],
    ids=["service-port-not-a-number", "networkpolicy-misspelt-field"],
)  # fmt: skip
def test_a_core_manifest_with_a_bad_field_fails(path: str, mutate: Any) -> None:
    doc = documents(K8S / path)[0]
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_documented_commands_name_the_overlays_and_the_operators_namespace() -> None:
    text = "\n".join(p.read_text() for p in DOCS)
    applied = set(re.findall(r"kubectl apply -k k8s/overlays/([\w-]+)", text))
    assert applied == {p.name for p in OVERLAYS.iterdir()}
    (namespace,) = set(re.findall(r"kuberay/kuberay-operator .*--namespace ([\w-]+)", text))
    (policy,) = [d for d in documents(K8S / "base" / "networkpolicies.yaml")
                 if d["metadata"]["name"] == "switchyard-ray"]  # fmt: skip
    operator = Peer(namespace, {"app.kubernetes.io/name": "kuberay-operator"})
    head = {"app.kubernetes.io/instance": "switchyard", "app.kubernetes.io/component": "ray"}
    assert admitted([policy], NAMESPACE, head, operator, 8265)


def test_the_gpu_rayservice_ships_the_design_cards_pool() -> None:
    """Profiled pools routed by class, Switchyard's replica router on both, and a
    long-context pool with prefill/decode disaggregation."""
    (doc,) = documents(OVERLAYS / "gpu" / "rayservice.yaml")
    (args,) = serve_config(doc)
    models = {m.id: m for m in args.models}
    chat, long = models["qwen-7b-chat"], models["qwen-7b-long"]
    assert chat.profile is not None and chat.profile.name == "interactive"
    assert long.profile is not None and long.profile.name == "long_context"
    assert chat.routing is not None and long.routing is not None
    assert long.routing.prefix.mode == "precise"
    assert long.disaggregation is not None and long.disaggregation.prefill.num_replicas == 1
    raw = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert {"routing", "disaggregation"} <= set(raw["models"][1])
    classes = args.routes.models["qwen2.5-7b-instruct-awq"].classes if args.routes else None
    assert classes is not None and classes.pools == {"interactive": "chat", "long_context": "long"}
    groups = {g["groupName"]: g for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    autoscaled = chat.autoscaling_config.max_replicas if chat.autoscaling_config else 1
    gpus = autoscaled + long.num_replicas + long.disaggregation.prefill.num_replicas
    assert groups["gpu-l4"]["maxReplicas"] >= gpus  # room for every GPU replica
