"""Policy routing: pick one model among an alias's candidates for one request.

Rule. Hard limits first, then a weighted sum of normalised 0–1 scores:

1. Estimate per candidate (``estimate``):
     cost_usd   = prompt_tokens * input_per_1m / 1e6 + max_tokens * output_per_1m / 1e6
                  (uncached input price: an upper bound; the cache hit is unknown here)
     latency_ms = p95_ttft + p95_itl * (max_tokens - 1), live measurements winning over
                  the declared profile per term; an unknown term counts as 0 and the
                  whole estimate is None when both are unknown.
2. Filters, in order; the first that objects drops the candidate and its reason is kept:
     context  prompt_tokens + max_tokens <= profile.max_context
     quality  profile.quality_score >= max(policy.quality_floor, tenant_quality_floors[tenant])
     cost     cost_usd <= policy.cost_ceiling_usd
     latency  latency_ms <= policy.latency_slo_ms; an UNKNOWN latency passes (an
              unmeasured pool must get traffic to be measured; the latency scorer ranks
              it last instead).
3. Scorers, each 0–1 over the survivors only (so units never mix):
     quality  the profile's quality, declared or measured (already 0–1)
     latency  1 for the fastest, 0 for the slowest, linear between; all equal or all
              unknown -> 1; unknown on some -> 0 (ranked with the slowest)
     cost     1 for the cheapest, 0 for the most expensive, linear between; all equal -> 1
   total = sum(w_s * score_s) / sum(w_s) with w = policy.weights (scorers of weight 0 are
   skipped; all weights 0 -> every total is 0 and the tie-break decides).
4. Picker: highest total (compared rounded to 1e-9), then lower cost_usd, then model name.

Everything is a pure function of (policy, candidates, features), so a logged
``PolicyChoice`` (class, scores, drops) plus the inputs reproduces the decision.
Candidate model names are assumed unique within one call. The request class (``classify``)
is recorded for logs and per-class metrics; no scorer reads the difficulty (yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import NamedTuple, Protocol

from app.routing.spec import ModelProfile, Policy


@dataclass(frozen=True)
class Candidate:
    model: str
    profile: ModelProfile
    live_p95_ttft_ms: float | None = None
    live_p95_itl_ms: float | None = None


@dataclass(frozen=True)
class RequestFeatures:
    prompt_tokens: int
    max_tokens: int
    tenant: str | None = None
    prompt_chars: int = 0
    difficulty_hint: float = 0.0


# ----------------------------------------------------------------- request features
# Difficulty heuristic, in [0, 1]. It reads only the LAST 2,048 characters of the prompt
# (a chat's final user turn sits there), so its cost is bounded whatever the prompt length:
#   keywords   0.2 per DISTINCT concept of _HARD starting a word (after a space, a newline
#              or the window start: "improve" is not "prove"), at most 0.6
#   code       0.15 when the window holds a code marker (_CODE: ``` fence, "\ndef ", ";\n")
#   length     0.15 * min(chars of the whole prompt / 4000, 1)
#   questions  0.1 * min((question marks in the window - 1) / 3, 1): several asks, more work
WINDOW_CHARS = 2048
_HARD = (  # concept -> its spellings; " analy" = analyze/analyse/analysis, " optimi" likewise
    (" prove", " proof"), (" derive",), (" theorem",), (" step by step", " step-by-step"),
    (" analy",), (" debug",), (" explain why",), (" code",), (" algorithm",),
    (" complexity",), (" optimi",), (" refactor",), (" implement",),
)  # fmt: skip
_NEEDLES = tuple((i, v) for i, variants in enumerate(_HARD) for v in variants)
_CODE = ("```", "\ndef ", "\nclass ", "\nimport ", "#include", ";\n", "{\n")


def difficulty(prompt_text: str) -> float:
    window = prompt_text[-WINDOW_CHARS:].lower()
    words = " " + window.replace("\n", " ")
    score = min(0.2 * len({i for i, v in _NEEDLES if v in words}), 0.6)
    for marker in _CODE:
        if marker in window:
            score += 0.15
            break
    score += 0.15 * min(len(prompt_text) / 4000.0, 1.0)
    questions = window.count("?")
    if questions > 1:
        score += 0.1 * min((questions - 1) / 3.0, 1.0)
    return min(score, 1.0)


def features(
    prompt_text: str, prompt_tokens: int, max_tokens: int, tenant: str | None
) -> RequestFeatures:
    n = len(prompt_text)
    return RequestFeatures(prompt_tokens, max_tokens, tenant, n, difficulty(prompt_text))


# Class thresholds (lower bound inclusive for the bigger bucket):
#   prompt tokens   short < 512 <= medium < 4096 <= long
#   max_tokens      short < 256 <= medium < 1024 <= long
#   difficulty      easy < 0.34 <= medium < 0.67 <= hard
PROMPT_BOUNDS = (512, 4096)
OUTPUT_BOUNDS = (256, 1024)
DIFFICULTY_BOUNDS = (0.34, 0.67)
_SIZE = ("short", "medium", "long")
_DIFF = ("easy", "medium", "hard")
_CLASSES = {
    (p, o, d): f"prompt={_SIZE[p]}|output={_SIZE[o]}|difficulty={_DIFF[d]}"
    for p in range(3) for o in range(3) for d in range(3)
}  # fmt: skip


def _bucket(value: float, bounds: tuple[float, float]) -> int:
    return 0 if value < bounds[0] else 1 if value < bounds[1] else 2


def classify(f: RequestFeatures) -> str:
    return _CLASSES[
        _bucket(f.prompt_tokens, PROMPT_BOUNDS),
        _bucket(f.max_tokens, OUTPUT_BOUNDS),
        _bucket(f.difficulty_hint, DIFFICULTY_BOUNDS),
    ]


# ------------------------------------------------------------------------ estimates
def estimated_cost_usd(profile: ModelProfile, f: RequestFeatures) -> float:
    return (f.prompt_tokens * profile.input_per_1m + f.max_tokens * profile.output_per_1m) / 1e6


def estimated_latency_ms(c: Candidate, f: RequestFeatures) -> float | None:
    ttft = c.live_p95_ttft_ms if c.live_p95_ttft_ms is not None else c.profile.p95_ttft_ms
    itl = c.live_p95_itl_ms if c.live_p95_itl_ms is not None else c.profile.p95_itl_ms
    if ttft is None and itl is None:
        return None
    return (ttft or 0.0) + (itl or 0.0) * max(f.max_tokens - 1, 0)


class Estimate(NamedTuple):
    candidate: Candidate
    cost_usd: float
    latency_ms: float | None


def estimate(c: Candidate, f: RequestFeatures) -> Estimate:
    return Estimate(c, estimated_cost_usd(c.profile, f), estimated_latency_ms(c, f))


# -------------------------------------------------------------------------- filters
class Filter(Protocol):
    """None keeps the candidate; a string drops it and says why."""

    name: str

    def __call__(self, e: Estimate, policy: Policy, f: RequestFeatures) -> str | None: ...


class ContextFits:
    name = "context"

    def __call__(self, e: Estimate, policy: Policy, f: RequestFeatures) -> str | None:
        need, have = f.prompt_tokens + f.max_tokens, e.candidate.profile.max_context
        return None if need <= have else f"needs {need} tokens > max_context {have}"


def quality_floor(policy: Policy, tenant: str | None) -> float | None:
    """The stricter of the policy floor and the tenant's floor; None when neither is set."""
    floor = policy.quality_floor
    if tenant is not None:
        t = policy.tenant_quality_floors.get(tenant)
        if t is not None and (floor is None or t > floor):
            floor = t
    return floor


