from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, get_args

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr, ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request

from app.api.ingress import OpenAiIngress
from app.api.metrics import MetricsAccess, PublicMetrics, engine_families, metrics_response
from app.config import AppArgs, GatewayArgs
from app.fairness.queue import PoolQueue, QueueSettings
from app.gateway.gatekeeper import Gatekeeper
from app.observability import catalog
from app.observability.metrics import OTHER, GatewayMetrics
from app.request import Outcome, QueueNote
from app.state.records import LedgerRecord

SECRET_TENANT = "acme-secret-7"
TENANT_FAMILIES = {
    "switchyard_tenant_tokens",
    "switchyard_tenant_cost_usd",
    "switchyard_tenant_requests",
    "switchyard_tenant_gpu_seconds",
    "switchyard_tenant_gpu_cost_usd",
    "switchyard_session_duration_seconds",
    "switchyard_session_calls",
    "switchyard_sessions",
    "switchyard_session_cancels",
    "switchyard_session_cancelled_calls",
    "switchyard_tenant_service_tokens",
}
ADMIN = "s3cret-admin-token"


def test_unknown_models_share_one_label() -> None:
    m = GatewayMetrics(["a", "b"])
    assert m.model_label("a") == "a"
    assert m.model_label("anything-a-user-typed") == OTHER
    assert m.model_label(None) == OTHER


def test_render_is_prometheus_text_with_our_series() -> None:
    m = GatewayMetrics(["a"])
    m.requests.labels("a", "chat", "200").inc()
    m.ttft.labels("a").observe(0.03)
    m.itl.labels("a").observe(0.004)
    m.e2e.labels("a", "chat").observe(0.5)
    m.prompt_tokens.labels("a").inc(5)
    m.completion_tokens.labels("a").inc(7)
    m.aborts.labels("a").inc()
    text = m.render().decode()
    for line in [
        'switchyard_requests_total{endpoint="chat",model="a",replica="local",status="200"} 1.0',
        'switchyard_time_to_first_token_seconds_bucket{le="0.04",model="a",replica="local"} 1.0',
        'switchyard_inter_token_latency_seconds_count{model="a",replica="local"} 1.0',
        'switchyard_e2e_request_latency_seconds_sum{endpoint="chat",model="a",replica="local"} 0.5',
        'switchyard_prompt_tokens_total{model="a",replica="local"} 5.0',
        'switchyard_completion_tokens_total{model="a",replica="local"} 7.0',
        'switchyard_requests_aborted_total{model="a",replica="local"} 1.0',
    ]:
        assert line in text
    assert "_created" not in text
    assert m.content_type.startswith("text/plain")


def test_every_refusal_reason_is_exported_at_zero_from_the_start() -> None:
    """So the first refusal of a kind is an increase Prometheus sees (a series born at 1
    has no rate until its second increment)."""
    text = GatewayMetrics(["a"]).render().decode()
    reasons = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "switchyard_rejections_total"
    }
    assert reasons == {r: 0.0 for r in catalog.REJECTION_REASONS}
    assert "budget" in reasons and "store" in reasons


def test_registries_are_independent() -> None:
    one, two = GatewayMetrics(["a"]), GatewayMetrics(["a"])
    one.requests.labels("a", "chat", "200").inc()
    assert "switchyard_requests_total{" not in two.render().decode()


def _populate(m: GatewayMetrics) -> None:
    """One series in every family, so a render shows each of them with its labels."""
    m.requests.labels("a", "chat", "200").inc()
    m.ttft.labels("a").observe(0.03)
    m.itl.labels("a").observe(0.004)
    m.e2e.labels("a", "chat").observe(0.5)
    m.prompt_tokens.labels("a").inc(5)
    m.completion_tokens.labels("a").inc(7)
    m.aborts.labels("a").inc()
    m.tenant_tokens.labels(m.tenant_label(SECRET_TENANT), "prompt").inc(3)
    m.tenant_cost.labels(m.tenant_label(SECRET_TENANT)).inc(0.25)
    m.tenant_requests.labels(m.tenant_label(SECRET_TENANT)).inc()
    m.tenant_gpu_seconds.labels(m.tenant_label(SECRET_TENANT)).inc(1.5)
    m.tenant_gpu_cost.labels(m.tenant_label(SECRET_TENANT)).inc(0.003)
    tenant = m.tenant_label(SECRET_TENANT)
    m.session_duration.labels(tenant).observe(12.0)
    m.session_calls.labels(tenant).observe(4)
    m.sessions.labels(tenant, "met").inc()
    m.session_cancels.labels(tenant).inc()
    m.session_cancelled_calls.labels(tenant).inc(2)
    m.rejections.labels("budget").inc()
    m.store_latency.labels("admit").observe(0.0004)
    m.store_failures.labels("settle").inc()
    m.decisions.labels("a", "pool-a", "default").inc()
    m.fallbacks.labels("upstream_connect").inc()
    m.queue_wait.labels("a", "standard").observe(0.02)
    m.queue_shed.labels("a", "batch", "pool_full").inc()
    m.watch_queue("pool-a", "standard", lambda: 3)
    m.watch_engine_caps("pool-a")("held")
    m.tenant_service.labels(tenant).inc(256)


