# Each engine step's busy time split across the requests in that step (GPU-time
# attribution: what a request really cost the accelerator it ran on).
#
# Rule. A step that took ``t`` seconds and computed, for each request r in it, P_r
# prompt tokens (neither found in the prefix cache nor pulled from a prefill engine)
# and D_r decode tokens charges r
#
#     t × (c_p·P_r + c_d·D_r) / Σ_s (c_p·P_s + c_d·D_s)
#
# so the charges of one step add up to its time exactly, fixed per-step costs included
# (where both costs are zero, by plain token counts).
# c_p and c_d are the marginal step costs of a prompt token and of a decode token: the
# simulated engine's own cost model, or for vLLM a least-squares fit of
# ``t = a + c_p·P + c_d·D`` over the engine's last ``window`` steps (``StepCostFit``;
# c_p = c_d = 1 until the fit has ``min_steps`` steps and positive slopes). A prompt
# token found in the prefix cache is not computed, so it is not charged: a cache hit
# costs less. A request aborted inside the engine keeps what it was charged until then
# in ``unattributed_s``; at any time busy_s = attributed_s + unattributed_s + open.
#
# Parameters: window = 512 steps, min_steps = 32.
"""``GpuTimeBook`` (per-request charges of an engine's steps) and ``StepCostFit``."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

WINDOW = 512
MIN_STEPS = 32


@dataclass(frozen=True)
class Work:
    """What one request computed in one step."""

    prompt_tokens: int = 0
    decode_tokens: int = 0


class GpuTimeBook:
    """The engine seconds charged to each open request (module rule)."""

    def __init__(self) -> None:
        self._open: dict[str, float] = {}
        self.busy_s = 0.0
        self.attributed_s = 0.0  # closed requests
        self.unattributed_s = 0.0  # aborted inside the engine, or a step with no work

    def step(
        self, seconds: float, work: Mapping[str, Work], prompt_cost: float, decode_cost: float
    ) -> None:
        """Charge one step of ``seconds`` to the requests in ``work``."""
        seconds = max(0.0, seconds)
        self.busy_s += seconds
        weights = {
            rid: prompt_cost * w.prompt_tokens + decode_cost * w.decode_tokens
            for rid, w in work.items()
        }
        total = sum(weights.values())
        if total <= 0:  # costs of zero (a profile's): by plain token counts
            weights = {rid: w.prompt_tokens + w.decode_tokens for rid, w in work.items()}
            total = sum(weights.values())
        if total <= 0:
            self.unattributed_s += seconds
            return
        for rid, weight in weights.items():
            self._open[rid] = self._open.get(rid, 0.0) + seconds * weight / total

    def charged(self, request_id: str) -> float:
        """Seconds charged to an open request so far."""
        return self._open.get(request_id, 0.0)

    def close(self, request_id: str) -> float:
        """A request finished: its charge, now attributed."""
        seconds = self._open.pop(request_id, 0.0)
        self.attributed_s += seconds
        return seconds

    def drop(self, request_id: str) -> None:
        """A request was aborted inside the engine: its charge stays unattributed."""
        self.unattributed_s += self._open.pop(request_id, 0.0)

    @property
    def open_s(self) -> float:
        return sum(self._open.values())


class StepCostFit:
    """Least-squares ``t = a + c_p·P + c_d·D`` over the last ``window`` steps."""

    def __init__(self, window: int = WINDOW, min_steps: int = MIN_STEPS) -> None:
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._min_steps = min_steps
        self._costs = (1.0, 1.0)
        self._since_fit = 0

    def observe(self, seconds: float, prompt_tokens: int, decode_tokens: int) -> None:
        self._steps.append((float(prompt_tokens), float(decode_tokens), seconds))
        self._since_fit += 1

    def costs(self) -> tuple[float, float]:
        """(c_p, c_d), refitted every ``min_steps`` new steps; (1, 1) until a fit holds."""
        if self._since_fit >= self._min_steps and len(self._steps) >= self._min_steps:
            self._since_fit = 0
            fitted = fit(list(self._steps))
            if fitted is not None:
                self._costs = fitted
        return self._costs


def fit(steps: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(c_p, c_d) from (P, D, t) rows with an intercept; None when the rows cannot tell
    (no variation in a column) or a slope is not positive."""
    import numpy as np

    rows = np.asarray(steps, dtype=float)
    p, d, t = rows[:, 0], rows[:, 1], rows[:, 2]
    if np.ptp(p) == 0 or np.ptp(d) == 0:
        return None
    design = np.column_stack([np.ones_like(p), p, d])
    (_, c_p, c_d), *_ = np.linalg.lstsq(design, t, rcond=None)
    if not (c_p > 0 and c_d > 0):
        return None
    return float(c_p), float(c_d)
