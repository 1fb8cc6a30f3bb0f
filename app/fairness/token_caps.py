# Token caps of one pool on one ingress replica (``app.fairness.queue``).
#
# Rule. Slots count requests, not their size: a few long prompts can keep every engine
# prefilling while slots are free. Two sums count this ingress replica's requests to the
# pool in tokens: the prompt tokens of started requests that have not had their first
# token (pending prefill, capped by P), and the KV tokens the started requests reserve,
# each its prompt plus the most output tokens it may produce until it ends (capped by K).
# A request may start only while both sums are below their caps: one request may
# overshoot a cap, and a request always starts on an idle pool (both sums are 0).
#
# Parameters (``QueueSettings``): max_prefill_tokens and max_kv_tokens per engine
# replica (none: no cap). A pool's P and K are those times its replicas, divided among
# the ingress replicas (at least 1), as its slots are.
"""``TokenCaps``: one pool's P and K; ``TokenBook``: the sums they bound."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenCaps:
    """P and K for one pool on one ingress replica (None: no cap)."""

    prefill: int | None = None
    kv: int | None = None

    @classmethod
    def of(
        cls, prefill: int | None, kv: int | None, replicas: int, ingress_replicas: int
    ) -> TokenCaps:
        """From the per-engine-replica settings ``prefill`` and ``kv``."""

        def share(per_replica: int | None) -> int | None:
            if per_replica is None:
                return None
            return max(1, math.ceil(per_replica * replicas / ingress_replicas))

        return cls(share(prefill), share(kv))


@dataclass
class TokenBook:
    """The two sums of the module comment, and whether they leave room."""

    caps: TokenCaps = field(default_factory=TokenCaps)
    pending_prefill: int = 0
    reserved_kv: int = 0

    def room(self) -> bool:
        """One more request may start."""
        if self.caps.prefill is not None and self.pending_prefill >= self.caps.prefill:
            return False
        return self.caps.kv is None or self.reserved_kv < self.caps.kv

    def start(self, prompt_tokens: int, output_tokens: int) -> None:
        self.pending_prefill += prompt_tokens
        self.reserved_kv += prompt_tokens + output_tokens

    def prefilled(self, prompt_tokens: int) -> None:
        """A started request's first token came."""
        self.pending_prefill -= prompt_tokens

    def leave(self, prompt_tokens: int, output_tokens: int, prefilled: bool) -> None:
        if not prefilled:
            self.pending_prefill -= prompt_tokens
        self.reserved_kv -= prompt_tokens + output_tokens