def _families(text: str) -> dict[str, set[str]]:
    """Family name → every label name its samples carry."""
    return {
        f.name: {k for s in f.samples for k in s.labels}
        for f in text_string_to_metric_families(text)
    }


def _metric_names(m: GatewayMetrics) -> set[str]:
    return {v._name for v in vars(m).values() if isinstance(v, MetricWrapperBase)}


def test_every_family_is_populated_by_the_helper() -> None:
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)
    # a family added without a sample here would make the public/full checks vacuous
    assert set(_families(m.render(include_tenants=True).decode())) == _metric_names(m)


def test_public_render_has_no_tenant_family_and_no_tenant_id() -> None:
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)
    public = m.render().decode()
    families = _families(public)
    assert families and not TENANT_FAMILIES & set(families)
    assert all("tenant" not in labels for labels in families.values())
    assert SECRET_TENANT not in public
    assert "tenant=" not in public
    assert set(families) == _metric_names(m) - TENANT_FAMILIES


def test_full_render_adds_the_tenant_families() -> None:
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)
    public, full = m.render().decode(), m.render(include_tenants=True).decode()
    assert full.startswith(public)  # the public families are the same in both
    tenant_families = {n for n, labels in _families(full).items() if "tenant" in labels}
    assert tenant_families == TENANT_FAMILIES
    r, t = 'replica="local"', f'tenant="{SECRET_TENANT}"'
    assert f'switchyard_tenant_tokens_total{{kind="prompt",{r},{t}}} 3.0' in full
    assert f"switchyard_tenant_cost_usd_total{{{r},{t}}} 0.25" in full


def test_a_public_scrape_never_collects_the_tenant_registry() -> None:
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)

    class Untouchable:
        def collect(self) -> Any:
            raise AssertionError("the tenant registry was collected")

    m.tenant_registry = Untouchable()  # type: ignore[assignment]
    assert b"switchyard_requests_total" in m.render()
    with pytest.raises(AssertionError, match="tenant registry"):
        m.render(include_tenants=True)


@pytest.mark.parametrize(
    ("allowed", "tenant", "label"),
    [
        ([], "t1", OTHER),
        (["t1", "t2"], "t1", "t1"),
        (["t1", "t2"], "t2", "t2"),
        (["t1", "t2"], "t3", OTHER),
        (["t1"], "T1", OTHER),  # exact match, no case folding
        (["t1"], OTHER, OTHER),
        ([OTHER, "t1"], OTHER, OTHER),  # a tenant called "other" is in the shared series
    ],
)
def test_only_allow_listed_tenants_get_their_own_label(
    allowed: list[str], tenant: str, label: str
) -> None:
    assert GatewayMetrics(["a"], tenants=allowed).tenant_label(tenant) == label


def test_many_unlisted_tenants_share_one_series() -> None:
    m = GatewayMetrics(["a"], tenants=["t1"])
    for i in range(500):
        m.tenant_cost.labels(m.tenant_label(f"tenant-{i}")).inc(1)
    m.tenant_cost.labels(m.tenant_label("t1")).inc(2)
    full = m.render(include_tenants=True).decode()
    samples = [
        (s.labels["tenant"], s.value)
        for f in text_string_to_metric_families(full)
        if f.name == "switchyard_tenant_cost_usd"
        for s in f.samples
    ]
    assert sorted(samples) == [(OTHER, 500.0), ("t1", 2.0)]


def _ledger(tenant: str, prompt: int, completion: int, cached: int, cost: float) -> LedgerRecord:
    return LedgerRecord(
        request_id=f"r-{tenant}",
        tenant=tenant,
        model_requested="a",
        endpoint="chat",
        status="ok",
        http_status=200,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        cost_usd=cost,
        e2e_s=1.0,
        started_at=0.0,
        ended_at=1.0,
    )


