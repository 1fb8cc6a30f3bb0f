"""app.routing.policy: each filter, scorer, the picker and the request class, on
hand-computed tables. No wall-clock assertions."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.routing.policy import (
    FILTERS,
    WINDOW_CHARS,
    Candidate,
    ContextFits,
    CostCeiling,
    CostScore,
    LatencyScore,
    LatencySLO,
    QualityFloor,
    QualityScore,
    RequestFeatures,
    choose,
    classify,
    difficulty,
    estimate,
    estimated_cost_usd,
    estimated_latency_ms,
    features,
    lower_is_better,
    quality_floor,
)
from app.routing.spec import ModelProfile, Policy, Weights


def cand(name: str, live_ttft: float | None = None, live_itl: float | None = None,
         **profile: Any) -> Candidate:  # fmt: skip
    return Candidate(name, ModelProfile(**profile), live_ttft, live_itl)


def policy(names: list[str] | None = None, **kw: Any) -> Policy:
    return Policy(candidates=names or ["x"], **kw)


F = RequestFeatures(prompt_tokens=1000, max_tokens=101)


# ------------------------------------------------------------------------- filters
@pytest.mark.parametrize(
    ("flt", "pol", "f", "profiles", "dropped"),
    [
        # context: needs 1000 + 101 = 1101 tokens; 1101 fits exactly.
        (
            ContextFits(), policy(), F,
            {"a": {"max_context": 1100}, "b": {"max_context": 1101}, "c": {"max_context": 8192}},
            {"a": "needs 1101 tokens > max_context 1100"},
        ),
        # quality: floor 0.5, equal passes.
        (
            QualityFloor(), policy(quality_floor=0.5), F,
            {"a": {"quality": 0.49}, "b": {"quality": 0.5}, "c": {"quality": 0.9}},
            {"a": "0.49 < floor 0.5"},
        ),
        (  # no floor at all: nothing dropped
            QualityFloor(), policy(), F, {"a": {"quality": 0.0}, "b": {"quality": 1.0}}, {},
        ),
        # cost: 1000 * in/1e6 + 101 * out/1e6; ceiling equal passes.
        (
            CostCeiling(), policy(cost_ceiling_usd=0.00201), F,
            {"a": {"input_per_1m": 1, "output_per_1m": 10},  # 0.001 + 0.00101 = 0.00201
             "b": {"input_per_1m": 2, "output_per_1m": 10},  # 0.00301
             "c": {}},  # free
            {"b": "estimated $0.00301 > ceiling $0.00201"},
        ),
        (CostCeiling(), policy(), F, {"a": {"input_per_1m": 1e6}}, {}),
        # latency: ttft + itl * 100; SLO 1100 ms, equal passes; unknown passes.
        (
            LatencySLO(), policy(latency_slo_ms=1100), F,
            {"a": {"p95_ttft_ms": 100, "p95_itl_ms": 10},  # 1100
             "b": {"p95_ttft_ms": 101, "p95_itl_ms": 10},  # 1101
             "c": {}},  # unknown
            {"b": "estimated 1101 ms > SLO 1100 ms"},
        ),
        (LatencySLO(), policy(), F, {"a": {"p95_ttft_ms": 1e9}}, {}),
    ],
)  # fmt: skip
def test_filter_drops_exactly_the_violators(
    flt: Any, pol: Policy, f: RequestFeatures, profiles: dict[str, dict[str, Any]],
    dropped: dict[str, str],
) -> None:  # fmt: skip
    cands = [cand(n, **p) for n, p in profiles.items()]
    got = {c.model: why for c in cands if (why := flt(estimate(c, f), pol, f)) is not None}
    assert got == dropped
    # Through choose() with only this filter, the reason is prefixed with the filter name
    # and every other candidate survives to be scored.
    choice = choose(pol, cands, f, filters=(flt,))
    assert choice.dropped == {m: f"{flt.name}: {r}" for m, r in dropped.items()}
    assert set(choice.scores) == {c.model for c in cands} - set(dropped)


@pytest.mark.parametrize(
    ("floor", "tenant_floors", "tenant", "expected"),
    [
        (None, {}, None, None),
        (0.5, {}, None, 0.5),
        (0.5, {"acme": 0.7}, "acme", 0.7),  # tenant stricter: tenant wins
        (0.5, {"acme": 0.7}, "other", 0.5),  # other tenant: policy floor
        (0.5, {"lax": 0.2}, "lax", 0.5),  # tenant laxer: policy floor still holds
        (None, {"acme": 0.7}, "acme", 0.7),
        (None, {"acme": 0.7}, None, None),
    ],
)
def test_quality_floor_is_the_stricter_of_policy_and_tenant(
    floor: float | None, tenant_floors: dict[str, float], tenant: str | None,
    expected: float | None,
) -> None:  # fmt: skip
    pol = policy(quality_floor=floor, tenant_quality_floors=tenant_floors)
    assert quality_floor(pol, tenant) == expected


def test_tenant_quality_floor_drops_more_for_that_tenant() -> None:
    pol = policy(quality_floor=0.5, tenant_quality_floors={"acme": 0.7})
    cands = [cand("lo", quality=0.4), cand("mid", quality=0.6), cand("hi", quality=0.8)]
    acme = choose(pol, cands, RequestFeatures(10, 10, tenant="acme"))
    other = choose(pol, cands, RequestFeatures(10, 10, tenant="other"))
    assert acme.dropped == {"lo": "quality: 0.4 < floor 0.7", "mid": "quality: 0.6 < floor 0.7"}
    assert other.dropped == {"lo": "quality: 0.4 < floor 0.5"}
    assert acme.model == "hi"


def test_first_failing_filter_gives_the_reason_and_all_dropped_picks_none() -> None:
    pol = policy(quality_floor=0.5, cost_ceiling_usd=0.0)
    cands = [
        cand("both", quality=0.1, max_context=16),  # context and quality: context first
        cand("q", quality=0.1),
        cand("cost", quality=0.9, input_per_1m=1.0),
    ]
    choice = choose(pol, cands, RequestFeatures(10, 10))
    assert choice.model is None
    assert choice.scores == {}
    assert choice.dropped == {
        "both": "context: needs 20 tokens > max_context 16",
        "q": "quality: 0.1 < floor 0.5",
        "cost": "cost: estimated $1e-05 > ceiling $0",
    }
    assert [flt.name for flt in FILTERS] == ["context", "quality", "cost", "latency"]


# ----------------------------------------------------------------------- estimates
@pytest.mark.parametrize(
    ("profile", "live_ttft", "live_itl", "expected"),
    [
        ({"p95_ttft_ms": 100, "p95_itl_ms": 10}, None, None, 100 + 10 * 100),
        ({"p95_ttft_ms": 100, "p95_itl_ms": 10}, 50, None, 50 + 10 * 100),  # live TTFT wins
        ({"p95_ttft_ms": 100, "p95_itl_ms": 10}, None, 2, 100 + 2 * 100),  # live ITL wins
        ({}, 50, 2, 50 + 2 * 100),  # live only
        ({"p95_ttft_ms": 100}, None, None, 100),  # unknown ITL counts 0
        ({"p95_itl_ms": 10}, None, None, 1000),  # unknown TTFT counts 0
        ({}, None, None, None),
    ],
)
def test_estimated_latency_prefers_live_values(
    profile: dict[str, Any], live_ttft: float | None, live_itl: float | None,
    expected: float | None,
) -> None:  # fmt: skip
    assert estimated_latency_ms(cand("m", live_ttft, live_itl, **profile), F) == expected


def test_estimated_cost_per_million_tokens() -> None:
    p = ModelProfile(input_per_1m=2.0, output_per_1m=8.0, cached_input_per_1m=0.5)
    assert estimated_cost_usd(p, F) == pytest.approx((1000 * 2.0 + 101 * 8.0) / 1e6)


def test_live_latency_overrides_the_profile_in_the_pick() -> None:
    pol = policy(weights=Weights(quality=0, latency=1, cost=0))
    declared = [
        cand("a", p95_ttft_ms=100, p95_itl_ms=10),
        cand("b", p95_ttft_ms=300, p95_itl_ms=30),
    ]
    assert choose(pol, declared, F).model == "a"
    measured = [declared[0], cand("b", 50, 5, p95_ttft_ms=300, p95_itl_ms=30)]
    assert choose(pol, measured, F).model == "b"


# ------------------------------------------------------------------------- scorers
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([10, 20, 30], [1.0, 0.5, 0.0]),
        ([30, 10, 20], [0.0, 1.0, 0.5]),
        ([5, 5], [1.0, 1.0]),
        ([7], [1.0]),
        ([None, None], [1.0, 1.0]),
        ([10, None, 30], [1.0, 0.0, 0.0]),  # unknown ranks with the slowest
        ([10, None, 10], [1.0, 0.0, 1.0]),
        ([20, 10, None, 15], [0.0, 1.0, 0.0, 0.5]),
    ],
)
def test_lower_is_better_normalisation(values: list[float | None], expected: list[float]) -> None:
    assert lower_is_better(values) == pytest.approx(expected)


# Three candidates, prompt 1000, max_tokens 11 (latency = ttft + 10 * itl):
#   a: quality 0.9, latency 600, cost 0.003165
#   b: quality 0.6, latency 200, cost 0.001055
#   c: quality 0.3, latency 400, cost 0.0005275
ABC = [
    cand("a", quality=0.9, input_per_1m=3, output_per_1m=15, p95_ttft_ms=300, p95_itl_ms=30),
    cand("b", quality=0.6, input_per_1m=1, output_per_1m=5, p95_ttft_ms=100, p95_itl_ms=10),
    cand("c", quality=0.3, input_per_1m=0.5, output_per_1m=2.5, p95_ttft_ms=200, p95_itl_ms=20),
]
F11 = RequestFeatures(prompt_tokens=1000, max_tokens=11)


@pytest.mark.parametrize(
    ("scorer", "expected"),
    [
        (QualityScore(), [0.9, 0.6, 0.3]),  # as declared, not stretched
        (LatencyScore(), [0.0, 1.0, 0.5]),  # (600 - x) / 400
        (CostScore(), [0.0, 0.8, 1.0]),  # (0.003165 - x) / 0.0026375
    ],
)
def test_scorers_hand_computed(scorer: Any, expected: list[float]) -> None:
    rows = [estimate(c, F11) for c in ABC]
    assert scorer(rows, F11) == pytest.approx(expected)


def test_weighted_total_hand_computed() -> None:
    choice = choose(policy(), ABC, F11)  # default weights 0.5 / 0.3 / 0.2
    assert choice.scores == pytest.approx({
        "a": 0.5 * 0.9 + 0.3 * 0.0 + 0.2 * 0.0,
        "b": 0.5 * 0.6 + 0.3 * 1.0 + 0.2 * 0.8,
        "c": 0.5 * 0.3 + 0.3 * 0.5 + 0.2 * 1.0,
    })  # fmt: skip
    assert choice.model == "b"


@pytest.mark.parametrize(
    ("weights", "pick", "scores"),
    [
        (Weights(quality=1, latency=0, cost=0), "a", {"a": 0.9, "b": 0.6, "c": 0.3}),
        (Weights(quality=0, latency=1, cost=0), "b", {"a": 0.0, "b": 1.0, "c": 0.5}),
        (Weights(quality=0, latency=0, cost=1), "c", {"a": 0.0, "b": 0.8, "c": 1.0}),
        # weights are normalised by their sum: x10 changes nothing
        (Weights(quality=10, latency=0, cost=0), "a", {"a": 0.9, "b": 0.6, "c": 0.3}),
        (Weights(quality=1, latency=0, cost=1), "b", {"a": 0.45, "b": 0.7, "c": 0.65}),
    ],
)
def test_weights_change_the_pick(weights: Weights, pick: str, scores: dict[str, float]) -> None:
    choice = choose(policy(weights=weights), ABC, F11)
    assert choice.model == pick
    assert choice.scores == pytest.approx(scores)


# -------------------------------------------------------------------------- picker
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_ties_broken_by_lower_cost_then_name(order: tuple[int, int, int]) -> None:
    only_quality = policy(weights=Weights(quality=1, latency=0, cost=0))
    same_q = [
        cand("z-cheap", quality=0.7, input_per_1m=1.0),
        cand("a-dear", quality=0.7, input_per_1m=2.0),
        cand("m-dear", quality=0.7, input_per_1m=2.0),
    ]
    cands = [same_q[i] for i in order]
    assert choose(only_quality, cands, F).model == "z-cheap"
    assert choose(only_quality, [c for c in cands if "dear" in c.model], F).model == "a-dear"


def test_zero_weights_fall_back_to_the_tie_break() -> None:
    pol = policy(weights=Weights(quality=0, latency=0, cost=0))
    choice = choose(pol, ABC, F11)
    assert choice.scores == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert choice.model == "c"  # cheapest


def test_float_noise_does_not_break_a_tie() -> None:
    # 0.1 + 0.2 != 0.3 in floating point; both are "0.3" to the picker.
    pol = policy(weights=Weights(quality=1, latency=0, cost=0))
    cands = [cand("b", quality=0.1 + 0.2, input_per_1m=2), cand("a", quality=0.3, input_per_1m=1)]
    assert choose(pol, cands, F).model == "a"  # lower cost, not the 4e-17 higher score


# ---------------------------------------------------------------------------- units
@pytest.mark.parametrize("factor", [1e-3, 1000.0, 1e6])
def test_scaling_prices_or_latencies_changes_no_score(factor: float) -> None:
    def scaled(c: Candidate, what: tuple[str, ...]) -> Candidate:
        p = c.profile
        upd = {k: getattr(p, k) * factor for k in what}
        return Candidate(c.model, p.model_copy(update=upd))

    base = choose(policy(), ABC, F11)
    for what in (("input_per_1m", "output_per_1m"), ("p95_ttft_ms", "p95_itl_ms")):
        other = choose(policy(), [scaled(c, what) for c in ABC], F11)
        assert other.model == base.model
        assert other.scores == pytest.approx(base.scores)


def test_only_cost_differs_proportionally_pick_follows_cost_at_any_scale() -> None:
    for factor in (1.0, 1000.0):
        cands = [
            cand("x", quality=0.5, input_per_1m=3 * factor, output_per_1m=3 * factor),
            cand("y", quality=0.5, input_per_1m=1 * factor, output_per_1m=1 * factor),
            cand("z", quality=0.5, input_per_1m=2 * factor, output_per_1m=2 * factor),
        ]
        choice = choose(policy(), cands, F)
        assert choice.model == "y"
        # quality 0.5 * 0.5 + latency (all unknown -> 1) * 0.3 + cost * 0.2
        assert choice.scores == pytest.approx({"x": 0.55, "y": 0.75, "z": 0.65})


def test_every_total_stays_in_unit_interval() -> None:
    rng = random.Random(7)
    for _ in range(50):
        cands = [
            cand(
                f"m{i}",
                quality=rng.random(),
                input_per_1m=rng.uniform(0, 100),
                output_per_1m=rng.uniform(0, 100),
                p95_ttft_ms=rng.choice([None, rng.uniform(1, 5000)]),
                p95_itl_ms=rng.choice([None, rng.uniform(1, 200)]),
            )
            for i in range(8)
        ]
        w = Weights(quality=rng.uniform(0, 5), latency=rng.uniform(0, 5), cost=rng.uniform(0, 5))
        choice = choose(policy(weights=w), cands, F)
        assert all(0.0 <= s <= 1.0 + 1e-12 for s in choice.scores.values())
        assert choice.model is not None
        assert choice.scores[choice.model] == pytest.approx(max(choice.scores.values()))


# ------------------------------------------------------------------- request class
@pytest.mark.parametrize(
    ("prompt", "out", "diff", "expected"),
    [
        (0, 1, 0.0, "prompt=short|output=short|difficulty=easy"),
        (511, 255, 0.339, "prompt=short|output=short|difficulty=easy"),
        (512, 256, 0.34, "prompt=medium|output=medium|difficulty=medium"),
        (4095, 1023, 0.669, "prompt=medium|output=medium|difficulty=medium"),
        (4096, 1024, 0.67, "prompt=long|output=long|difficulty=hard"),
        (100_000, 8192, 1.0, "prompt=long|output=long|difficulty=hard"),
        (4096, 10, 0.5, "prompt=long|output=short|difficulty=medium"),
    ],
)
def test_classify_thresholds(prompt: int, out: int, diff: float, expected: str) -> None:
    f = RequestFeatures(prompt_tokens=prompt, max_tokens=out, difficulty_hint=diff)
    assert classify(f) == expected
    assert choose(policy(), [cand("m")], f).request_class == expected


@pytest.mark.parametrize(
    ("easier", "harder"),
    [
        ("hi", "Prove step by step that the algorithm's complexity is O(n log n)."),
        ("What is the capital of France?", "Explain why this code fails and debug it."),
        ("Say hello.", "Say hello. " * 400),  # length alone
        ("Why?", "Why? How? When? Where?"),  # several questions
        ("Analyze this.", "Analyze this.\n```python\ndef f(x):\n    return x\n```"),
    ],
)
def test_difficulty_orders_prompts(easier: str, harder: str) -> None:
    assert 0.0 <= difficulty(easier) < difficulty(harder) <= 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prove it", 0.2),  # the window start counts as a word start
        ("please improve and approve it", 0.0),  # not " prove"
        ("decode the barcode", 0.0),  # not " code"
        ("Proof:\nthe code", 0.4),  # two concepts; a newline starts a word
        ("prove and proof", 0.2),  # one concept, counted once
        ("analyze, analyse, analysis", 0.2),
        ("x = 1;\n", 0.15),  # code marker only
        ("a? b?", 0.1 / 3),  # two question marks: (2 - 1) / 3 of 0.1
    ],
)
def test_difficulty_terms(text: str, expected: float) -> None:
    length_term = 0.15 * len(text) / 4000
    assert difficulty(text) == pytest.approx(expected + length_term)


def test_difficulty_reads_only_the_last_window() -> None:
    filler = "x" * WINDOW_CHARS
    # The keyword before the window is not seen; the length term is the same for both.
    assert difficulty("prove " + filler) == pytest.approx(difficulty("xxxxxx" + filler))
    assert difficulty(filler + " prove") > difficulty(filler + " xxxxx")


def test_difficulty_is_bounded_and_features_carries_it() -> None:
    everything = "prove derive theorem step by step analyze debug explain why code algorithm "
    text = (everything + "?```\ndef f(): pass\n") * 200
    assert difficulty(text) == 1.0
    assert difficulty("") == 0.0
    f = features("Prove it, step by step.", 12, 64, "acme")
    assert f == RequestFeatures(12, 64, "acme", 23, difficulty("Prove it, step by step."))
    assert f.difficulty_hint == pytest.approx(0.4 + 0.15 * 23 / 4000)


# --------------------------------------------------------------------- the record
def test_timings_only_when_asked_and_reason_names_pick_and_drops() -> None:
    pol = policy(quality_floor=0.5)
    assert choose(pol, ABC, F11).timings_us == {}
    timed = choose(pol, ABC, F11, timed=True)
    assert list(timed.timings_us) == [
        "estimate", "filter.context", "filter.quality", "filter.cost", "filter.latency",
        "score.quality", "score.latency", "score.cost", "pick",
    ]  # fmt: skip
    assert all(v >= 0 for v in timed.timings_us.values())
    assert timed.model == choose(pol, ABC, F11).model == "b"
    line = timed.reason()
    assert "picked=b" in line
    assert "dropped=c(quality: 0.3 < floor 0.5)" in line
    assert line.index("b:") < line.index("a:")  # best first
