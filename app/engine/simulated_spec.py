# SIMULATED speculative decoding, for routing experiments and the tests of the acceptance
# health rule: the spec-decode counters vLLM reports, from a stated acceptance rate.
#
# Rule. With ``spec_tokens`` = k > 0, every decode step of a sequence (not the step
# that prefills it) drafts min(k, tokens it may still produce − 1) tokens. Draft
# position i (1-based) is accepted when position i − 1 was and a deterministic draw
# (BLAKE2b of the stream, the position and i) is below ``spec_acceptance`` = α; so
# accepted tokens per draft follow a geometric law truncated at k, with mean
# α + α² + … + α^k, and acceptance (accepted ÷ draft tokens) tends to that mean ÷ k. The
# sequence gains 1 + accepted tokens in the step (as vLLM's bonus token). Verifying a
# drafted token costs the step ``spec_s_per_token``; proposing it is free (an n-gram
# proposer). What a step drafted and accepted goes to the engine's telemetry.
#
# Parameters: spec_tokens (0: off), spec_acceptance, spec_s_per_token.
"""``SimulatedDrafts``: how many tokens a simulated draft proposes and the target keeps."""

from __future__ import annotations

import struct

from app.engine.simulated_text import digest


class SimulatedDrafts:
    def __init__(self, spec_tokens: int, acceptance: float) -> None:
        self.k = spec_tokens
        self.acceptance = acceptance

    @property
    def enabled(self) -> bool:
        return self.k > 0

    def drafted(self, remaining: int) -> int:
        """Draft tokens for a sequence that may still produce ``remaining`` tokens."""
        return max(0, min(self.k, remaining - 1))

    def accepted(self, key: bytes, position: int, drafted: int) -> int:
        """The leading draft tokens accepted at output ``position`` of stream ``key``."""
        kept = 0
        for i in range(drafted):
            raw = digest(key + b"spec" + struct.pack("<qq", position, i))
            if int.from_bytes(raw[:8], "little") / 2.0**64 >= self.acceptance:
                break
            kept += 1
        return kept