class QualityFloor:
    name = "quality"

    def __call__(self, e: Estimate, policy: Policy, f: RequestFeatures) -> str | None:
        floor = quality_floor(policy, f.tenant)
        q = e.candidate.profile.quality_score
        return None if floor is None or q >= floor else f"{q:g} < floor {floor:g}"


class CostCeiling:
    name = "cost"

    def __call__(self, e: Estimate, policy: Policy, f: RequestFeatures) -> str | None:
        cap = policy.cost_ceiling_usd
        if cap is None or e.cost_usd <= cap:
            return None
        return f"estimated ${e.cost_usd:.6g} > ceiling ${cap:.6g}"


class LatencySLO:
    name = "latency"

    def __call__(self, e: Estimate, policy: Policy, f: RequestFeatures) -> str | None:
        slo, ms = policy.latency_slo_ms, e.latency_ms
        if slo is None or ms is None or ms <= slo:
            return None
        return f"estimated {ms:.6g} ms > SLO {slo:g} ms"


FILTERS: tuple[Filter, ...] = (ContextFits(), QualityFloor(), CostCeiling(), LatencySLO())


# -------------------------------------------------------------------------- scorers
class Scorer(Protocol):
    """One score in [0, 1] per row, in order; ``name`` is also its key in policy.weights."""

    name: str

    def __call__(self, rows: Sequence[Estimate], f: RequestFeatures) -> list[float]: ...


