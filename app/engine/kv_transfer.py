"""The KV connector of an engine in a prefill/decode pair: vLLM's NixlConnector, both
roles ``kv_both`` (so either engine can also serve a request whole).

Each engine gets its own ``engine_id`` and NIXL side channel (a free port on this node,
announced at the node's address): the decode engine finds the prefill engine's blocks
through the ``kv_transfer_params`` the prefill returned. A transfer that fails fails the
decode request (``kv_load_failure_policy: fail``): the caller serves it whole instead
(``app.disagg.stream``), once."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from app.schema import StrictFrozen

# What a prefill request asks of the connector: keep the KV for a remote decode.
PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class KvConnector(StrictFrozen):
    """vLLM's KV connector between the roles (``kv_transfer_config``)."""

    kind: Literal["nixl"] = Field(
        default="nixl",
        description="vLLM's NixlConnector: the decode engine pulls the prefilled blocks "
        "(UCX over host memory on CPU, RDMA on GPUs).",
    )
    buffer_device: Literal["cpu", "cuda"] | None = Field(
        default=None,
        description="Where the transferred blocks are staged; default 'cpu' on CPU "
        "replicas and 'cuda' on GPUs.",
    )
    kv_lease_s: int = Field(
        default=30,
        ge=1,
        description="How long a prefill engine keeps blocks nobody has pulled before "
        "freeing them (vLLM's kv_lease_duration; a waiting decode engine extends it by "
        "heartbeats, and a decode engine that aborts tells the prefill engine to free).",
    )
    extra_config: dict[str, Any] = Field(
        default_factory=dict, description="kv_connector_extra_config, passed as is."
    )

    def vllm_config(self, role: str, on_gpu: bool) -> Any:
        """vLLM's ``KVTransferConfig`` for one engine (a fresh engine id each call)."""
        from vllm.config import KVTransferConfig

        device = self.buffer_device or ("cuda" if on_gpu else "cpu")
        return KVTransferConfig(
            kv_connector="NixlConnector",
            kv_role="kv_both",
            kv_buffer_device=device,
            engine_id=f"{role}-{uuid.uuid4().hex[:12]}",
            kv_load_failure_policy="fail",
            kv_connector_extra_config={"kv_lease_duration": self.kv_lease_s, **self.extra_config},
        )


def set_side_channel(host: str, port: int) -> None:
    """Where this node's next engine listens for NIXL handshakes. vLLM reads it from
    the environment of the engine process it spawns, so set it just before starting
    the engine (one engine per replica process)."""
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)


def compute_cores(numa_nodes: list[list[int]]) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a CPU engine with the connector: every core but
    the last of each NUMA node. vLLM's NIXL worker on CPU pins the worker's main thread
    to those last cores (its cores "for KV transfer"); with vLLM's default binding the
    model's OpenMP threads then share one core, and a step took ~50× longer on this
    2-core machine (benchmarks/pd_cpu.py). None when no core would be left."""
    reserved = {max(node) for node in numa_nodes if node}
    rest = sorted({c for node in numa_nodes for c in node} - reserved)
    return ",".join(str(c) for c in rest) or None


def bind_cpu_compute() -> None:
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` for the next CPU engine (``compute_cores``),
    unless the operator set it."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    from vllm.platforms import current_platform

    cores = compute_cores(current_platform.discover_numa_topology())
    if cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores


@dataclass
class ConnectorCounters:
    """The connector's own transfer counters, as vLLM's scheduler reports them each step
    (``SchedulerStats.kv_connector_stats``: NIXL's per-transfer lists since the last
    report). An engine pulls as the decode side, so a decode engine's counters are the
    KV it received."""

    transfers: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failed: int = 0
    expired: int = 0  # blocks a prefill engine freed because nobody pulled them in time

    def observe(self, data: dict[str, Any]) -> None:
        durations = data.get("transfer_duration") or ()
        self.transfers += len(durations)
        self.seconds += float(sum(durations))
        self.bytes += int(sum(data.get("bytes_transferred") or ()))
        self.failed += len(data.get("num_failed_transfers") or ())
        self.expired += len(data.get("num_kv_expired_reqs") or ())

    def as_extra(self) -> dict[str, float]:
        return {
            "kv_transfers_total": float(self.transfers),
            "kv_transfer_bytes_total": float(self.bytes),
            "kv_transfer_seconds_total": self.seconds,
            "kv_transfer_failures_total": float(self.failed),
            "kv_expired_total": float(self.expired),
        }
