"""app.bench.crosscheck: our aggregates agree with vLLM's calculate_metrics on the same
per-request data (the installed vLLM's own code is the reference)."""

from __future__ import annotations

import json
import random

import pytest

from app.bench import crosscheck as crosscheck_module
from app.bench.crosscheck import TOLERANCE, crosscheck, crosscheck_result
from app.bench.metrics import SLO, summarize
from app.bench.records import RequestRecord


def _records(n: int, seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = RequestRecord(index=i, kind="fixed", endpoint="chat", intended=i * 0.05)
        r.sent, r.opened, r.prompt_tokens = r.intended + rng.uniform(0, 0.002), True, 100 + i
        if rng.random() < 0.05:
            r.error_kind, r.status = "http_5xx", 503
        else:
            tokens = rng.choice([1, 2, 16, 64])
            t = rng.uniform(0.02, 0.5)
            r.chunks = [t]
            for _ in range(tokens - 1):
                t += rng.expovariate(1 / 0.03)
                r.chunks.append(t)
            r.end, r.output_tokens, r.status = t + 0.001, tokens, 200
        out.append(r)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_figure_agrees_with_vllm_within_tolerance(seed: int) -> None:
    records = _records(400, seed)
    slo = SLO(ttft_s=0.3, tpot_s=0.04, e2e_s=2.0)
    rows = crosscheck(records, 21.0, slo)
    bad = [row for row in rows if not row["ok"]]
    assert not bad, bad
    names = {row["metric"] for row in rows}
    assert {"ttft.p99", "tpot.p99.9", "itl.p50", "e2el.mean", "request_goodput"} <= names
    goodput = next(row for row in rows if row["metric"] == "request_goodput")
    assert 0 < goodput["ours"] < summarize(records)["request_throughput"] * 1.01


def test_a_different_formula_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    records = _records(200, 5)
    real = crosscheck_module.ours

    def tpot_over_n(*args: object) -> dict[str, float]:  # the classic (n, not n-1) slip
        figures = real(*args)  # type: ignore[arg-type]
        figures["tpot.mean"] *= 63 / 64
        return figures

    monkeypatch.setattr(crosscheck_module, "ours", tpot_over_n)
    rows = {row["metric"]: row for row in crosscheck(records, 10.0, None)}
    assert not rows["tpot.mean"]["ok"] and rows["tpot.mean"]["rel_diff"] > TOLERANCE
    assert rows["ttft.mean"]["ok"]


def test_crosscheck_of_a_saved_result(tmp_path: object) -> None:
    records = _records(100, 9)
    slo = SLO(ttft_s=0.25)
    result = {
        "config": {"slo": slo.model_dump()},
        "summary": summarize(records, slo),
        "records": [r.to_json() for r in records],
    }
    rows = crosscheck_result(json.loads(json.dumps(result)))
    assert all(row["ok"] for row in rows)
