"""Capacity plan from measured profile curves (``switchyard plan``): for each workload
class of a traffic mix, the cheapest measured operating point that meets the class's
SLO, and the replicas, GPUs, monthly cost and utilisation it implies.

Inputs: the total offered rate ``rps`` (requests/s); a ``Mix`` (``app.cost.mix``),
each with its ``share`` of the traffic (shares sum to 1), optionally the tokens of its
requests, the profiles it may use and its own SLO (else the plan's); measured
``Curve``\\ s, one per profile tune report (a profile, its hardware class, the workload
it was measured with, its error budget and its points: a knob value at a closed-loop
concurrency with goodput, error rate and p95s); and ``Pricing`` (``gpu_hourly`` $ per
GPU-hour, ``gpus_per_replica``, ``spare_replicas``).

Rules. 0. The curves come from one hardware class (``select_hardware``): those whose
class contains the ``--hardware`` asked for, refused when none does or when they span
several classes (one price is for one class). Then per class (``rps_c = rps × share``):

1. A curve *covers* the class when the class allows its profile and the class's input
   and output tokens (where given) are at most those the curve was measured with.
2. A point is a *candidate* when it is deployable (its concurrency is one the profile's
   checks accept as ``max_ongoing_requests``, decided when the report is read), its
   error rate is at most the curve's ``max_error_rate``, every p95 the class's SLO sets
   (TTFT, ITL, E2E) is within it, and its goodput is above zero.
3. Per candidate, with ``g`` its goodput (requests/s meeting the SLO the report was
   tuned to, in a closed loop: no request ever waits) and ``q`` the rate at which
   requests arriving at random still meet the class's TTFT (else E2E) limit at p95,
   their wait for one of the point's ``concurrency`` slots included (``app.cost.
   queueing``: M/M/c with the point's median E2E as service time, the wait budget being
   the limit minus the point's own p95; no such limit: no ``q``): capacity ``k =
   min(g, q)``; replicas needed ``n = ceil(rps_c / k)``; replicas ``n +
   spare_replicas`` (N+1 by default); GPUs = replicas × ``gpus_per_replica``; monthly
   cost = GPUs × ``gpu_hourly`` × HOURS_PER_MONTH (730); utilisation = ``rps_c / (n ×
   g)`` (of the measured capacity; the spare excluded). A point with ``k = 0`` is no
   candidate (no room to wait).
4. The class gets the cheapest candidate; among equal costs, one whose goodput was
   counted under an SLO at least as strict as the class's (``conservative``), then the
   higher goodput (more headroom), then the lower concurrency. Every candidate is
   reported, and every point that is none with why.
5. A class without a covering curve or without a candidate is refused
   (``PlanRefused``), naming the class, its SLO and the nearest measured point (the
   deployable point whose worst p95/limit or error-rate/budget ratio is lowest).

A goodput counted under a looser SLO than the class's (``conservative`` false) may
overstate the requests meeting the class's SLO; the p95s still meet it. One pool per
class: classes that pick the same point are not merged into one pool. The plan's
totals are the sums over its classes; its utilisation is ``rps`` over the summed
goodput of the replicas needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.cost.mix import METRICS, Mix, Objective, WorkloadClass
from app.cost.model import HOURS_PER_MONTH
from app.cost.queueing import max_rate

_CEIL_SLACK = 1e-9  # rps_c / g a rounding error above an integer needs no more replicas


class PlanRefused(ValueError):
    """No measured point serves a class within its SLO (the message says why)."""


@dataclass(frozen=True)
class MeasuredPoint:
    value: int  # the swept knob's value
    concurrency: int
    goodput: float  # requests/s meeting the report's own SLO
    error_rate: float
    p95_ms: dict[str, float | None]  # ttft, itl, e2e
    deployable: bool = True
    service_s: float | None = None  # median E2E: how long a request holds its slot


@dataclass(frozen=True)
class Curve:
    source: str  # the report's file name
    profile: str
    hardware: str
    knob: str
    input_tokens: int
    output_tokens: int
    max_error_rate: float
    slo: Objective  # the SLO its goodput was counted under
    points: tuple[MeasuredPoint, ...]


@dataclass(frozen=True)
class Pricing:
    gpu_hourly: float
    gpus_per_replica: int = 1
    spare_replicas: int = 1


@dataclass(frozen=True)
class Candidate:
    source: str
    profile: str
    knob: str
    value: int
    concurrency: int
    goodput: float
    conservative: bool
    queue_rate: float | None  # requests/s arriving at random that meet the SLO (rule 3)
    capacity: float  # min(goodput, queue_rate): what one replica is planned to take
    replicas_needed: int
    replicas: int
    gpus: int
    monthly_cost: float
    utilisation: float


@dataclass(frozen=True)
class ClassPlan:
    name: str
    share: float
    rps: float
    slo: Objective
    chosen: Candidate
    candidates: tuple[Candidate, ...]  # cheapest first
    not_covering: tuple[str, ...]  # curves left out by rule 1, with the reason
    rejected: tuple[str, ...] = ()  # points of covering curves failing rule 2, with why


@dataclass(frozen=True)
class Plan:
    rps: float
    pricing: Pricing
    classes: tuple[ClassPlan, ...]

    @property
    def replicas(self) -> int:
        return sum(c.chosen.replicas for c in self.classes)

    @property
    def gpus(self) -> int:
        return sum(c.chosen.gpus for c in self.classes)

    @property
    def monthly_cost(self) -> float:
        return sum(c.chosen.monthly_cost for c in self.classes)

    @property
    def utilisation(self) -> float:
        """Offered requests / the goodput of the replicas needed (spares excluded)."""
        capacity = sum(c.chosen.replicas_needed * c.chosen.goodput for c in self.classes)
        return self.rps / capacity


def violations(point: MeasuredPoint, slo: Objective, max_error_rate: float) -> list[str]:
    """How a point breaks the SLO or the error budget (rule 2); empty: it meets both."""
    out = []
    if point.error_rate > max_error_rate:
        out.append(f"error rate {point.error_rate:.1%} > {max_error_rate:.1%}")
    for metric in METRICS:
        limit, p95 = slo.limit(metric), point.p95_ms.get(metric)
        if limit is None:
            continue
        if p95 is None:
            out.append(f"no {metric.upper()} measured")
        elif p95 > limit:
            out.append(f"{metric.upper()} p95 {p95:.0f} ms > {limit:g} ms")
    return out


def not_covered(curve: Curve, cls: WorkloadClass) -> str | None:
    """Why the curve does not cover the class (rule 1); None: it does."""
    if cls.profiles is not None and curve.profile not in cls.profiles:
        return f"{curve.source}: profile {curve.profile} is not in {list(cls.profiles)}"
    for what, need, measured in (
        ("input", cls.input_tokens, curve.input_tokens),
        ("output", cls.output_tokens, curve.output_tokens),
    ):
        if need is not None and need > measured:
            return f"{curve.source}: measured at {measured} {what} tokens, the class has {need}"
    return None


def at_least_as_strict(counted: Objective, wanted: Objective) -> bool:
    """Whether every limit ``wanted`` sets is set at least as tightly by ``counted``."""
    for metric in METRICS:
        want, have = wanted.limit(metric), counted.limit(metric)
        if want is not None and (have is None or have > want):
            return False
    return True


def size(
    curve: Curve, point: MeasuredPoint, rps: float, pricing: Pricing, slo: Objective
) -> Candidate:
    """Rule 3 for one point (its capacity above zero)."""
    queue = queue_rate(point, slo)
    capacity = point.goodput if queue is None else min(point.goodput, queue)
    needed = max(1, math.ceil(rps / capacity - _CEIL_SLACK))
    replicas = needed + pricing.spare_replicas
    gpus = replicas * pricing.gpus_per_replica
    return Candidate(
        source=curve.source,
        profile=curve.profile,
        knob=curve.knob,
        value=point.value,
        concurrency=point.concurrency,
        goodput=point.goodput,
        conservative=at_least_as_strict(curve.slo, slo),
        queue_rate=queue,
        capacity=capacity,
        replicas_needed=needed,
        replicas=replicas,
        gpus=gpus,
        monthly_cost=gpus * pricing.gpu_hourly * HOURS_PER_MONTH,
        utilisation=rps / (needed * point.goodput),
    )


def queue_rate(point: MeasuredPoint, slo: Objective) -> float | None:
    """Rule 3's ``q``: None without a TTFT or E2E limit or a measured service time."""
    for metric in ("ttft", "e2e"):
        limit, p95 = slo.limit(metric), point.p95_ms.get(metric)
        if limit is not None and p95 is not None and point.service_s:
            return max_rate(point.concurrency, point.service_s, (limit - p95) / 1000)
    return None


