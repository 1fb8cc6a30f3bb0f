"""app.bench.per_dollar: the run's cost split over workload classes and tenants by
weighted tokens, and goodput per dollar, hand-computed."""

from __future__ import annotations

import pytest

from app.bench.metrics import SLO
from app.bench.per_dollar import per_dollar
from app.bench.records import RequestRecord


def _rec(
    kind: str, tenant: str | None, prompt: int, out: int, e2e: float, ok: bool = True
) -> RequestRecord:
    r = RequestRecord(index=0, kind=kind, endpoint="chat", intended=0.0, sent=0.0, tenant=tenant)
    r.prompt_tokens, r.opened = prompt, True
    if ok:
        r.chunks, r.end, r.output_tokens = [0.1], e2e, out
    else:
        r.error_kind = "http_429"
    return r


RECORDS = [
    _rec("chat", "acme", 100, 20, 1.0),  # weight 0.2·100 + 20 = 40, meets the SLO
    _rec("chat", "beta", 100, 20, 3.0),  # 40, too slow
    _rec("rag", "acme", 1000, 40, 1.5),  # 240, meets it
    _rec("rag", "beta", 400, 40, 1.0, ok=False),  # failed: its prompt only, 80
]
TOTAL = 40 + 40 + 240 + 80  # weighted tokens
COST = 3.6 * 100 / 3600  # $3.60/hour over 100 s = $0.10
SLO_2S = SLO(e2e_s=2.0)


def test_the_groups_costs_add_up_to_the_runs() -> None:
    got = per_dollar(RECORDS, SLO_2S, hourly_usd=3.6, duration_s=100.0)
    assert got["run"]["cost_usd"] == pytest.approx(COST)
    kinds = {k: v["cost_usd"] for k, v in got["by_kind"].items()}
    assert kinds == pytest.approx({"chat": COST * 80 / TOTAL, "rag": COST * 320 / TOTAL})
    tenants = {k: v["cost_usd"] for k, v in got["by_tenant"].items()}
    assert tenants == pytest.approx({"acme": COST * 280 / TOTAL, "beta": COST * 120 / TOTAL})
    assert sum(tenants.values()) == pytest.approx(COST)


@pytest.mark.parametrize(
    ("group", "name", "good", "completed", "out", "weight"),
    [
        ("by_kind", "chat", 1, 2, 40, 80),
        ("by_kind", "rag", 1, 1, 40, 320),
        ("by_tenant", "acme", 2, 2, 60, 280),
        ("by_tenant", "beta", 0, 1, 20, 120),
    ],
)
def test_per_dollar_figures_of_each_group(
    group: str, name: str, good: int, completed: int, out: int, weight: int
) -> None:
    f = per_dollar(RECORDS, SLO_2S, hourly_usd=3.6, duration_s=100.0)[group][name]
    cost = COST * weight / TOTAL
    assert f["goodput_per_usd"] == pytest.approx(good / cost)
    assert f["completed_per_usd"] == pytest.approx(completed / cost)
    assert f["output_tokens_per_usd"] == pytest.approx(out / cost)


def test_without_an_slo_there_is_no_goodput_and_untagged_records_have_no_tenant() -> None:
    records = [_rec("chat", None, 100, 20, 1.0)]
    got = per_dollar(records, SLO(), hourly_usd=1.0, duration_s=10.0)
    assert got["run"]["goodput_per_usd"] is None
    assert got["by_tenant"] == {} and list(got["by_kind"]) == ["chat"]
