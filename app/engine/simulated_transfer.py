# SIMULATED KV hand-off between a prefill engine and a decode engine.
#
# Rule. ``prefill`` runs the request as a one-token generation on the prefill engine
# (its prefill step costs what any prefill costs there, and its prompt blocks enter that
# engine's prefix cache) and returns a hand-off naming the engine and the prompt. The
# decode engine, given the hand-off, first looks up its own prefix cache (vLLM's
# NixlConnector pulls only the blocks the decode engine does not hold), then waits
#   transfer_s = transfer_base_s + kv_bytes_per_token * pulled_tokens / transfer_bytes_per_s
# outside its step loop (a pull does not stall other sequences, as vLLM's asynchronous
# KV load does not), then queues the request with every prompt token but the last
# already computed: its prefill step costs one token. Each transfer has the whole
# bandwidth (no shared-link contention is modelled), and the prefill engine frees its
# blocks when its one token is done (vLLM keeps them until pulled or timed out).
#
# Parameters (SimulationProfile): kv_connector, kv_bytes_per_token,
# transfer_bytes_per_s, transfer_base_s.
"""Transfer-time model of the simulated engine's prefill/decode hand-off."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferModel:
    kv_bytes_per_token: int
    bytes_per_s: float
    base_s: float

    def seconds(self, tokens: int) -> float:
        """Time to pull ``tokens`` tokens' KV (0 when nothing is pulled)."""
        if tokens <= 0:
            return 0.0
        return self.base_s + self.kv_bytes_per_token * tokens / self.bytes_per_s


@dataclass
class TransferCounters:
    transfers: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, nbytes: int, seconds: float) -> None:
        self.transfers += 1
        self.tokens += tokens
        self.bytes += nbytes
        self.seconds += seconds

    def as_extra(self) -> dict[str, float]:
        return {
            "kv_transfers_total": float(self.transfers),
            "kv_transfer_tokens_total": float(self.tokens),
            "kv_transfer_bytes_total": float(self.bytes),
            "kv_transfer_seconds_total": self.seconds,
        }