def _distance(point: MeasuredPoint, slo: Objective, max_error_rate: float) -> float:
    """The worst of p95/limit and error rate/budget (≤ 1: within everything)."""
    ratios = [point.error_rate / max_error_rate if max_error_rate > 0 else 0.0]
    for metric in METRICS:
        limit, p95 = slo.limit(metric), point.p95_ms.get(metric)
        if limit is not None:
            ratios.append(math.inf if p95 is None else p95 / limit)
    return max(ratios)


def describe(curve: Curve, point: MeasuredPoint) -> str:
    p95s = ", ".join(
        f"{m.upper()} p95 {'-' if v is None else f'{v:.0f} ms'}" for m, v in point.p95_ms.items()
    )
    return (
        f"{curve.profile} {curve.knob}={point.value} concurrency {point.concurrency} "
        f"({curve.source}): {p95s}, error rate {point.error_rate:.1%}, "
        f"goodput {point.goodput:.3f} req/s"
    )


def refusal(cls: WorkloadClass, slo: Objective, curves: list[Curve], skipped: list[str]) -> str:
    """Rule 5's message."""
    head = f"class {cls.name!r}: no measured point meets {slo.label()}"
    scored = [
        (_distance(p, slo, c.max_error_rate), c, p)
        for c in curves
        for p in c.points
        if p.deployable
    ]
    if not scored:
        why = "; ".join(skipped) or "no deployable point measured"
        return f"{head}: no profile report covers it ({why})"
    _, curve, point = min(scored, key=lambda s: s[0])
    return f"{head}; the nearest measured point: {describe(curve, point)}"


