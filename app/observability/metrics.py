"""Gateway metrics: the families every ingress replica exports, built from their
definitions in ``app.observability.catalog`` (name, type, help, labels, buckets).

Labels are bounded (the catalog's ``LABELS``): ``model`` is one of the configured model
ids or ``other``; ``tenant`` is one of ``gateway.metrics_tenants`` (an allow-list, so
the label set does not depend on which tenants a replica happened to see first) or
``other``. No user ids, keys or prompts. Families with a ``tenant`` label live in a
registry of their own,
so a scrape that must not see them never collects them (``app.api.metrics`` decides
who may read which).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.observability import catalog
from app.observability.board import Merged, Snapshot, parts, snapshot
from app.request import Outcome

OTHER = "other"
TENANT = "tenant"

PublicMetrics = Literal["tenant_free", "none", "all"]


class _Null:
    """A family that observes nothing (metrics off)."""

    def labels(self, *values: str) -> _Null:
        return self

    def inc(self, amount: float = 1.0) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def set_function(self, f: Callable[[], float]) -> None:
        pass


NULL = _Null()


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        models: Iterable[str],
        tenants: Iterable[str] = (),
        replica: str = "local",
        enabled: bool = True,
    ) -> None:
        """``replica``: this ingress replica's id, the ``replica`` label of its series.
        ``enabled=False``: every family is a no-op (nothing observed, nothing exported;
        ``gateway.metrics_enabled``, for measuring what metrics cost)."""
        disable_created_metrics()
        self.replica = replica
        self.enabled = enabled
        self._models = frozenset(models)
        self._tenants = frozenset(tenants)
        self.registry = CollectorRegistry()  # families without a tenant label
        self.tenant_registry = CollectorRegistry()  # families with one

        self.requests = self._counter("switchyard_requests")
        self.ttft = self._histogram("switchyard_time_to_first_token_seconds")
        self.itl = self._histogram("switchyard_inter_token_latency_seconds")
        self.e2e = self._histogram("switchyard_e2e_request_latency_seconds")
        self.stages = self._histogram("switchyard_stage_seconds")
        self._stage_children: dict[tuple[str, str], Histogram] = {}  # labels() per request
        self.prompt_tokens = self._counter("switchyard_prompt_tokens")
        self.completion_tokens = self._counter("switchyard_completion_tokens")
        self.aborts = self._counter("switchyard_requests_aborted")
        self.tenant_tokens = self._counter("switchyard_tenant_tokens")
        self.tenant_cost = self._counter("switchyard_tenant_cost_usd")
        self.tenant_requests = self._counter("switchyard_tenant_requests")
        self.tenant_gpu_seconds = self._counter("switchyard_tenant_gpu_seconds")
        self.tenant_gpu_cost = self._counter("switchyard_tenant_gpu_cost_usd")
        self.session_duration = self._histogram("switchyard_session_duration_seconds")
        self.session_calls = self._histogram("switchyard_session_calls")
        self.sessions = self._counter("switchyard_sessions")
        self.session_cancels = self._counter("switchyard_session_cancels")
        self.session_cancelled_calls = self._counter("switchyard_session_cancelled_calls")
        self.rejections = self._counter("switchyard_rejections")
        for reason in catalog.REJECTION_REASONS:
            self.rejections.labels(reason)
        self.store_latency = self._histogram("switchyard_state_store_seconds")
        self.store_failures = self._counter("switchyard_state_store_failures")
        self.decisions = self._counter("switchyard_route_decisions")
        self.replica_decisions = self._counter("switchyard_replica_decisions")
        self.replica_decision_seconds = self._histogram("switchyard_replica_decision_seconds")
        self.adapter_requests = self._counter("switchyard_adapter_requests")
        self.adapter_load_seconds = self._histogram("switchyard_adapter_load_seconds")
        self.replica_index_blocks = self._gauge("switchyard_replica_index_blocks")
        self.replica_prefix_blocks = self._counter("switchyard_replica_prefix_blocks")
        self.pd_requests = self._counter("switchyard_pd_requests")
        self.pd_prefill_seconds = self._histogram("switchyard_pd_prefill_seconds")
        self.pd_handoff_seconds = self._histogram("switchyard_pd_handoff_seconds")
        self.fallbacks = self._counter("switchyard_route_fallbacks")
        self.queue_wait = self._histogram("switchyard_queue_wait_seconds")
        self.queue_shed = self._counter("switchyard_queue_shed")
        self.queue_waiting = self._gauge("switchyard_queue_waiting")
        self.queue_engine_caps = self._counter("switchyard_queue_engine_caps")
        self.queue_slots = self._gauge("switchyard_queue_slots")
        self.tenant_service = self._counter("switchyard_tenant_service_tokens")
        self.settlements_pending = self._gauge("switchyard_settlements_pending")
        self.reservations_outstanding = self._gauge("switchyard_reservations_outstanding")
        self.settlements_journaled = self._counter("switchyard_settlements_journaled")

    def _registry(self, labels: Sequence[str]) -> CollectorRegistry:
        """A family with a tenant label goes to the tenant registry, whoever adds it."""
        return self.tenant_registry if TENANT in labels else self.registry

    def _counter(self, name: str) -> Counter:
        m = catalog.get(name)
        assert m.kind == "counter", name
        if not self.enabled:
            return cast(Counter, NULL)
        return Counter(m.name, m.help, m.labels, registry=self._registry(m.labels))

    def _histogram(self, name: str) -> Histogram:
        m = catalog.get(name)
        assert m.kind == "histogram", name
        if not self.enabled:
            return cast(Histogram, NULL)
        return Histogram(
            m.name, m.help, m.labels, buckets=m.buckets, registry=self._registry(m.labels)
        )

    def _gauge(self, name: str) -> Gauge:
        m = catalog.get(name)
        assert m.kind == "gauge", name
        if not self.enabled:
            return cast(Gauge, NULL)
        return Gauge(m.name, m.help, m.labels, registry=self._registry(m.labels))

    def tenant_label(self, tenant: str) -> str:
        """The tenant itself when allow-listed (``gateway.metrics_tenants``), else
        ``other``: the same on every replica, whatever order tenants arrive in."""
        return tenant if tenant in self._tenants else OTHER

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER

    def observe(self, label: str, o: Outcome, tenant: str | None = None) -> None:
        """One ended request's metrics, derived from its outcome (``label``: its model
        label, ``model_label``; ``tenant``: its tenant, for the folded tenant label)."""
        self.requests.labels(label, o.endpoint, str(o.http_status)).inc()
        self.e2e.labels(label, o.endpoint).observe(o.e2e_s)
        if o.ttft_s is not None:
            self.ttft.labels(label).observe(o.ttft_s)
        itl = self.itl.labels(label)
        for gap in o.itls:
            itl.observe(gap)
        self.prompt_tokens.labels(label).inc(o.prompt_tokens)
        self.completion_tokens.labels(label).inc(o.completion_tokens)
        if o.http_status == 499:
            self.aborts.labels(label).inc()
        q = o.queue
        if q is not None:
            if q.shed is not None:
                self.queue_shed.labels(label, q.band, q.shed).inc()
            else:
                self.queue_wait.labels(label, q.band).observe(q.waited_s)
            if q.service and tenant is not None:
                self.tenant_service.labels(self.tenant_label(tenant)).inc(q.service)
        for stage, seconds in stage_seconds(o):
            key = (o.endpoint, stage)
            child = self._stage_children.get(key)
            if child is None:  # bounded: endpoints × stages
                child = self._stage_children[key] = self.stages.labels(*key)
            child.observe(seconds)

    def watch_queue(self, pool: str, band: str, waiting: Callable[[], float]) -> None:
        """Read a pool's waiting count of ``band`` at scrape time (``pool``: bounded by
        the routes file)."""
        self.queue_waiting.labels(pool, band).set_function(waiting)

    def watch_slots(self, pool: str, read: Mapping[str, Callable[[], float]]) -> None:
        """Read a pool's slots and token sums at scrape time, one series per kind of
        ``catalog.QUEUE_SLOT_KINDS`` (``read``: kind → reader)."""
        for kind in catalog.QUEUE_SLOT_KINDS:
            self.queue_slots.labels(pool, kind).set_function(read[kind])

    def watch_engine_caps(self, pool: str) -> Callable[[str], None]:
        """The counter of a pool's engine caps (``app.fairness.engine_caps``): ``held`` —
        every replica's last report said full, so no more requests start than run;
        ``stale`` — those reports aged out and the pool's slots alone decide again (fail
        open). Both are exported at 0 from the pool's first request, so the first hold
        is a visible increase."""
        caps = self.queue_engine_caps
        children = {kind: caps.labels(pool, kind) for kind in catalog.ENGINE_CAP_OUTCOMES}

        def count(kind: str) -> None:
            children[kind].inc()

        return count

    def replica_decision(
        self,
        label: str,
        scorer: str,
        seconds: float,
        index_blocks: int,
        matched_blocks: int = 0,
        prompt_blocks: int = 0,
    ) -> None:
        """One decision of the replica router (``app.scheduler``) for model ``label``."""
        self.replica_decisions.labels(label, scorer).inc()
        self.replica_prefix_blocks.labels(label, "prompt").inc(prompt_blocks)
        self.replica_prefix_blocks.labels(label, "matched").inc(matched_blocks)
        self.replica_decision_seconds.labels(label).observe(seconds)
        self.replica_index_blocks.labels(label).set(index_blocks)

    def adapter_request(self, label: str, load_s: float | None) -> None:
        """A request of base model ``label`` ran an adapter; ``load_s``: its cold load."""
        self.adapter_requests.labels(label, "true" if load_s is not None else "false").inc()
        if load_s is not None:
            self.adapter_load_seconds.labels(label).observe(load_s)

    def pd_request(
        self,
        label: str,
        served: str,
        reason: str,
        prefill_s: float | None = None,
        handoff_s: float | None = None,
    ) -> None:
        """How a disaggregated pool served one request of model ``label``: ``prefill_s``
        is a prefill leg that succeeded, ``handoff_s`` a hand-off that did."""
        self.pd_requests.labels(label, served, reason).inc()
        if prefill_s is not None:
            self.pd_prefill_seconds.labels(label).observe(prefill_s)
        if handoff_s is not None:
            self.pd_handoff_seconds.labels(label).observe(handoff_s)

    def snapshot(self) -> Snapshot:
        return snapshot(self.replica, self.registry, self.tenant_registry)

    def render(self, include_tenants: bool = False, others: Iterable[Snapshot] = ()) -> bytes:
        """Prometheus text: this replica's tenant-free families, and with
        ``include_tenants`` its tenant families (only then is the tenant registry
        collected); with ``others``, every other ingress replica's too
        (``app.observability.board``). Each series is labelled with its replica."""
        own = Snapshot(
            self.replica,
            0.0,
            tuple(self.registry.collect()),
            tuple(self.tenant_registry.collect()) if include_tenants else (),
        )
        return generate_latest(Merged(parts(own, others, include_tenants)))


# The mark an ``Outcome`` gets when a request leaves each stage (``app.api.pipeline``).
STAGE_ENDS = ("identified", "parsed", "routed", "admitted", "answered", "ended")


def stage_seconds(o: Outcome) -> list[tuple[str, float]]:
    """Seconds in each stage the request passed, from its outcome's marks: a stage
    runs from the previous stage's end (the request's arrival for the first) to its
    own; the stages after the first one it did not finish are left out."""
    out: list[tuple[str, float]] = []
    previous = o.started
    for stage, mark in zip(catalog.STAGES, STAGE_ENDS, strict=True):
        at = o.marks.get(mark)
        if at is None:
            break
        out.append((stage, max(0.0, at - previous)))
        previous = at
    return out
