"""One cost sheet from one measured run: what ``switchyard cost`` prints and writes.

Inputs: the run's throughput (per instance, on the hardware it was measured on), the
instance's $/hour and count, the average utilisation, labour, the dated price table,
the §11.4 scenarios and traffic levels, best/base/worst hidden costs. Rules
(:mod:`app.cost.model`, :mod:`app.cost.scenarios`):

- effective tokens/hour, input and output separately: measured tok/s × GPUs × 3,600 ×
  utilisation × success rate;
- $/1M tokens: the hourly cost (instances + labour spread over the month's hours) over
  all effective tokens; and split between input and output by ``input_weight`` — the
  engine time one prompt token takes relative to one output token (prefill is batched
  and cheaper per token; a parameter, stated in the sheet);
- $/request: the request's tokens at those unit costs, plus the measured retry overhead
  where the report has one — for the run's average request and for each workload class
  (its own tokens per request; a failed request's engine time is spread over the
  successful ones, as the success rate spreads it for the whole run);
- break-even against each price row: the average tokens/s (at the workload's output
  share) at which the instances cost what the API would, the capacity that needs at
  the utilisation, and whether the measured capacity reaches it;
- $/1M tokens against utilisation (UTILISATION_CURVE) for the plot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.cost.model import HOURS_PER_MONTH, MILLION, SECONDS_PER_HOUR, break_even
from app.cost.prices import PriceTable
from app.cost.scenarios import HiddenCosts, Instance, Workload, api, self_served

UTILISATION_CURVE: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class Throughput:
    """One instance's measured run (``app.bench.cost_input.MeasuredRun``'s figures)."""

    input_tokens_per_s: float
    output_tokens_per_s: float
    requests_per_s: float
    success_rate: float
    input_tokens_per_request: float
    output_tokens_per_request: float
    cached_share: float | None = None
    retry_overhead: float | None = None

    @property
    def output_share(self) -> float:
        total = self.input_tokens_per_s + self.output_tokens_per_s
        return self.output_tokens_per_s / total if total else 0.0


@dataclass(frozen=True)
class WorkloadClass:
    """One class of the run's requests: its share and its tokens per request."""

    name: str
    requests: int
    success_rate: float
    input_tokens_per_request: float
    output_tokens_per_request: float


@dataclass(frozen=True)
class SheetInputs:
    hourly: float  # one instance, $/hour
    gpus: int = 1
    utilisation: float = 1.0
    labour_monthly: float = 0.0
    input_weight: float = 0.2


def unit_costs(t: Throughput, s: SheetInputs, utilisation: float | None = None) -> dict[str, float]:
    u = s.utilisation if utilisation is None else utilisation
    hourly = s.hourly * s.gpus + s.labour_monthly / HOURS_PER_MONTH
    scale = s.gpus * SECONDS_PER_HOUR * u * t.success_rate
    tin, tout = t.input_tokens_per_s * scale, t.output_tokens_per_s * scale
    weighted = s.input_weight * tin + tout
    per_in = hourly * s.input_weight / weighted * MILLION if weighted else float("inf")
    per_out = hourly / weighted * MILLION if weighted else float("inf")
    per_request = (
        (t.input_tokens_per_request * per_in + t.output_tokens_per_request * per_out)
        / MILLION
        * (1.0 + (t.retry_overhead or 0.0))
    )
    return {
        "utilisation": u,
        "hourly_cost": hourly,
        "effective_input_tokens_per_hour": tin,
        "effective_output_tokens_per_hour": tout,
        "per_1m_tokens": hourly / (tin + tout) * MILLION if tin + tout else float("inf"),
        "per_1m_input": per_in,
        "per_1m_output": per_out,
        "per_request": per_request,
    }


def _quality(given: dict[str, float], name: str, model: str) -> float | None:
    """An API's quality, given under its row's name (provider/model) or its model."""
    return given.get(name, given.get(model))


def per_class(
    classes: list[WorkloadClass], units: dict[str, float], retry_overhead: float | None
) -> list[dict[str, Any]]:
    """$/request of each workload class at the run's unit costs."""
    return [
        asdict(c)
        | {
            "per_request": (
                c.input_tokens_per_request * units["per_1m_input"]
                + c.output_tokens_per_request * units["per_1m_output"]
            )
            / MILLION
            * (1.0 + (retry_overhead or 0.0))
        }
        for c in classes
    ]


def sheet(
    t: Throughput,
    s: SheetInputs,
    prices: PriceTable,
    scenarios: list[Instance],
    traffic: dict[str, float],
    hidden: dict[str, HiddenCosts],
    revenue_per_request: float | None = None,
    classes: list[WorkloadClass] | None = None,
    api_quality: dict[str, float] | None = None,
) -> dict[str, Any]:
    units = unit_costs(t, s)
    capacity_tok_s = (t.input_tokens_per_s + t.output_tokens_per_s) * s.gpus
    rows = []
    for row in prices.rows:
        be = break_even(
            s.hourly * s.gpus,
            row.input_per_1m,
            row.output_per_1m,
            output_share=t.output_share,
            utilisation=s.utilisation,
            labour_monthly=s.labour_monthly,
        )
        tokens_per_request = t.input_tokens_per_request + t.output_tokens_per_request
        rows.append(
            {
                "price": row.name,
                "date": row.date.isoformat(),
                "source": row.source,
                "api_per_1m_blended": be.api_price_per_million,
                "break_even_avg_tokens_per_s": be.average_tokens_per_s,
                "break_even_capacity_tokens_per_s": be.capacity_tokens_per_s,
                "break_even_requests_per_month": be.average_tokens_per_month / tokens_per_request
                if tokens_per_request
                else None,
                "measured_capacity_tokens_per_s": capacity_tok_s,
                "reachable": capacity_tok_s >= be.capacity_tokens_per_s,
            }
        )
    workload = Workload(
        t.input_tokens_per_request, t.output_tokens_per_request, t.cached_share or 0.0
    )
    table = []
    for level, requests in traffic.items():
        for case, h in hidden.items():
            for inst in scenarios:
                table.append(
                    {
                        "traffic": level,
                        "case": case,
                        **asdict(self_served(inst, requests, h, revenue_per_request)),
                    }
                )
            for row in prices.rows:
                table.append(
                    {
                        "traffic": level,
                        "case": case,
                        **asdict(
                            api(
                                row,
                                workload,
                                requests,
                                h,
                                revenue_per_request,
                                _quality(api_quality or {}, row.name, row.model),
                            )
                        ),
                    }
                )
    curve = [unit_costs(t, s, u)["per_1m_tokens"] for u in UTILISATION_CURVE]
    return {
        "inputs": asdict(s),
        "throughput": asdict(t) | {"output_share": t.output_share},
        "unit_costs": units,
        "classes": per_class(classes or [], units, t.retry_overhead),
        "break_even": rows,
        "scenarios": [asdict(i) for i in scenarios],
        "hidden_costs": {k: v.model_dump() for k, v in hidden.items()},
        "monthly": table,
        "curve": {"utilisation": list(UTILISATION_CURVE), "per_1m_tokens": curve},
        "price_dates": sorted({r.date.isoformat() for r in prices.rows}),
    }
