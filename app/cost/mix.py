"""The inputs of a capacity plan (``app.cost.plan``) a person writes: the SLO
(``Objective``, p95 limits in ms) and the traffic mix file (``Mix``: workload classes,
each with its share of the requests — the shares sum to 1 within SHARE_TOLERANCE —
optionally the tokens of its requests, the profiles it may use and its own SLO).
Unknown keys are refused.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from app.schema import StrictFrozen

METRICS = ("ttft", "itl", "e2e")
SHARE_TOLERANCE = 1e-6


class Objective(StrictFrozen):
    """p95 limits in milliseconds; None: not part of the objective."""

    ttft_p95_ms: float | None = Field(default=None, gt=0)
    itl_p95_ms: float | None = Field(default=None, gt=0)
    e2e_p95_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _sets_a_limit(self) -> Self:
        if not self.model_dump(exclude_none=True):
            raise ValueError("an SLO sets at least one of ttft_p95_ms, itl_p95_ms, e2e_p95_ms")
        return self

    def limit(self, metric: str) -> float | None:
        value: float | None = getattr(self, f"{metric}_p95_ms")
        return value

    def label(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.model_dump(exclude_none=True).items())


class WorkloadClass(StrictFrozen):
    name: str = Field(min_length=1)
    share: float = Field(gt=0, le=1, description="Share of the offered requests.")
    input_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    profiles: tuple[str, ...] | None = Field(default=None, min_length=1)
    slo: Objective | None = Field(default=None, description="Default: the plan's SLO.")


class Mix(StrictFrozen):
    """The traffic mix file: workload classes whose shares sum to 1."""

    classes: tuple[WorkloadClass, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names repeat: {names}")
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise ValueError(f"shares sum to {total:g}, not 1")
        return self
