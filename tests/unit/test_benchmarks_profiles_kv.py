"""The profiles/KV benchmark's arms, flags and report rules (no servers)."""

from __future__ import annotations

from typing import Any

import pytest

from app.profiles.catalog import CATALOGUE
from benchmarks.profiles_kv import arms, flags, resolved_engine
from benchmarks.profiles_kv_report import goals, goodput, hit_vs_p95, knee, markdown, sweep

MIB = 1024**2


def test_profile_arms_get_the_profiles_knobs_from_the_builder() -> None:
    for name in ("throughput", "interactive", "long_context"):
        bundle, engine = CATALOGUE[name], resolved_engine(name)  # type: ignore[index]
        assert engine["max_num_seqs"] == bundle.max_num_seqs
        assert engine["max_num_batched_tokens"] == bundle.max_num_batched_tokens
        assert engine["max_model_len"] == bundle.max_model_len
    default = resolved_engine(None)
    assert (default["max_num_seqs"], default["max_model_len"]) == (32, 2048)  # local.yaml's
    assert "max_num_batched_tokens" not in default


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ({"enforce_eager": True}, ["--enforce-eager"]),
        ({"enforce_eager": False}, []),
        ({"enable_chunked_prefill": False}, ["--no-enable-chunked-prefill"]),
        ({"enable_prefix_caching": True}, ["--enable-prefix-caching"]),
        ({"max_num_seqs": 8, "dtype": "float32"}, ["--max-num-seqs", "8", "--dtype", "float32"]),
    ],
)
def test_flags(engine: dict[str, Any], expected: list[str]) -> None:
    assert flags(engine) == expected


def test_sweep_arms_change_one_knob_of_long_context() -> None:
    by = arms()
    lc = by["long_context"].engine
    for mib in (128, 256, 512):
        engine = by[f"lc-kv-{mib}"].engine
        assert engine["kv_cache_memory_bytes"] == mib * MIB
        changed = {k for k in engine if engine[k] != lc[k]}
        assert changed == {"kv_cache_memory_bytes", "max_model_len"}
    off = by["lc-nochunk"].engine
    assert off["enable_chunked_prefill"] is False
    assert off["max_num_batched_tokens"] >= off["max_model_len"]


def _figs(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "requests": 4,
        "req_per_s": 1.0,
        "e2e_p95": 1.0,
        "e2e_all_ms": [1000.0] * 4,
        "ttft_p95": 0.1,
        "ttft_p50": 0.1,
        "ttft_p99": 0.1,
        "itl_p95": 0.1,
        "itl_p50": 0.1,
        "output_tok_per_s": 10.0,
    }
    return base | kw


def _doc(arms_: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "arms": arms_,
        "environment": {
            "date": "d",
            "git_commit": "c",
            "cpu_model": "cpu",
            "cpu_count": 2,
            "ram_gib": 1,
            "python": "3",
            "versions": {},
        },
        "command": "x",
    }


def _t3(kv_mib: int, hit: float, preempt: int, short_p95: float) -> dict[str, Any]:
    return {
        "label": "x",
        "engine": {"kv_cache_memory_bytes": kv_mib * MIB, "max_model_len": 2048},
        "loads": {
            "t3": {
                "all": _figs(ttft_p95=short_p95),
                "short": _figs(ttft_p95=short_p95),
                "engine_metrics": {"prefix_hit_rate": hit, "preemptions": preempt},
            }
        },
    }


def test_goodput_counts_only_loads_meeting_the_slo() -> None:
    slo_s = (CATALOGUE["throughput"].slo.e2e_p95_ms or 0) / 1000
    loads = {
        "c1-run1": {"all": _figs(req_per_s=0.5)},
        "c8-run1": {"all": _figs(req_per_s=2.0, e2e_all_ms=[1000.0, 1000.0, 1000.0, slo_s * 2000])},
        "c32-run1": {"all": _figs(req_per_s=9.0, e2e_p95=slo_s * 2)},  # breaks the SLO
        "t1": {"all": _figs(req_per_s=50.0)},  # not a baseline load
    }
    assert goodput(_doc({"a": {"loads": loads}}), "a") == pytest.approx(1.5)
    assert goodput(_doc({"a": {"loads": {}}}), "a") is None


def test_knee_is_the_smallest_budget_without_preemption_near_the_top_hit_rate() -> None:
    doc = _doc(
        {
            "lc-kv-128": _t3(128, 0.10, 40, 5.0),
            "lc-kv-256": _t3(256, 0.50, 0, 2.0),  # no preemption but hit rate far below the top
            "lc-kv-512": _t3(512, 0.78, 0, 1.0),
            "long_context": _t3(2048, 0.80, 0, 1.0),
            "default": _t3(1024, 0.99, 0, 1.0),  # not a sweep arm
        }
    )
    rows = sweep(doc)
    assert [r["kv_mib"] for r in rows] == [128, 256, 512, 2048]
    found = knee(rows)
    assert found is not None and found["arm"] == "lc-kv-512"


def test_higher_hit_rate_with_worse_p95_is_listed() -> None:
    doc = _doc(
        {"a": _t3(512, 0.80, 0, 3.0), "b": _t3(256, 0.40, 0, 1.0), "c": _t3(128, 0.79, 0, 3.0)}
    )
    pairs = {(p["higher_hit"], p["vs"]) for p in hit_vs_p95(doc)}
    assert pairs == {("a", "b"), ("c", "b")}


def test_goals_and_markdown_render_with_missing_arms() -> None:
    doc = _doc({"lc-kv-128": _t3(128, 0.1, 3, 1.0)})
    got = goals(doc)
    assert [g["met"] for g in got] == [False, False, False]
    assert all(g["value"] is None for g in got)
    text = markdown(doc | {"goals": got}, "x.png")
    assert "## 3. Where the cache runs out" in text and "| 128 |" in text
