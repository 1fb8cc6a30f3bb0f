"""Unit economics of serving (seed 003 §11.1-11.2; seed 000 CH4-4 §8-3's break-even).

Rules, in the seed's own terms (every rate per hour unless named; prices in USD):

- GPU hourly cost = instance + storage + network + observability (per hour of the
  instances, whatever they serve);
- effective tokens per hour = measured tokens/s × 3,600 × utilisation × success rate
  (utilisation: the average share of the hour the capacity is used, not the peak);
- cost per 1M tokens = GPU hourly cost / effective tokens per hour × 1,000,000;
- cost per request = input tokens × input $/token + output tokens × output $/token
  + routing + storage + network + retry overhead (each per request);
- gross margin per request = revenue per request − variable cost per request;
- break-even requests per month = monthly fixed cost / gross margin per request
  (refused when the margin is not positive: no volume breaks even);
- break-even throughput against an API: the tokens/s an instance must serve, averaged
  over the whole month, for its hourly cost (plus operations labour spread over the
  month's hours) to equal the API's bill for the same tokens, at the API's price per
  token blended by the workload's output share. The seed's example: $1.172/h against
  $0.10 per 1M input tokens → 11.72M tokens/h → 3,255.6 tokens/s. Its corrections:
  ① utilisation — the instance must be able to serve that average at its real
  utilisation, so the capacity needed is average / utilisation (30 % → 10,852 tok/s);
  ② output price — output tokens cost 3-5× input at an API, so a workload with a large
  output share breaks even at a lower rate; ③ operations labour — on-call, upgrades,
  incidents, added to the hourly cost, raise it. They pull in opposite directions:
  only the workload's own numbers decide.

HOURS_PER_MONTH is 730 (365 × 24 / 12).
"""

from __future__ import annotations

from dataclasses import dataclass

HOURS_PER_MONTH = 730.0
SECONDS_PER_HOUR = 3600.0
MILLION = 1_000_000.0


def gpu_hourly_cost(
    instance: float, storage: float = 0.0, network: float = 0.0, observability: float = 0.0
) -> float:
    """$ per hour of the instances (seed §11.1)."""
    parts = {"instance": instance, "storage": storage, "network": network,
             "observability": observability}  # fmt: skip
    for name, value in parts.items():
        if value < 0:
            raise ValueError(f"{name} cost per hour cannot be negative (got {value})")
    return instance + storage + network + observability


def _share(name: str, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1] (got {value})")
    return value


def effective_tokens_per_hour(
    tokens_per_s: float, utilisation: float = 1.0, success_rate: float = 1.0
) -> float:
    """Tokens an hour of the instances actually delivers (seed §11.1)."""
    if tokens_per_s <= 0:
        raise ValueError(f"measured tokens/s must be positive (got {tokens_per_s})")
    return (
        tokens_per_s
        * SECONDS_PER_HOUR
        * _share("utilisation", utilisation)
        * _share("success rate", success_rate)
    )


def cost_per_million(hourly_cost: float, tokens_per_hour: float) -> float:
    """$ per 1M tokens (seed §11.1)."""
    if tokens_per_hour <= 0:
        raise ValueError("effective tokens per hour must be positive")
    return hourly_cost / tokens_per_hour * MILLION


@dataclass(frozen=True)
class RequestOverheads:
    """Per-request costs beyond the tokens (seed §11.1), in $."""

    routing: float = 0.0
    storage: float = 0.0
    network: float = 0.0
    retry: float = 0.0

    @property
    def total(self) -> float:
        return self.routing + self.storage + self.network + self.retry


def cost_per_request(
    input_tokens: float,
    output_tokens: float,
    input_per_million: float,
    output_per_million: float,
    overheads: RequestOverheads | None = None,
) -> float:
    """$ per request: its tokens at the unit prices plus the overheads (seed §11.1)."""
    tokens = (input_tokens * input_per_million + output_tokens * output_per_million) / MILLION
    return tokens + (overheads or RequestOverheads()).total


def gross_margin(revenue_per_request: float, variable_cost_per_request: float) -> float:
    """$ kept per request (seed §11.2)."""
    return revenue_per_request - variable_cost_per_request


def break_even_requests_per_month(monthly_fixed_cost: float, margin_per_request: float) -> float:
    """Requests a month needed to cover the fixed cost (seed §11.2)."""
    if margin_per_request <= 0:
        raise ValueError(
            f"gross margin per request is {margin_per_request:g}: no volume breaks even"
        )
    return monthly_fixed_cost / margin_per_request


def blended_price(
    input_per_million: float, output_per_million: float, output_share: float
) -> float:
    """An API's $ per 1M tokens for a workload whose tokens are ``output_share`` output."""
    if not 0.0 <= output_share <= 1.0:
        raise ValueError(f"output share must be in [0, 1] (got {output_share})")
    return input_per_million * (1.0 - output_share) + output_per_million * output_share


@dataclass(frozen=True)
class BreakEven:
    """Break-even against an API (module docstring), in tokens/s."""

    average_tokens_per_s: float  # what must be served, averaged over the month
    capacity_tokens_per_s: float  # what the instances must sustain at their utilisation
    hourly_cost: float  # instances + labour spread over the month's hours
    api_price_per_million: float  # blended by the output share

    @property
    def average_tokens_per_month(self) -> float:
        return self.average_tokens_per_s * SECONDS_PER_HOUR * HOURS_PER_MONTH


def break_even(
    hourly_cost: float,
    api_input_per_million: float,
    api_output_per_million: float | None = None,
    output_share: float = 0.0,
    utilisation: float = 1.0,
    labour_monthly: float = 0.0,
) -> BreakEven:
    """The seed's break-even and its three corrections (module docstring)."""
    price = blended_price(
        api_input_per_million,
        api_input_per_million if api_output_per_million is None else api_output_per_million,
        output_share,
    )
    if price <= 0:
        raise ValueError("the API price per 1M tokens must be positive")
    if labour_monthly < 0:
        raise ValueError(f"labour per month cannot be negative (got {labour_monthly})")
    hourly = hourly_cost + labour_monthly / HOURS_PER_MONTH
    average = hourly / price * MILLION / SECONDS_PER_HOUR
    return BreakEven(
        average_tokens_per_s=average,
        capacity_tokens_per_s=average / _share("utilisation", utilisation),
        hourly_cost=hourly,
        api_price_per_million=price,
    )
