"""The Grafana dashboard (app.observability.dashboards, grafana/dashboards/): the
committed JSON is what the module renders, it has the seed's six rows and the four
variables, and every query names only series and labels the catalog defines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.observability import catalog, dashboards

FILE = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "switchyard.json"


def test_the_committed_dashboard_is_the_rendered_one() -> None:
    assert FILE.read_text() == dashboards.render(), (
        "stale: python -m app.observability.dashboards > grafana/dashboards/switchyard.json"
    )


def test_the_rows_and_the_variables() -> None:
    d = json.loads(FILE.read_text())
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Service health", "User experience", "Engine efficiency", "Scheduler",
                    "Fair sharing", "Cache", "Cost"]  # fmt: skip
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "model", "tenant", "pool", "replica"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("panel", dashboards.panels(), ids=lambda p: p.title)
def test_each_panel_queries_catalog_series_and_labels(panel: dashboards.Panel) -> None:
    assert catalog.problems(panel.expr) == []


@pytest.mark.parametrize(("name", "query"), dashboards.VARIABLES)
def test_each_variable_reads_a_label_its_series_has(name: str, query: str) -> None:
    series = query.removeprefix("label_values(").split(",")[0]
    assert catalog.problems(f"{series}{{{name}=~'.*'}}") == []


def test_the_checker_catches_what_would_be_an_empty_panel() -> None:
    assert catalog.problems("sum(rate(switchyard_nothing_total[5m]))") == [
        "unknown series switchyard_nothing_total"
    ]
    assert catalog.problems('sum by (tenant) (rate(switchyard_requests_total{user="x"}[5m]))') == [
        "unknown label tenant",
        "unknown label user",
    ]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, 'rate(x{model=~".*", replica=~".*"}[1m])'),
        ({"model": "chat|code"}, 'rate(x{model=~"chat|code", replica=~".*"}[1m])'),
    ],
)
def test_concrete_fills_the_variables_as_grafana_does(
    values: dict[str, str], expected: str
) -> None:
    expr = 'rate(x{model=~"$model", replica=~"$replica"}[$__rate_interval])'
    assert dashboards.concrete(expr, **values) == expected


@pytest.mark.parametrize("panel", dashboards.panels(), ids=lambda p: p.title)
def test_each_panel_is_left_with_no_variable_once_filled(panel: dashboards.Panel) -> None:
    assert "$" not in dashboards.concrete(panel.expr)