def _tenant_samples(m: GatewayMetrics) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica")), s.value)
        for f in text_string_to_metric_families(m.render(include_tenants=True).decode())
        if f.name in TENANT_FAMILIES
        for s in f.samples
    }


def test_label_set_does_not_depend_on_the_order_tenants_arrive_in() -> None:
    """Two replicas (or one before and after a restart) seeing tenants in different
    orders export the same label set: the allow-list decides, not arrival order."""
    records = [_ledger(f"t{i}", i, 2 * i, 1, i / 10) for i in range(1, 6)]
    one = GatewayMetrics(["a"], tenants=["t4", "t2"])
    two = GatewayMetrics(["a"], tenants=["t2", "t4"])
    for metrics, order in ((one, records), (two, records[::-1])):
        for record in order:
            Gatekeeper._billed(SimpleNamespace(metrics=metrics), record)  # type: ignore[arg-type]
    assert _tenant_samples(one) == _tenant_samples(two)
    labels = {dict(labels)["tenant"] for _, labels, _ in _tenant_samples(one)}
    assert labels == {"t2", "t4", OTHER}
    assert (
        "switchyard_tenant_tokens_total",
        (("kind", "prompt"), ("tenant", OTHER)),
        1.0 + 3.0 + 5.0,
    ) in _tenant_samples(one)


# ---- who may read what: the /metrics endpoint ------------------------------------

TOKEN = SecretStr(ADMIN)


@pytest.mark.parametrize(
    ("public", "token", "authorization", "status", "tenants"),
    [
        # anonymous scrapes follow gateway.public_metrics
        ("tenant_free", TOKEN, None, 200, False),
        ("tenant_free", None, None, 200, False),
        ("all", TOKEN, None, 200, True),
        ("all", None, None, 200, True),
        ("none", TOKEN, None, 404, False),
        ("none", None, None, 404, False),
        # the admin token sees everything, whatever the public view
        ("tenant_free", TOKEN, f"Bearer {ADMIN}", 200, True),
        ("tenant_free", TOKEN, f"bearer {ADMIN}", 200, True),
        ("none", TOKEN, f"Bearer {ADMIN}", 200, True),
        ("all", TOKEN, f"Bearer {ADMIN}", 200, True),
        # any other credential is 401, never the anonymous view
        ("tenant_free", TOKEN, "Bearer wrong", 401, False),
        ("tenant_free", TOKEN, f"Bearer {ADMIN}x", 401, False),
        ("tenant_free", TOKEN, f"Basic {ADMIN}", 401, False),
        ("tenant_free", TOKEN, ADMIN, 401, False),
        ("tenant_free", TOKEN, "Bearer ", 401, False),
        ("tenant_free", TOKEN, "", 401, False),
        ("all", TOKEN, "Bearer wrong", 401, False),
        ("none", TOKEN, "Bearer wrong", 401, False),
        # without an admin token configured no credential can be right
        ("tenant_free", None, "Bearer anything", 401, False),
        ("tenant_free", SecretStr(""), "Bearer ", 401, False),
        ("all", None, "Bearer anything", 401, False),
    ],
)
def test_metrics_response(
    public: PublicMetrics,
    token: SecretStr | None,
    authorization: str | None,
    status: int,
    tenants: bool,
) -> None:
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)
    raw = {} if authorization is None else {"Authorization": authorization}
    response = metrics_response(m, MetricsAccess(public, token), Headers(raw))
    body = bytes(response.body).decode()
    assert response.status_code == status
    if status == 200:
        assert response.headers["content-type"].startswith("text/plain")
        assert response.headers["vary"] == "Authorization"
        assert "switchyard_requests_total" in body
        assert (SECRET_TENANT in body) is tenants
        assert ("switchyard_tenant_cost_usd_total" in body) is tenants
        return
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == {401: "invalid_api_key", 404: "not_found"}[status]
    assert SECRET_TENANT not in body and "switchyard_" not in body
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
        assert ADMIN not in body