def lower_is_better(values: Sequence[float | None]) -> list[float]:
    """Min-max normalisation: lowest -> 1, highest -> 0, linear between; None -> 0 (worst);
    all equal or all None -> 1 for the known ones."""
    known = [v for v in values if v is not None]
    if not known:
        return [1.0] * len(values)
    lo, hi = min(known), max(known)
    span = hi - lo
    if span <= 0:
        return [0.0 if v is None else 1.0 for v in values]
    return [0.0 if v is None else (hi - v) / span for v in values]


class QualityScore:
    name = "quality"

    def __call__(self, rows: Sequence[Estimate], f: RequestFeatures) -> list[float]:
        return [r.candidate.profile.quality_score for r in rows]


class LatencyScore:
    name = "latency"

    def __call__(self, rows: Sequence[Estimate], f: RequestFeatures) -> list[float]:
        return lower_is_better([r.latency_ms for r in rows])


class CostScore:
    name = "cost"

    def __call__(self, rows: Sequence[Estimate], f: RequestFeatures) -> list[float]:
        return lower_is_better([r.cost_usd for r in rows])


SCORERS: tuple[Scorer, ...] = (QualityScore(), LatencyScore(), CostScore())


# --------------------------------------------------------------------- choose (loop)
@dataclass(frozen=True)
class PolicyChoice:
    model: str | None
    request_class: str
    scores: dict[str, float]  # survivor -> weighted total in [0, 1]
    dropped: dict[str, str]  # model -> "filter: reason"
    timings_us: dict[str, float] = field(default_factory=dict)  # plugin -> µs (timed only)

    def reason(self) -> str:
        """One log line that explains the pick."""
        ranked = sorted(self.scores.items(), key=lambda kv: -kv[1])
        parts = [f"class={self.request_class}", f"picked={self.model}"]
        parts.append("scores=" + ",".join(f"{m}:{s:.4f}" for m, s in ranked))
        if self.dropped:
            parts.append("dropped=" + "; ".join(f"{m}({r})" for m, r in self.dropped.items()))
        return " ".join(parts)


def choose(
    policy: Policy,
    candidates: Sequence[Candidate],
    f: RequestFeatures,
    *,
    timed: bool = False,
    filters: Sequence[Filter] = FILTERS,
    scorers: Sequence[Scorer] = SCORERS,
) -> PolicyChoice:
    timings: dict[str, float] = {}
    t0 = perf_counter_ns() if timed else 0
    request_class = classify(f)
    rows = [estimate(c, f) for c in candidates]
    if timed:
        t0 = _lap(timings, "estimate", t0)
    dropped: dict[str, str] = {}
    for flt in filters:
        keep: list[Estimate] = []
        for r in rows:
            why = flt(r, policy, f)
            if why is None:
                keep.append(r)
            else:
                dropped[r.candidate.model] = f"{flt.name}: {why}"
        rows = keep
        if timed:
            t0 = _lap(timings, "filter." + flt.name, t0)
    if not rows:
        return PolicyChoice(None, request_class, {}, dropped, timings)

    weights = policy.weights
    totals = [0.0] * len(rows)
    weight_sum = 0.0
    for scorer in scorers:
        w = getattr(weights, scorer.name)
        if w <= 0:
            continue
        weight_sum += w
        for i, s in enumerate(scorer(rows, f)):
            totals[i] += w * s
        if timed:
            t0 = _lap(timings, "score." + scorer.name, t0)
    if weight_sum > 0:
        totals = [t / weight_sum for t in totals]

    best = 0
    best_key = (round(totals[0], 9), -rows[0].cost_usd)
    for i in range(1, len(rows)):
        key = (round(totals[i], 9), -rows[i].cost_usd)
        if key > best_key or (
            key == best_key and rows[i].candidate.model < rows[best].candidate.model
        ):
            best, best_key = i, key
    scores = {r.candidate.model: t for r, t in zip(rows, totals, strict=True)}
    if timed:
        _lap(timings, "pick", t0)
    return PolicyChoice(rows[best].candidate.model, request_class, scores, dropped, timings)


def _lap(timings: dict[str, float], name: str, since_ns: int) -> int:
    now = perf_counter_ns()
    timings[name] = (now - since_ns) / 1000.0
    return now
