"""The rule ``switchyard profile tune`` applies to a measured curve (seed 003 §2.3 A:
raise memory/concurrency until p95 breaks the SLO, keep the last good setting).

The curve: for each value of one knob (``max_num_seqs`` by default), closed-loop runs
at fixed concurrencies relative to that setting's ``max_num_seqs`` (1, ½×, 1×, 1½×);
each run is a ``Point``. The rule, in order:

1. A point *meets the SLO* when every p95 the SLO sets (TTFT, ITL, E2E) is within it
   and its error rate is at most ``max_error_rate``.
2. A point is a *candidate* when its concurrency is one the profile's checks
   (``app.profiles.checks``) accept as ``max_ongoing_requests``: interactive, at most
   ``max_num_seqs``; throughput, at least ``max_num_seqs``; long_context, any.
3. A setting's *best point* is its candidate meeting the SLO with the highest goodput
   (requests per second meeting the SLO; ties: the lower concurrency). A setting whose
   points all break the SLO has none and is never chosen.
4. The chosen setting is the one whose best point has the highest goodput; goodputs
   within ``tie_tolerance`` (relative) of the highest count as ties, and a tie goes to
   the smaller value (less memory) — so raising the knob past the point where p95
   breaks the SLO, or where it stops paying, keeps the last good setting.
5. The chosen ``max_ongoing_requests`` is the best point's concurrency; the
   autoscaling target keeps the catalogue's ratio to it. ``measured`` gets the chosen
   setting's prefill rate at concurrency 1 (prompt tokens / TTFT) and the hardware.
6. Where the profile holds a step to its TTFT SLO (interactive: one full step of
   ``max_num_batched_tokens`` at the measured prefill rate must fit the TTFT p95, the
   check of ``app.profiles.checks``), a step budget above that bound is lowered to it,
   rounded down to STEP_ROUND tokens and not below ``max_num_seqs``, and the
   long-prefill threshold with it: the file written then passes the checks on the
   hardware it was measured on (a slow CPU prefills a few hundred tokens a second).

Nothing meeting the SLO is an error (``NoSettingMeetsSlo``) that names the SLO and the
best p95 seen of each metric it sets. The measuring lives in ``app.bench.tune`` (it
needs the load generator and the application builder, which sit above this layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from app.profiles.catalog import CATALOGUE, Bundle, Measured, ProfileName, Slo
from app.schema import StrictFrozen

Knob = Literal["max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes"]
KNOBS: tuple[Knob, ...] = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes")
MIB = 1024**2
DEFAULT_VALUES: dict[Knob, tuple[int, ...]] = {
    "max_num_seqs": (4, 8, 16, 32, 64),
    "max_num_batched_tokens": (256, 512, 1024, 2048, 4096),
    "kv_cache_memory_bytes": (512 * MIB, 1024 * MIB, 2048 * MIB, 4096 * MIB),
}
DEFAULT_FACTORS: tuple[float, ...] = (0.5, 1.0, 1.5)
MAX_ERROR_RATE = 0.01
STEP_ROUND = 64  # rule 6 rounds a step budget down to this many tokens
TIE_TOLERANCE = 0.02
_METRICS: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))


class Quantiles(StrictFrozen):
    """p50/p95/p99 of one latency in milliseconds (None: nothing measured)."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class Point(StrictFrozen):
    """One closed-loop run: a knob value at a fixed concurrency."""

    value: int = Field(description="The swept knob's value.")
    max_num_seqs: int = Field(ge=1, description="The setting's batch (the knob, or the profile's).")
    concurrency: int = Field(ge=1)
    requests: int = Field(default=0, ge=0, description="Measured (steady-state) requests.")
    goodput: float = Field(default=0.0, ge=0, description="Requests/s meeting the SLO.")
    output_tokens_per_s: float = Field(default=0.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    ttft_ms: Quantiles = Field(default_factory=Quantiles)
    itl_ms: Quantiles = Field(default_factory=Quantiles)
    e2e_ms: Quantiles = Field(default_factory=Quantiles)
    prefill_tokens_per_s: float | None = Field(
        default=None, description="Mean prompt tokens / mean TTFT (meaningful at concurrency 1)."
    )

    def p95(self, metric: str) -> float | None:
        quantiles: Quantiles = getattr(self, f"{metric}_ms")
        return quantiles.p95

    def label(self, knob: str) -> str:
        return f"{knob}={self.value}, concurrency {self.concurrency}"


class NoSettingMeetsSlo(ValueError):
    """No measured setting meets the SLO (the message names it and the best p95s)."""


def concurrencies(max_num_seqs: int, factors: Sequence[float] = DEFAULT_FACTORS) -> list[int]:
    """The closed-loop concurrencies of one setting: 1 and each factor × its batch."""
    return sorted({1, *(max(1, round(f * max_num_seqs)) for f in factors)})


def sweep_values(knob: Knob, own: int | None, values: Sequence[int] | None = None) -> list[int]:
    """The values to measure: the given ones (default ``DEFAULT_VALUES``) and the
    profile's own, ascending."""
    chosen = set(values if values else DEFAULT_VALUES[knob])
    if own is not None:
        chosen.add(own)
    return sorted(chosen)


def violations(point: Point, slo: Slo, max_error_rate: float = MAX_ERROR_RATE) -> list[str]:
    """How ``point`` breaks the SLO (rule 1), one phrase each; empty: it meets it."""
    out: list[str] = []
    if point.requests == 0:
        return ["no request measured"]
    if point.error_rate > max_error_rate:
        out.append(f"error rate {point.error_rate:.1%} > {max_error_rate:.1%}")
    for metric, name in _METRICS:
        limit = getattr(slo, f"{metric}_p95_ms")
        if limit is None:
            continue
        p95 = point.p95(metric)
        if p95 is None:
            out.append(f"no {name} measured")
        elif p95 > limit:
            out.append(f"{name} p95 {p95:.0f} ms > {limit:g} ms")
    return out


def is_candidate(profile: ProfileName, point: Point) -> bool:
    """Whether the profile's checks accept the point's concurrency as
    ``max_ongoing_requests`` (rule 2)."""
    if profile == "interactive":
        return point.concurrency <= point.max_num_seqs
    if profile == "throughput":
        return point.concurrency >= point.max_num_seqs
    return True


def best_points(
    curve: Sequence[Point],
    slo: Slo,
    profile: ProfileName,
    max_error_rate: float = MAX_ERROR_RATE,
) -> dict[int, Point | None]:
    """Each setting's best point (rule 3), None where none is a candidate meeting the SLO."""
    out: dict[int, Point | None] = {}
    for point in sorted(curve, key=lambda p: (p.value, p.concurrency)):
        out.setdefault(point.value, None)
        if not is_candidate(profile, point) or violations(point, slo, max_error_rate):
            continue
        best = out[point.value]
        if best is None or point.goodput > best.goodput:
            out[point.value] = point
    return out


def choose(
    curve: Sequence[Point],
    slo: Slo,
    profile: ProfileName,
    knob: str = "max_num_seqs",
    max_error_rate: float = MAX_ERROR_RATE,
    tie_tolerance: float = TIE_TOLERANCE,
) -> Point:
    """The chosen setting's best point (rule 4); ``NoSettingMeetsSlo`` where none."""
    good = [p for p in best_points(curve, slo, profile, max_error_rate).values() if p]
    if not good:
        raise NoSettingMeetsSlo(_nothing_meets(curve, slo, profile, knob, max_error_rate))
    top = max(p.goodput for p in good)
    return min((p for p in good if p.goodput >= top * (1 - tie_tolerance)), key=lambda p: p.value)


def _nothing_meets(
    curve: Sequence[Point], slo: Slo, profile: ProfileName, knob: str, max_error_rate: float
) -> str:
    head = f"no setting meets the SLO {slo.header()} (error rate <= {max_error_rate:.1%})"
    if not curve:
        return head + ": nothing was measured"
    seen = []
    for metric, name in _METRICS:
        if getattr(slo, f"{metric}_p95_ms") is None:
            continue
        measured = [p for p in curve if p.p95(metric) is not None]
        if measured:
            best = min(measured, key=lambda p: p.p95(metric) or 0.0)
            seen.append(f"{name} p95 {best.p95(metric):.0f} ms ({best.label(knob)})")
        else:
            seen.append(f"no {name} measured")
    lowest = min(curve, key=lambda p: p.error_rate)
    seen.append(f"error rate {lowest.error_rate:.1%} ({lowest.label(knob)})")
    text = f"{head}; best seen: {', '.join(seen)}"
    refused = [p for p in curve if not violations(p, slo, max_error_rate)]
    if refused:
        text += (
            f"; {len(refused)} point(s) met it at a concurrency a {profile} pool's checks "
            "refuse as max_ongoing_requests"
        )
    return text


def tuned_bundle(
    profile: ProfileName,
    slo: Slo,
    knob: Knob,
    chosen: Point,
    curve: Sequence[Point],
    hardware: str | None,
) -> Bundle:
    """The catalogue's bundle with the chosen values, ``slo`` and what was measured
    (rule 5)."""
    base = CATALOGUE[profile]
    ongoing = chosen.concurrency
    update: dict[str, object] = {
        knob: chosen.value,
        "max_ongoing_requests": ongoing,
        "slo": slo.model_dump(exclude_none=True),
    }
    if base.target_ongoing_requests is not None and base.max_ongoing_requests:
        ratio = base.target_ongoing_requests / base.max_ongoing_requests
        update["target_ongoing_requests"] = round(max(ratio * ongoing, 0.5), 2)
    single = [p for p in curve if p.value == chosen.value and p.concurrency == 1]
    rate = single[0].prefill_tokens_per_s if single else None
    measured = Measured(prefill_tokens_per_s=rate or None, hardware=hardware)
    update["measured"] = measured.model_dump(exclude_none=True)
    merged = {**base.model_dump(exclude_none=True), **update}
    step, ttft_ms = merged.get("max_num_batched_tokens"), slo.ttft_p95_ms
    if profile == "interactive" and rate and ttft_ms and isinstance(step, int):
        bound = int(rate * ttft_ms / 1000) // STEP_ROUND * STEP_ROUND
        seqs = merged.get("max_num_seqs")
        bound = max(bound, seqs if isinstance(seqs, int) else 1)
        if step > bound:  # rule 6
            merged["max_num_batched_tokens"] = bound
            threshold = merged.get("long_prefill_token_threshold")
            if isinstance(threshold, int) and threshold > bound:
                merged["long_prefill_token_threshold"] = bound
    return Bundle.model_validate(merged)