def test_the_ingress_endpoint_uses_its_access_policy_and_the_request_headers() -> None:
    """The real ``OpenAiIngress.metrics`` method, without Ray: a stand-in for the
    replica holds what ``__init__`` would have built."""
    m = GatewayMetrics(["a"], tenants=[SECRET_TENANT])
    _populate(m)
    replica = SimpleNamespace(
        _metrics=m,
        _metrics_access=MetricsAccess("none", TOKEN),
        _board=None,
        _metrics_engines=False,
    )

    def get(headers: list[tuple[bytes, bytes]]) -> Any:
        scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": headers}
        return asyncio.run(OpenAiIngress.metrics(replica, request=Request(scope)))

    assert get([]).status_code == 404
    assert get([(b"authorization", b"Bearer nope")]).status_code == 401
    ok = get([(b"authorization", f"Bearer {ADMIN}".encode())])
    assert ok.status_code == 200 and SECRET_TENANT.encode() in ok.body


# ---- configuration ---------------------------------------------------------------


def test_gateway_metrics_config_defaults() -> None:
    args = GatewayArgs()
    assert args.public_metrics == "tenant_free"
    assert args.metrics_tenants == []
    assert MetricsAccess().public == "tenant_free"


def test_public_metrics_choices_match_the_endpoint() -> None:
    annotation = GatewayArgs.model_fields["public_metrics"].annotation
    choices = {"tenant_free", "none", "all"}
    assert set(get_args(annotation)) == set(get_args(PublicMetrics)) == choices
    with pytest.raises(ValidationError, match="public_metrics"):
        GatewayArgs.model_validate({"public_metrics": "tenants"})


def test_metrics_tenants_are_checked_and_deduplicated() -> None:
    assert GatewayArgs(metrics_tenants=["b", "a", "b"]).metrics_tenants == ["b", "a"]
    for bad in (["a", "other"], [""]):
        with pytest.raises(ValidationError, match="metrics_tenants may not contain"):
            GatewayArgs(metrics_tenants=bad)


def test_removed_tenant_label_cap_fails_with_a_pointer_to_metrics_tenants() -> None:
    args = {"models": [{"id": "m", "engine": "simulated"}], "gateway": {"tenant_label_cap": 20}}
    with pytest.raises(ValidationError) as info:
        AppArgs.model_validate(args)
    (error,) = info.value.errors()
    assert error["loc"] == ("gateway",)
    assert "tenant_label_cap was removed" in error["msg"]
    assert "metrics_tenants" in error["msg"]


def test_pd_requests_count_by_outcome_and_time_only_what_succeeded() -> None:
    m = GatewayMetrics(["a"])
    m.pd_request("a", "remote", "long_uncached", prefill_s=0.2, handoff_s=0.05)
    m.pd_request("a", "local", "fallback_prefill_timeout")
    m.pd_request("a", "local", "short")
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    for served, reason in (("remote", "long_uncached"), ("local", "fallback_prefill_timeout")):
        key = (("model", "a"), ("reason", reason), ("served", served))
        assert samples[("switchyard_pd_requests_total", key)] == 1
    assert samples[("switchyard_pd_prefill_seconds_count", (("model", "a"),))] == 1
    assert samples[("switchyard_pd_handoff_seconds_sum", (("model", "a"),))] == 0.05


def test_a_requests_turn_at_the_fair_queue_is_counted_from_its_outcome() -> None:
    m = GatewayMetrics(["a"], tenants=["t"])
    served = Outcome("chat", status="ok", http_status=200)
    served.queue = QueueNote("interactive", waited_s=0.05, counter=10.0, service=256.0)
    shed = Outcome("chat", status="shed", http_status=503)
    shed.queue = QueueNote("batch", waited_s=0.0, shed="pool_full")
    m.observe("a", served, "t")
    m.observe("a", shed, "stranger")
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))): s.value
        for f in text_string_to_metric_families(m.render(include_tenants=True).decode())
        for s in f.samples
    }
    band = (("band", "interactive"), ("model", "a"))
    assert samples[("switchyard_queue_wait_seconds_count", band)] == 1
    assert samples[("switchyard_queue_wait_seconds_sum", band)] == 0.05
    why = (("band", "batch"), ("model", "a"), ("reason", "pool_full"))
    assert samples[("switchyard_queue_shed_total", why)] == 1
    assert samples[("switchyard_tenant_service_tokens_total", (("tenant", "t"),))] == 256
    assert ("switchyard_queue_wait_seconds_count", (("band", "batch"), ("model", "a"))) not in (
        samples
    )  # a shed request waited for nothing it got


