"""``PdOutcome``: how a disaggregated pool served one request (the rule's choice, the
legs that ran, the hand-off's times), which ``PdStream`` fills and dispatch hands up
inside its answer."""

from __future__ import annotations

from dataclasses import dataclass

from app.disagg.rule import PdChoice


@dataclass(frozen=True)
class PdOutcome:
    """How a disaggregated request was served, for the header, metrics and logs."""

    choice: PdChoice
    served: str  # "remote", or "local" (chosen, or after a failed hand-off)
    fallback: str | None = None  # why a remote choice was served locally
    prefill_s: float | None = None  # the prefill leg, as the caller saw it
    handoff_s: float | None = None  # hand-off to the decode leg's first delta

    @property
    def reason(self) -> str:
        """The rule's reason, or ``fallback_<cause>`` for a hand-off that failed."""
        return f"fallback_{self.fallback}" if self.fallback else self.choice.reason

    def header(self) -> str:
        return f"pd={self.served}; pd_reason={self.reason}"
