# Gateway metrics across ingress replicas: one scrape of /metrics sees them all.
#
# Rule. Each ingress replica pushes a snapshot of its gateway families (both registries,
# as prometheus_client collects them) to its application's board every ``PUSH_S``.
# ``GET /metrics`` on any replica answers with every replica's families merged into one
# exposition, each series labelled ``replica`` (the ingress replica's id): the answering
# replica's own from its live registry, the others' from their last snapshot (at most
# ``PUSH_S`` old). A snapshot older than ``STALE_S`` is left out: its replica stopped,
# its series end and Prometheus marks them stale. Without a board (one ingress replica,
# outside Ray, or the actor unreachable) a replica answers with its own families alone.
# Histograms stay per replica and aggregate in PromQL with ``sum by (le)``, never as
# quantiles of quantiles.
# The board holds one snapshot per live replica: its size is the gateway's series times
# the ingress replica count, whatever the traffic.
#
# Parameters: PUSH_S = 2, STALE_S = 30.
"""``MetricsBoard``: the gateway families of every ingress replica of one application."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

PUSH_S = 2.0
STALE_S = 30.0
REPLICA = "replica"


@dataclass(frozen=True)
class Snapshot:
    replica: str
    at: float  # time.time() when it was collected
    public: tuple[Metric, ...]
    tenant: tuple[Metric, ...]


def snapshot(replica: str, registry: CollectorRegistry, tenant: CollectorRegistry) -> Snapshot:
    return Snapshot(replica, time.time(), tuple(registry.collect()), tuple(tenant.collect()))


class MetricsBoard:
    """The latest snapshot of each ingress replica (the body of one Ray actor per
    application, named by ``board_name``)."""

    def __init__(self) -> None:
        self._latest: dict[str, Snapshot] = {}

    def put(self, s: Snapshot) -> None:
        self._latest[s.replica] = s

    def snapshots(self, now: float | None = None) -> list[Snapshot]:
        """The fresh ones; stale ones are forgotten."""
        cutoff = (time.time() if now is None else now) - STALE_S
        for replica in [r for r, s in self._latest.items() if s.at < cutoff]:
            del self._latest[replica]
        return list(self._latest.values())


def board_name(app: str) -> str:
    return f"switchyard-metrics-board-{app}"


class Merged:
    """A collector of several replicas' families, each sample labelled with its
    replica; ``generate_latest(Merged(...))`` renders it."""

    def __init__(self, parts: Iterable[tuple[str, Iterable[Metric]]]) -> None:
        self._parts = [(replica, list(families)) for replica, families in parts]

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica, families in self._parts:
            for f in families:
                m = merged.get(f.name)
                if m is None:
                    m = merged[f.name] = Metric(f.name, f.documentation, f.type, f.unit)
                m.samples.extend(
                    s._replace(labels={**s.labels, REPLICA: replica}) for s in f.samples
                )
        yield from merged.values()


def parts(
    own: Snapshot, others: Iterable[Snapshot], include_tenants: bool
) -> list[tuple[str, list[Metric]]]:
    """What one scrape renders: this replica's live families and the others' latest."""
    out: list[tuple[str, list[Metric]]] = []
    for s in (own, *(o for o in others if o.replica != own.replica)):
        families = list(s.public) + (list(s.tenant) if include_tenants else [])
        out.append((s.replica, families))
    return out
