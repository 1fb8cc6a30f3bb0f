"""The metric definitions (app.observability.catalog) against what the gateway registers
and what the README documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.observability import catalog
from app.observability.metrics import GatewayMetrics

README = Path(__file__).resolve().parents[2] / "README.md"


def _families(registry: object) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.documentation) for f in registry.collect()}  # type: ignore[attr-defined]


def test_the_gateway_registers_exactly_the_catalog() -> None:
    m = GatewayMetrics(["a"], ["t"])
    public, tenant = _families(m.registry), _families(m.tenant_registry)
    gateway = [d for d in catalog.METRICS if d.source == "gateway"]
    want_public = {d.name: (d.kind, d.help) for d in gateway if not d.tenant}
    want_tenant = {d.name: (d.kind, d.help) for d in gateway if d.tenant}
    assert public == want_public
    assert tenant == want_tenant


GATEWAY = [d for d in catalog.METRICS if d.source == "gateway"]


@pytest.mark.parametrize("metric", GATEWAY, ids=lambda d: d.name)
def test_each_family_carries_its_labels_and_buckets(metric: catalog.Metric) -> None:
    """One observation with every label set: the exposition has the catalog's labels
    (and, for a histogram, exactly its buckets)."""
    m = GatewayMetrics(["a"], ["t"])
    family = next(v for v in vars(m).values() if getattr(v, "_name", None) == metric.name)
    child = family.labels(*("x" for _ in metric.labels)) if metric.labels else family
    if metric.kind == "histogram":
        child.observe(0.001)
    elif metric.kind == "counter":
        child.inc()
    else:
        child.set(1)
    text = m.render(include_tenants=True).decode()
    lines = [line for line in text.splitlines() if line.startswith(metric.exported)]
    assert lines, text
    for line in lines:
        labels = re.findall(r'(\w+)="', line.split(" ")[0])
        extra = ["le"] if line.startswith(metric.name + "_bucket") else []
        assert sorted(labels) == sorted([*metric.query_labels, *extra]), line
    if metric.kind == "histogram":
        les = re.findall(r'le="([^"]+)"', text.split(metric.name + "_sum")[0])
        assert [float(x) for x in les[:-1]] == list(metric.buckets) and les[-1] == "+Inf"


def test_every_label_has_a_documented_bounded_value_set() -> None:
    used = {label for m in catalog.METRICS for label in m.query_labels}
    assert used <= set(catalog.LABELS)
    unbounded = {"user", "user_id", "key", "api_key", "prompt", "adapter", "session", "session_id"}
    assert not used & unbounded


def test_series_names_cover_what_a_query_can_name() -> None:
    names = catalog.series_names()
    assert names["switchyard_requests_total"].name == "switchyard_requests"
    assert {"switchyard_pd_handoff_seconds_bucket", "switchyard_pd_handoff_seconds_count",
            "switchyard_pd_handoff_seconds_sum"} <= set(names)  # fmt: skip
    assert "switchyard_requests" not in names  # a counter is queried with _total
    assert names["switchyard_settlements_pending"].kind == "gauge"
    # A replica family is queried under Ray's name, with Ray Serve's labels.
    engine = names["ray_switchyard_engine_preemptions_total"]
    assert engine.query_labels == ("deployment", "replica", "application", "model")
    assert "ray_switchyard_engine_queue_seconds_bucket" in names


def test_the_readme_table_is_generated_from_the_catalog() -> None:
    text = README.read_text()
    start, end = "<!-- metrics-table:start -->\n", "<!-- metrics-table:end -->"
    assert start in text and end in text
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == catalog.markdown(), (
        "README's metrics table is stale: python -m app.observability.catalog"
    )
