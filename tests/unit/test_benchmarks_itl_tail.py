"""benchmarks/itl_tail.py: the stall rule, the periodicity measure and the CPU shares
(the pure parts; the run itself needs the two servers)."""

from __future__ import annotations

import pytest

from benchmarks.itl_tail import Sampler, markdown, over_counts, parse_itl, resultant, summarize


@pytest.mark.parametrize(
    ("times", "period", "expected"),
    [
        ([0.0, 2.0, 4.0, 6.0], 2.0, 1.0),  # every stall at the same phase
        ([0.0, 0.5, 1.0, 1.5], 2.0, 0.0),  # spread evenly over the period
        ([0.0, 1.0], 2.0, 0.0),  # opposite phases
        ([], 2.0, 0.0),
    ],
)
def test_resultant(times: list[float], period: float, expected: float) -> None:
    assert resultant(times, period) == pytest.approx(expected, abs=1e-9)


def test_stalls_are_gaps_over_twice_the_median_and_their_cpu_is_attributed() -> None:
    gaps = [(1.0 + i * 0.1, 0.1) for i in range(9)] + [(3.0, 0.5)]  # one 0.5 s stall
    sampler = Sampler.__new__(Sampler)
    # the ingress burns a whole core from 2.5 to 3.0 s (the stall), nothing before
    sampler.samples = [(t / 10, {"path/ingress": max(0.0, min(t / 10, 3.0) - 2.5)})
                       for t in range(0, 31)]  # fmt: skip
    s = summarize(gaps, sampler)
    assert (s["tokens"], s["stalls"], s["max_ms"]) == (10, 1, 500.0)
    assert s["stall_excess_s"] == pytest.approx(0.4)
    assert s["p50_ms"] == pytest.approx(100.0)
    assert s["cpu_share_stalls"]["path/ingress"] == pytest.approx(1.0)
    assert s["cpu_share_all"]["path/ingress"] == pytest.approx(0.5 / 3.0)
    assert summarize([(1.0, 0.1), (1.1, 0.002), (1.2, 0.01)], None)["short"] == 2


PAGE = """# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01"} 3.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.3"} 8.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="1.0"} 9.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf"} 10.0
vllm:inter_token_latency_seconds_count{engine="0"} 10.0
vllm:inter_token_latency_seconds_sum{engine="0"} 3.0
# TYPE switchyard_inter_token_latency_seconds histogram
switchyard_inter_token_latency_seconds_bucket{model="a",le="0.005"} 1.0
switchyard_inter_token_latency_seconds_bucket{model="a",le="0.32"} 4.0
switchyard_inter_token_latency_seconds_bucket{model="a",le="1.28"} 5.0
switchyard_inter_token_latency_seconds_bucket{model="a",le="+Inf"} 5.0
switchyard_inter_token_latency_seconds_bucket{model="b",le="0.32"} 2.0
switchyard_inter_token_latency_seconds_bucket{model="b",le="1.28"} 2.0
switchyard_inter_token_latency_seconds_bucket{model="b",le="+Inf"} 3.0
# TYPE switchyard_time_to_first_token_seconds histogram
switchyard_time_to_first_token_seconds_bucket{model="a",le="+Inf"} 7.0
"""


def test_the_itl_histograms_are_read_by_side_and_summed_over_label_sets() -> None:
    assert parse_itl(PAGE) == {
        "engine": {0.01: 3.0, 0.3: 8.0, 1.0: 9.0, float("inf"): 10.0},
        "ingress": {0.005: 1.0, 0.32: 6.0, 1.28: 7.0, float("inf"): 8.0},
    }


def test_gaps_over_a_threshold_count_from_the_nearest_bound_at_or_above_it() -> None:
    before = {"ingress": {0.005: 0.0, 0.32: 1.0, 1.28: 1.0, float("inf"): 1.0}}
    after = parse_itl(PAGE)
    got = over_counts(before, after)
    # engine: 10 gaps, 2 over 0.3 s, 1 over 1 s, 3 at most 10 ms (no earlier page)
    assert got["engine"] == {"gaps": 10.0, ">0.3s": 2.0, "bound_0.3": 0.3,
                             ">1s": 1.0, "bound_1": 1.0,
                             "short": 3.0, "bound_short": 0.01}  # fmt: skip
    # ingress: 7 gaps since `before`, 2 over 0.32 s, 1 over 1.28 s, 1 at most 5 ms
    assert got["ingress"] == {"gaps": 7.0, ">0.3s": 2.0, "bound_0.3": 0.32,
                              ">1s": 1.0, "bound_1": 1.28,
                              "short": 1.0, "bound_short": 0.005}  # fmt: skip


def test_a_sampled_pass_is_compared_with_bare_vllms_sampled_pass() -> None:
    def arm(gap_s: float) -> dict[str, object]:
        return summarize([(float(i), gap_s) for i in range(1, 11)], None) | {"sides": {}}

    doc = {"stamp": "s", "command": "c", "meta": {},
           "params": {"requests": 1, "tokens": 10, "rounds": 1},
           "arms": {"vllm": arm(0.1), "switchyard": arm(0.2),
                    "vllm (sampled)": arm(0.4), "switchyard (sampled)": arm(0.2)}}  # fmt: skip
    rows = {line.split(" | ")[0][2:]: line for line in markdown(doc, "x.png").splitlines()
            if line.startswith("| ") and "ms" not in line and "×" in line}  # fmt: skip
    assert "(2.00×)" in rows["switchyard"]
    assert "(0.50×)" in rows["switchyard (sampled)"]
