"""Gateway metrics in Prometheus text format.

Labels are bounded: ``model`` is one of the configured model ids or ``other``;
``endpoint`` and ``status`` come from small fixed sets. No user ids, keys or prompts.
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
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

OTHER = "other"


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: Iterable[str]) -> None:
        disable_created_metrics()
        self._models = frozenset(models)
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

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER

    def render(self) -> bytes:
        return generate_latest(self.registry)
