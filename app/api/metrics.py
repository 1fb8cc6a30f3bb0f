"""Gateway metrics in Prometheus text format.

Labels are bounded: ``model`` is one of the configured model ids or ``other``;
``tenant`` is one of the first ``tenant_cap`` tenants seen or ``other``; ``endpoint``,
``status``, ``reason`` and ``op`` come from small fixed sets. No user ids, keys or
prompts.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

OTHER = "other"


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: Iterable[str], tenant_cap: int = 20) -> None:
        disable_created_metrics()
        self._models = frozenset(models)
        self._tenant_cap = tenant_cap
        self._tenants: set[str] = set()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "switchyard_requests",
            "Requests answered by the gateway, by model, endpoint and HTTP status.",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "switchyard_time_to_first_token_seconds",
            "Gateway-measured time from request arrival to the first content chunk.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "switchyard_inter_token_latency_seconds",
            "Gateway-measured gap between consecutive content chunks.",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "switchyard_e2e_request_latency_seconds",
            "Gateway-measured time from request arrival to the last byte.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "switchyard_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r
        )
        self.completion_tokens = Counter(
            "switchyard_completion_tokens", "Completion tokens generated.", ["model"], registry=r
        )
        self.aborts = Counter(
            "switchyard_requests_aborted",
            "Requests aborted because the client went away before the end.",
            ["model"],
            registry=r,
        )

        self.tenant_tokens = Counter(
            "switchyard_tenant_tokens",
            "Tokens billed, by tenant and kind (prompt, completion, cached).",
            ["tenant", "kind"],
            registry=r,
        )
        self.tenant_cost = Counter(
            "switchyard_tenant_cost_usd",
            "Cost billed in US dollars, by tenant.",
            ["tenant"],
            registry=r,
        )
        self.rejections = Counter(
            "switchyard_rejections",
            "Requests refused by layer 1, by reason (auth, forbidden, rate, concurrency, "
            "budget, store).",
            ["reason"],
            registry=r,
        )
        self.store_latency = Histogram(
            "switchyard_state_store_seconds",
            "Latency of state-store operations (principal, admit, settle).",
            ["op"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.store_failures = Counter(
            "switchyard_state_store_failures",
            "State-store operations that failed or timed out.",
            ["op"],
            registry=r,
        )

        self.decisions = Counter(
            "switchyard_route_decisions",
            "Routing decisions, by served model, pool (from the routes file) and the step "
            "that decided (canary, tenant, speculative, default, fallback).",
            ["model", "pool", "step"],
            registry=r,
        )
        self.fallbacks = Counter(
            "switchyard_route_fallbacks",
            "Attempts that failed before the first token and moved to the next pool, by reason.",
            ["reason"],
            registry=r,
        )

    def tenant_label(self, tenant: str) -> str:
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self._tenant_cap:
            self._tenants.add(tenant)
            return tenant
        return OTHER

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER

    def render(self) -> bytes:
        return generate_latest(self.registry)
