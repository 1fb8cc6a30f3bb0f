# Prefill/decode disaggregation, decided per request.
#
# Rule (mode "auto"): a request's prefill runs on the prefill role (``remote``) only when
#   1. its UNCACHED prompt length u = prompt_tokens - cached_tokens is at least
#      ``min_uncached_tokens``, where cached_tokens is the longest prefix the decode
#      role is believed to hold (the decode pool's replica-router prefix index, best
#      replica): a prompt the decode side mostly holds is cheaper to finish there than
#      to move — OR the prompt is short but the decode role is busy (every decode
#      replica has at least ``max_decode_in_flight`` requests from this caller), so its
#      prefill would take a step from requests that are decoding; and
#   2. the prefill role is not saturated: some prefill replica has fewer than
#      ``max_prefill_in_flight`` prefill legs in flight from this caller; and
#   3. a prefill replica exists at all, and not every one of them is ejected for failing
#      legs (``app.scheduler.ejection``).
# Otherwise the whole request is served by a decode replica (``local``), which is a full
# engine. The reason is kept for the route header and the metrics:
#   remote:  ``long_uncached``, ``decode_busy``
#   local:   ``short`` (the prompt itself is below the threshold), ``cached`` (the
#            prompt is long but the decode side holds most of it), ``prefill_busy``,
#            ``no_prefill``, ``prefill_ejected``, ``n`` (several choices: one hand-off
#            serves one sequence)
# Modes "always" and "never" are the two fixed choices (Ray Serve LLM's P/D always
# disaggregates; "never" is a unified pool) with reason ``mode``; "always" still serves
# locally when no prefill replica can take the leg (no_prefill, prefill_ejected).
#
# Parameters: mode, min_uncached_tokens, max_prefill_in_flight, max_decode_in_flight.
"""The per-request prefill/decode decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PdMode = Literal["remote", "local"]


@dataclass(frozen=True)
class PdChoice:
    mode: PdMode
    reason: str
    uncached_tokens: int

    def header(self) -> str:
        return f"pd={self.mode}; pd_reason={self.reason}"


def decide(
    *,
    mode: Literal["auto", "always", "never"],
    prompt_tokens: int,
    cached_tokens: int,
    min_uncached_tokens: int,
    prefill_in_flight: list[int],
    max_prefill_in_flight: int,
    prefill_ejected: bool = False,
    decode_in_flight: list[int] | None = None,
    max_decode_in_flight: int = 8,
    choices: int = 1,
) -> PdChoice:
    """The choice for one request (module comment). ``prefill_in_flight`` and
    ``decode_in_flight``: requests in flight on each replica of the role, as this
    caller booked them (None: unknown, taken as not busy); ``prefill_in_flight`` leaves
    out ejected replicas, and ``prefill_ejected`` says every one is ejected."""
    uncached = max(0, prompt_tokens - cached_tokens)
    if mode == "never":
        return PdChoice("local", "mode", uncached)
    if prefill_ejected:
        return PdChoice("local", "prefill_ejected", uncached)
    if not prefill_in_flight:
        return PdChoice("local", "no_prefill", uncached)
    if choices > 1:
        return PdChoice("local", "n", uncached)
    if mode == "always":
        return PdChoice("remote", "mode", uncached)
    reason = "long_uncached"
    if uncached < min_uncached_tokens:
        if prompt_tokens >= min_uncached_tokens:
            return PdChoice("local", "cached", uncached)
        busy = bool(decode_in_flight) and min(decode_in_flight or [0]) >= max_decode_in_flight
        if not busy:
            return PdChoice("local", "short", uncached)
        reason = "decode_busy"
    if min(prefill_in_flight) >= max_prefill_in_flight:
        return PdChoice("local", "prefill_busy", uncached)
    return PdChoice("remote", reason, uncached)