def test_metrics_off_observe_nothing_and_export_nothing() -> None:
    m = GatewayMetrics(["a"], tenants=["t"], enabled=False)
    o = Outcome("chat", status="ok", http_status=200, completion_tokens=3)
    o.ttft_s, o.itls = 0.01, [0.002, 0.003]
    m.observe("a", o)
    m.rejections.labels("budget").inc()
    m.settlements_pending.set(2)
    assert b"switchyard_" not in m.render(include_tenants=True)
    on = GatewayMetrics(["a"])
    on.observe("a", o)
    assert b"switchyard_inter_token_latency_seconds_count" in on.render()
    assert GatewayArgs().metrics_enabled and not GatewayArgs(metrics_enabled=False).metrics_enabled


RAY_EXPORT = """# HELP ray_switchyard_engine_running_requests Requests running.
# TYPE ray_switchyard_engine_running_requests gauge
ray_switchyard_engine_running_requests{deployment="LLMServer-a",model="a",replica="x1"} 2.0
# HELP ray_serve_num_http_requests_total Ray Serve's own.
# TYPE ray_serve_num_http_requests_total counter
ray_serve_num_http_requests_total{route="/"} 7.0
ray_switchyard_engine_queue_seconds_count{deployment="LLMServer-a",model="a",replica="x1"} 3.0
"""


def test_the_local_view_appends_the_engine_family_of_rays_export_only() -> None:
    got = engine_families(RAY_EXPORT).decode()
    assert got.splitlines() == [
        line for line in RAY_EXPORT.splitlines() if "switchyard_engine" in line
    ]
    assert "ray_serve_num_http_requests" not in got and engine_families("") == b""
    body = metrics_response(GatewayMetrics(["a"]), MetricsAccess(), {}, engines=got.encode()).body
    families = {f.name for f in text_string_to_metric_families(bytes(body).decode())}
    assert {"switchyard_requests", "ray_switchyard_engine_running_requests"} <= families


def test_reservations_outstanding_are_read_when_scraped() -> None:
    m = GatewayMetrics(["a"], replica="r1")
    live = [2]
    m.reservations_outstanding.set_function(lambda: live[0])
    line = 'switchyard_reservations_outstanding{replica="r1"} '
    assert line + "2.0" in m.render().decode()
    live[0] = 0  # every reservation settled
    assert line + "0.0" in m.render().decode()


def test_replica_decisions_count_prompt_and_matched_blocks_for_the_affinity_hit_rate() -> None:
    m = GatewayMetrics(["a"])
    m.replica_decision("a", "prefix", 0.0001, 40, matched_blocks=6, prompt_blocks=8)
    m.replica_decision("a", "load", 0.0001, 48, matched_blocks=0, prompt_blocks=8)
    got = {
        s.labels["kind"]: s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
        if s.name == "switchyard_replica_prefix_blocks_total"
    }
    assert got == {"prompt": 16.0, "matched": 6.0}  # a 37.5 % hit rate


async def test_a_pools_slots_and_token_sums_are_read_at_scrape_time() -> None:
    """Cap 4 (headroom 1); one light request of 30 prompt tokens that may produce 10."""
    m = GatewayMetrics(["a"], tenants=[])
    q = PoolQueue(4, QueueSettings(max_kv_tokens=1000), clock=lambda: 0.0)
    m.watch_slots("pool-a", q.slots())

    def read() -> dict[str, float]:
        return {s.labels["kind"]: s.value
                for f in text_string_to_metric_families(m.render().decode())
                for s in f.samples if s.name == "switchyard_queue_slots"}  # fmt: skip

    assert read() == {"cap": 4, "running": 0, "light": 0, "reserved": 1,
                      "prefill_tokens": 0, "kv_tokens": 0}  # fmt: skip
    ticket = q.ticket("A", "standard", 30, output_tokens=10)
    await ticket.wait()
    assert read() == {"cap": 4, "running": 1, "light": 1, "reserved": 1,
                      "prefill_tokens": 30, "kv_tokens": 40}  # fmt: skip
    ticket.first_token()
    ticket.leave(10)
    assert read()["prefill_tokens"] == read()["kv_tokens"] == read()["running"] == 0


def test_a_pools_engine_caps_are_exported_at_zero_from_its_first_request() -> None:
    m = GatewayMetrics(["a"], tenants=[])
    count = m.watch_engine_caps("pool-a")
    text = m.render().decode()
    r = 'replica="local"'
    for outcome in ("held", "stale"):
        series = f'switchyard_queue_engine_caps_total{{outcome="{outcome}",pool="pool-a",{r}}}'
        assert f"{series} 0.0" in text
    count("held")
    assert f'switchyard_queue_engine_caps_total{{outcome="held",pool="pool-a",{r}}} 1.0' in (
        m.render().decode()
    )
