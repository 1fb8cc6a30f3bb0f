"""Gateway metrics: the families every ingress replica exports, with bounded labels.

Labels are bounded: ``model`` is one of the configured model ids or ``other``;
``tenant`` is one of ``gateway.metrics_tenants`` (an allow-list, so the label set does
not depend on which tenants a replica happened to see first) or ``other``;
``endpoint``, ``status``, ``reason`` and ``op`` come from small fixed sets. No user
ids, keys or prompts. Families with a ``tenant`` label live in a registry of their own,
so a scrape that must not see them never collects them (``app.api.metrics`` decides
who may read which).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.request import Outcome

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
)
DECISION_BUCKETS = (25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
SESSION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
CALL_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

OTHER = "other"
TENANT = "tenant"

PublicMetrics = Literal["tenant_free", "none", "all"]


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: Iterable[str], tenants: Iterable[str] = ()) -> None:
        disable_created_metrics()
        self._models = frozenset(models)
        self._tenants = frozenset(tenants)
        self.registry = CollectorRegistry()  # families without a tenant label
        self.tenant_registry = CollectorRegistry()  # families with one
        counter, histogram = self._counter, self._histogram

        self.requests = counter(
            "switchyard_requests",
            "Requests answered by the gateway, by model, endpoint and HTTP status.",
            ["model", "endpoint", "status"],
        )
        self.ttft = histogram(
            "switchyard_time_to_first_token_seconds",
            "Gateway-measured time from request arrival to the first content chunk.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.itl = histogram(
            "switchyard_inter_token_latency_seconds",
            "Gateway-measured gap between consecutive content chunks.",
            ["model"],
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "switchyard_e2e_request_latency_seconds",
            "Gateway-measured time from request arrival to the last byte.",
            ["model", "endpoint"],
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter(
            "switchyard_prompt_tokens", "Prompt tokens processed.", ["model"]
        )
        self.completion_tokens = counter(
            "switchyard_completion_tokens", "Completion tokens generated.", ["model"]
        )
        self.aborts = counter(
            "switchyard_requests_aborted",
            "Requests aborted because the client went away before the end.",
            ["model"],
        )

        self.tenant_tokens = counter(
            "switchyard_tenant_tokens",
            "Tokens billed, by tenant and kind (prompt, completion, cached).",
            [TENANT, "kind"],
        )
        self.tenant_cost = counter(
            "switchyard_tenant_cost_usd",
            "Cost billed in US dollars, by tenant.",
            [TENANT],
        )
        self.session_duration = histogram(
            "switchyard_session_duration_seconds",
            "Ended agent sessions: wall time from the first call's start to the last call's end.",
            [TENANT],
            SESSION_BUCKETS,
        )
        self.session_calls = histogram(
            "switchyard_session_calls",
            "Ended agent sessions: calls per session.",
            [TENANT],
            CALL_BUCKETS,
        )
        self.sessions = counter(
            "switchyard_sessions",
            "Ended agent sessions by SLO verdict (met, missed, cancelled, none).",
            [TENANT, "slo"],
        )
        self.session_cancels = counter(
            "switchyard_session_cancels",
            "Whole-session cancels made through this replica.",
            [TENANT],
        )
        self.session_cancelled_calls = counter(
            "switchyard_session_cancelled_calls",
            "Calls in flight ended by a whole-session cancel.",
            [TENANT],
        )
        self.rejections = counter(
            "switchyard_rejections",
            "Requests refused by layer 1, by reason (auth, forbidden, rate, concurrency, "
            "budget, store).",
            ["reason"],
        )
        self.store_latency = histogram(
            "switchyard_state_store_seconds",
            "Latency of state-store operations (principal, admit, settle).",
            ["op"],
            STORE_BUCKETS,
        )
        self.store_failures = counter(
            "switchyard_state_store_failures",
            "State-store operations that failed or timed out.",
            ["op"],
        )

        self.decisions = counter(
            "switchyard_route_decisions",
            "Routing decisions, by served model, pool (from the routes file) and the step "
            "that decided (canary, tenant, speculative, default, fallback).",
            ["model", "pool", "step"],
        )
        self.replica_decisions = counter(
            "switchyard_replica_decisions",
            "Replica decisions of Switchyard's replica router, by model and what decided "
            "(prefix, load, session, load:imbalance, tiebreak, only).",
            ["model", "scorer"],
        )
        self.replica_decision_seconds = histogram(
            "switchyard_replica_decision_seconds",
            "Time the replica router's scorers took for one decision.",
            ["model"],
            DECISION_BUCKETS,
        )
        self.adapter_requests = counter(
            "switchyard_adapter_requests",
            "Requests that ran a LoRA adapter, by base model and whether the replica had to "
            "load the adapter first (cold: true|false). Adapter names are not labels.",
            ["model", "cold"],
        )
        self.adapter_load_seconds = histogram(
            "switchyard_adapter_load_seconds",
            "Time a replica spent loading a LoRA adapter into its engine for a request (a "
            "cold load), by base model.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.replica_index_blocks = Gauge(
            "switchyard_replica_index_blocks",
            "Block hashes in this ingress replica's prefix index for the model's replicas "
            "(at most routing.prefix.max_blocks per replica), at its last decision.",
            ["model"],
            registry=self.registry,
        )
        self.pd_requests = counter(
            "switchyard_pd_requests",
            "Requests to a disaggregated model, by how they were served (served: "
            "remote|local) and why (reason: the rule's, or fallback_<cause> when a remote "
            "choice was served locally).",
            ["model", "served", "reason"],
        )
        self.pd_prefill_seconds = histogram(
            "switchyard_pd_prefill_seconds",
            "The prefill leg of a disaggregated request as the ingress saw it (a prefill "
            "replica computing the prompt's KV), when it succeeded.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.pd_handoff_seconds = histogram(
            "switchyard_pd_handoff_seconds",
            "From the prefill leg's end to the decode leg's first token: the KV transfer "
            "plus the decode replica's queue and one decode step.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.fallbacks = counter(
            "switchyard_route_fallbacks",
            "Attempts that failed before the first token and moved to the next pool, by reason.",
            ["reason"],
        )


        self.settlements_pending = Gauge(
            "switchyard_settlements_pending",
            "Settlements the state store did not take yet, kept in the replica's journal.",
            registry=self.registry,
        )
        self.settlements_journaled = Counter(
            "switchyard_settlements_journaled",
            "Settlements journaled because the state store did not take them.",
            registry=self.registry,
        )

    def _registry(self, labels: Sequence[str]) -> CollectorRegistry:
        """A family with a tenant label goes to the tenant registry, whoever adds it."""
        return self.tenant_registry if TENANT in labels else self.registry

    def _counter(self, name: str, doc: str, labels: Sequence[str]) -> Counter:
        return Counter(name, doc, labels, registry=self._registry(labels))

    def _histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self._registry(labels))

    def tenant_label(self, tenant: str) -> str:
        """The tenant itself when allow-listed (``gateway.metrics_tenants``), else
        ``other``: the same on every replica, whatever order tenants arrive in."""
        return tenant if tenant in self._tenants else OTHER

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER

    def observe(self, label: str, o: Outcome) -> None:
        """One ended request's metrics, derived from its outcome (``label``: its model
        label, ``model_label``)."""
        self.requests.labels(label, o.endpoint, str(o.http_status)).inc()
        self.e2e.labels(label, o.endpoint).observe(o.e2e_s)
        if o.ttft_s is not None:
            self.ttft.labels(label).observe(o.ttft_s)
        for gap in o.itls:
            self.itl.labels(label).observe(gap)
        self.prompt_tokens.labels(label).inc(o.prompt_tokens)
        self.completion_tokens.labels(label).inc(o.completion_tokens)
        if o.http_status == 499:
            self.aborts.labels(label).inc()

    def replica_decision(
        self, label: str, scorer: str, seconds: float, index_blocks: int
    ) -> None:
        """One decision of the replica router (``app.scheduler``) for model ``label``."""
        self.replica_decisions.labels(label, scorer).inc()
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

    def render(self, include_tenants: bool = False) -> bytes:
        """Prometheus text: the tenant-free families, and with ``include_tenants`` the
        tenant families after them (only then is the tenant registry collected)."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.tenant_registry) if include_tenants else text
