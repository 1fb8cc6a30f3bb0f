from __future__ import annotations

from app.api.metrics import OTHER, GatewayMetrics


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
        'switchyard_requests_total{endpoint="chat",model="a",status="200"} 1.0',
        'switchyard_time_to_first_token_seconds_bucket{le="0.04",model="a"} 1.0',
        'switchyard_inter_token_latency_seconds_count{model="a"} 1.0',
        'switchyard_e2e_request_latency_seconds_sum{endpoint="chat",model="a"} 0.5',
        'switchyard_prompt_tokens_total{model="a"} 5.0',
        'switchyard_completion_tokens_total{model="a"} 7.0',
        'switchyard_requests_aborted_total{model="a"} 1.0',
    ]:
        assert line in text
    assert "_created" not in text
    assert m.content_type.startswith("text/plain")


def test_registries_are_independent() -> None:
    one, two = GatewayMetrics(["a"]), GatewayMetrics(["a"])
    one.requests.labels("a", "chat", "200").inc()
    assert "switchyard_requests_total{" not in two.render().decode()


def test_tenants_beyond_the_cap_share_one_label() -> None:
    m = GatewayMetrics(["a"], tenant_cap=2)
    assert [m.tenant_label(t) for t in ("t1", "t2", "t3", "t1", "t4")] == [
        "t1",
        "t2",
        OTHER,
        "t1",
        OTHER,
    ]
    m.tenant_tokens.labels(m.tenant_label("t9"), "prompt").inc(3)
    m.rejections.labels("budget").inc()
    m.store_latency.labels("admit").observe(0.0004)
    text = m.render().decode()
    assert 'switchyard_tenant_tokens_total{kind="prompt",tenant="other"} 3.0' in text
    assert 'switchyard_rejections_total{reason="budget"} 1.0' in text
    assert 'switchyard_state_store_seconds_bucket{le="0.0005",op="admit"} 1.0' in text
