"""Monthly cost of a traffic level under seed 003 §11.4's three scenarios: one
high-end GPU, several cheap GPUs (both self-served) and an external API — with the
hidden costs of §11.3 as explicit parameters, at best/base/worst settings.

Rules (per month of HOURS_PER_MONTH hours; traffic as requests per month with the
measured tokens per request):

- A self-served scenario is an instance class with its $/hour and the capacity measured
  on it (requests/s one instance serves within the SLO, from a report of record).
- Requests served = traffic × (1 + retry_rate + reask_rate): failures retried, and
  questions asked again because a weaker answer did not do (§11.3's last item).
- Instances = ceil(served average requests/s / (capacity × max_utilisation)), at least
  ``min_instances``, plus ``spare_instances`` (N+1: reserved and unused most of the time).
- Utilisation = served average requests/s / (instances × capacity): the real average,
  not the peak.
- Monthly cost = instances × $/hour × (hours + redeploy_hours) + observability (logs,
  metrics, network) + labour (on-call, upgrades, incidents).
- The API scenario pays its price for every served request's tokens (cached input at
  the cached price for the cached share, where the row has one), plus labour_api.
- Gross margin = revenue − cost, where revenue per request is given.
- Beside each scenario's cost, what saving it costs in service: its answers' quality
  (a graded score, where given) and the share of requests meeting the SLO at its
  capacity (measured for the measured instance; given for the others) — §11.4's
  "effect on quality and SLO", shown, not folded into the cost (the re-ask rate is the
  cost side of a weaker answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from app.cost.model import HOURS_PER_MONTH, MILLION, SECONDS_PER_HOUR
from app.cost.prices import PriceRow
from app.schema import StrictFrozen

SECONDS_PER_MONTH = HOURS_PER_MONTH * SECONDS_PER_HOUR


class HiddenCosts(StrictFrozen):
    """§11.3's hidden costs as parameters (one set each for best/base/worst)."""

    max_utilisation: float = Field(
        default=0.7, gt=0, le=1, description="Planned peak share of capacity."
    )
    min_instances: int = Field(default=1, ge=1)
    spare_instances: int = Field(default=1, ge=0, description="N+1: reserved, mostly unused.")
    redeploy_hours: float = Field(
        default=4.0, ge=0, description="Paid hours a month loading and redeploying."
    )
    retry_rate: float = Field(
        default=0.01, ge=0, description="Extra requests from failures and retries."
    )
    reask_rate: float = Field(default=0.0, ge=0, description="Extra requests from weaker answers.")
    observability_monthly: float = Field(
        default=0.0, ge=0, description="Logs, metrics, network ($/month)."
    )
    labour_monthly: float = Field(
        default=0.0, ge=0, description="Operations time, self-served ($/month)."
    )
    labour_api_monthly: float = Field(
        default=0.0, ge=0, description="Operations time with an API ($/month)."
    )


@dataclass(frozen=True)
class Workload:
    """Measured per request (from the report of record)."""

    input_tokens: float
    output_tokens: float
    cached_share: float = 0.0  # of input tokens, served from a prefix cache


@dataclass(frozen=True)
class Instance:
    """A self-served instance class and the capacity measured on it."""

    name: str
    hourly: float
    capacity_rps: float  # requests/s one instance serves within the SLO
    quality: float | None = None  # graded score of its answers, where known
    slo_met: float | None = None  # share of requests meeting the SLO at that capacity


@dataclass(frozen=True)
class MonthlyCost:
    scenario: str
    requests: float  # traffic, before retries and re-asks
    served: float
    instances: int | None
    utilisation: float | None
    cost: float
    revenue: float | None
    quality: float | None = None
    slo_met: float | None = None

    @property
    def per_request(self) -> float:
        return self.cost / self.requests

    @property
    def margin(self) -> float | None:
        return None if self.revenue is None else self.revenue - self.cost


def served_requests(requests: float, hidden: HiddenCosts) -> float:
    return requests * (1.0 + hidden.retry_rate + hidden.reask_rate)


def self_served(
    instance: Instance,
    requests: float,
    hidden: HiddenCosts,
    revenue_per_request: float | None = None,
) -> MonthlyCost:
    if instance.capacity_rps <= 0:
        raise ValueError(f"{instance.name}: measured capacity must be positive")
    served = served_requests(requests, hidden)
    rps = served / SECONDS_PER_MONTH
    needed = math.ceil(rps / (instance.capacity_rps * hidden.max_utilisation))
    instances = max(needed, hidden.min_instances) + hidden.spare_instances
    hours = HOURS_PER_MONTH + hidden.redeploy_hours
    cost = (
        instances * instance.hourly * hours + hidden.observability_monthly + hidden.labour_monthly
    )
    return MonthlyCost(
        scenario=instance.name,
        requests=requests,
        served=served,
        instances=instances,
        utilisation=rps / (instances * instance.capacity_rps),
        cost=cost,
        revenue=None if revenue_per_request is None else revenue_per_request * requests,
        quality=instance.quality,
        slo_met=instance.slo_met,
    )


def api(
    row: PriceRow,
    workload: Workload,
    requests: float,
    hidden: HiddenCosts,
    revenue_per_request: float | None = None,
    quality: float | None = None,
) -> MonthlyCost:
    served = served_requests(requests, hidden)
    cached_price = row.cached_input_per_1m
    cached = workload.cached_share if cached_price is not None else 0.0
    per_request = (
        workload.input_tokens * (1.0 - cached) * row.input_per_1m
        + workload.input_tokens * cached * (cached_price or 0.0)
        + workload.output_tokens * row.output_per_1m
    ) / MILLION
    return MonthlyCost(
        scenario=f"API {row.name}",
        requests=requests,
        served=served,
        instances=None,
        utilisation=None,
        cost=served * per_request + hidden.labour_api_monthly,
        revenue=None if revenue_per_request is None else revenue_per_request * requests,
        quality=quality,
    )


def cases(labour_monthly: float, labour_api_monthly: float = 0.0) -> dict[str, HiddenCosts]:
    """best/base/worst hidden costs (§11.4), the labour given scaled ×0.5/×1/×1.5:
    best plans to 80 % of capacity with no spare, 1 h of redeploys, 0.5 % retries and
    no re-asks; base 70 %, one spare, 4 h, 1 % retries, 2 % re-asks, $50 of logs and
    metrics; worst 50 %, one spare, 12 h, 5 % retries, 10 % re-asks, $200."""

    def make(scale: float, **kw: float) -> HiddenCosts:
        labour = {"labour_monthly": labour_monthly * scale,
                  "labour_api_monthly": labour_api_monthly * scale}  # fmt: skip
        return HiddenCosts.model_validate(kw | labour)

    return {
        "best": make(0.5, max_utilisation=0.8, spare_instances=0, redeploy_hours=1,
                     retry_rate=0.005, reask_rate=0.0, observability_monthly=0),
        "base": make(1.0, max_utilisation=0.7, spare_instances=1, redeploy_hours=4,
                     retry_rate=0.01, reask_rate=0.02, observability_monthly=50),
        "worst": make(1.5, max_utilisation=0.5, spare_instances=1, redeploy_hours=12,
                      retry_rate=0.05, reask_rate=0.10, observability_monthly=200),
    }  # fmt: skip
