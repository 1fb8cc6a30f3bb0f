"""Cross-check: our aggregates against ``vllm bench serve``'s own formulas on the same
per-request data.

Rule: the generation records of a result (embedding calls have no token timing) are
converted to vLLM's ``RequestFuncOutput`` (success, ttft, latency = E2E, itl = chunk
gaps, output_tokens from usage, prompt_len) and passed to
``vllm.benchmarks.serve.calculate_metrics`` with the same duration and SLOs (vLLM takes
them in ms); every shared figure must agree within ``TOLERANCE`` (0.1 %, relative).
Imports vLLM lazily: only this check needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from app.bench.metrics import PERCENTILES, SLO, pkey, summarize
from app.bench.records import RequestRecord

TOLERANCE = 0.001
_LATENCIES = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s"), ("e2el", "e2e_s"))
_RATES = (
    ("request_throughput", "request_throughput"),
    ("output_throughput", "output_throughput"),
    ("total_token_throughput", "total_token_throughput"),
    ("request_goodput", "goodput"),
)


def vllm_metrics(
    records: Sequence[RequestRecord], duration_s: float, slo: SLO | None
) -> dict[str, float]:
    """vLLM's figures (seconds and per-second rates) for ``records``."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    outputs = []
    for r in records:
        out = RequestFuncOutput()
        out.success = r.ok
        out.prompt_len = r.prompt_tokens or 0
        out.start_time = r.intended
        if r.ok:
            out.ttft = r.ttft or 0.0
            out.latency = r.e2e or 0.0
            out.itl = r.itls()
            out.output_tokens = r.n_output
        outputs.append(out)
    goodput: dict[str, float] = {}
    if slo is not None:
        for key, limit in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2el", slo.e2e_s)):
            if limit is not None:
                goodput[key] = limit * 1000.0
    m, _ = calculate_metrics(
        input_requests=[],
        outputs=outputs,
        dur_s=duration_s,
        tokenizer=None,
        selected_percentiles=list(PERCENTILES),
        goodput_config_dict=goodput,
    )
    figures: dict[str, float] = {}
    for name, _ in _LATENCIES:
        figures[f"{name}.mean"] = getattr(m, f"mean_{name}_ms") / 1000.0
        figures[f"{name}.p50"] = getattr(m, f"median_{name}_ms") / 1000.0
        for q, value in getattr(m, f"percentiles_{name}_ms"):
            figures[f"{name}.{pkey(q)}"] = value / 1000.0
    for name, _ in _RATES:
        figures[name] = getattr(m, name)
    return figures


def ours(records: Sequence[RequestRecord], duration_s: float, slo: SLO | None) -> dict[str, float]:
    s = summarize(records, slo, duration_s)
    figures: dict[str, float] = {}
    for name, key in _LATENCIES:
        for stat in ("mean", *(pkey(q) for q in PERCENTILES)):
            value = s[key][stat]
            figures[f"{name}.{stat}"] = 0.0 if value is None else float(value)
    for name, key in _RATES:
        figures[name] = float(s[key] or 0.0)
    return figures


def crosscheck(
    records: Sequence[RequestRecord], duration_s: float, slo: SLO | None
) -> list[dict[str, Any]]:
    """One row per figure: ours, vLLM's, relative difference, within tolerance?"""
    gen = [r for r in records if r.endpoint != "embeddings"]
    a, b = ours(gen, duration_s, slo), vllm_metrics(gen, duration_s, slo)
    rows = []
    for key in a:
        diff = _rel(a[key], b[key])
        rows.append(
            {
                "metric": key,
                "ours": a[key],
                "vllm": b[key],
                "rel_diff": diff,
                "ok": diff <= TOLERANCE,
            }
        )
    return rows


def _rel(x: float, y: float) -> float:
    if x == y:
        return 0.0
    scale = max(abs(x), abs(y))
    return math.inf if scale == 0 else abs(x - y) / scale


def crosscheck_result(result: dict[str, Any]) -> list[dict[str, Any]]:
    """``crosscheck`` on a saved result's measured records."""
    records = [RequestRecord.from_json(r) for r in result["records"]]
    measured = [r for r in records if not r.warmup]
    slo_data = (result.get("config") or {}).get("slo")
    slo = SLO.model_validate(slo_data) if slo_data else None
    return crosscheck(measured, result["summary"]["duration_s"], slo)