def rejection(curve: Curve, point: MeasuredPoint, slo: Objective) -> str | None:
    """Why a point of a covering curve is no candidate (rule 2); None: it is one."""
    problems = violations(point, slo, curve.max_error_rate)
    if not point.deployable:
        problems = [f"concurrency not deployable as {curve.profile}"]
    elif not problems and point.goodput <= 0:
        problems = ["no goodput"]
    elif not problems and queue_rate(point, slo) == 0:
        problems = ["no room to wait within the SLO"]
    if not problems:
        return None
    return f"{curve.source} {curve.knob}={point.value} c={point.concurrency}: {'; '.join(problems)}"


def plan_class(
    cls: WorkloadClass, rps: float, slo: Objective, curves: list[Curve], pricing: Pricing
) -> ClassPlan:
    covering, skipped, found, rejected = [], [], [], []
    for curve in curves:
        reason = not_covered(curve, cls)
        if reason is not None:
            skipped.append(reason)
            continue
        covering.append(curve)
        for point in curve.points:
            why = rejection(curve, point, slo)
            if why is None:
                found.append(size(curve, point, rps, pricing, slo))
            else:
                rejected.append(why)
    if not found:
        raise PlanRefused(refusal(cls, slo, covering, skipped))
    ranked = sorted(
        found, key=lambda c: (c.monthly_cost, not c.conservative, -c.goodput, c.concurrency)
    )
    return ClassPlan(
        cls.name, cls.share, rps, slo, ranked[0], tuple(ranked), tuple(skipped), tuple(rejected)
    )


def select_hardware(curves: list[Curve], wanted: str | None) -> tuple[list[Curve], list[str]]:
    """The curves of one hardware class: those whose class contains ``wanted``
    (case-insensitive), or all where none is asked; refused when none match or the
    kept ones span several classes (one price applies to one class). Also returns the
    curves left out, with their class."""
    kept = [c for c in curves if wanted is None or wanted.lower() in c.hardware.lower()]
    left = [f"{c.source} ({c.hardware})" for c in curves if c not in kept]
    classes = sorted({c.hardware for c in curves})
    if not kept:
        raise PlanRefused(
            f"no profile report was measured on hardware {wanted!r}; "
            f"the reports' hardware: {', '.join(classes)}"
        )
    found = sorted({c.hardware for c in kept})
    if len(found) > 1:
        raise PlanRefused(
            f"the reports span hardware classes {', '.join(found)}: pick one with --hardware"
        )
    return kept, left


def plan(rps: float, mix: Mix, slo: Objective, curves: list[Curve], pricing: Pricing) -> Plan:
    if rps <= 0:
        raise PlanRefused(f"the offered rate must be above 0 requests/s, not {rps:g}")
    return Plan(
        rps,
        pricing,
        tuple(plan_class(c, rps * c.share, c.slo or slo, curves, pricing) for c in mix.classes),
    )
