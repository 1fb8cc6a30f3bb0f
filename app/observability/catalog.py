"""Every Switchyard metric, as data: name, type, help, labels and buckets.

The gateway builds its families from this table (``app.observability.metrics``), the
README's metrics table is generated from it (``python -m app.observability.catalog``),
and the alert rules and dashboards are checked against it, so none of them can name a
metric that does not exist or a label it does not carry.

Labels are bounded: each label name has one documented value set (``LABELS``); no label
carries a user id, a key, a prompt or an adapter name. Families with a ``tenant`` label
are served only to the admin token (``app.api.metrics``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "histogram", "gauge"]
Group = Literal["requests", "latency", "routing", "money", "sessions", "state", "engine"]
# gateway: each ingress replica's /metrics (prometheus_client). replica: each LLMServer
# replica through Ray's metrics export (ray.serve.metrics), which names it ``ray_<name>``
# and adds the ``deployment``, ``replica`` and ``application`` labels.
Source = Literal["gateway", "replica"]

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12,
                   10.24, 20.48, 40.96)  # fmt: skip
DECISION_BUCKETS = (25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
SESSION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
CALL_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1, 2.5, 5, 10, 30)  # fmt: skip
STAGES = ("authenticate", "parse", "route", "admit", "dispatch", "respond")  # app.api.stages
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

# a pool's slots and token sums on one ingress replica (app.fairness)
QUEUE_SLOT_KINDS = ("cap", "running", "light", "reserved", "prefill_tokens", "kv_tokens")

LABELS: dict[str, str] = {
    "model": "a configured model id, or `other`",
    "endpoint": "`chat`, `completion`, `embeddings`, `responses` (OpenAI's Responses), "
    "`messages` (Anthropic's)",
    "status": "the HTTP status answered (a few dozen codes at most)",
    "tenant": "a tenant named in `gateway.metrics_tenants`, or `other`",
    "kind": "`prompt`, `completion`, `cached` (tokens); `prompt`, `matched` (prefix blocks); "
    "`" + "`, `".join(QUEUE_SLOT_KINDS) + "` (a fair queue's slots)",
    "slo": "`met`, `missed`, `cancelled`, `none`",
    "reason": "a fixed set per family (see its help)",
    "op": "`principal`, `admit`, `settle`",
    "pool": "a pool of the routes file",
    "stage": "`" + "`, `".join(STAGES) + "` (the ingress's stages, in order)",
    "step": "`canary`, `tenant`, `speculative`, `default`, `fallback`",
    "scorer": "`prefix`, `load`, `prefill`, `session`, `adapter`, `load:imbalance`, "
    "`tiebreak`, `only`",
    "cold": "`true`, `false`",
    "served": "`remote`, `local`",
    "band": "`interactive`, `standard`, `batch` (a request's priority band)",
    "outcome": "`held`, `stale` (the fair queue's engine caps)",
    "deployment": "an LLMServer deployment (added by Ray Serve)",
    "replica": "the replica that exported the series: an LLMServer replica (added by Ray "
    "Serve) or, on the gateway families, an ingress replica (bounded by the replica counts)",
    "application": "the Serve application (added by Ray Serve)",
}
RAY_LABELS = ("deployment", "replica", "application")
# Exported at 0 from start-up, so the first refusal of each kind is a visible increase
# (a counter series born at 1 shows no rate until its second increment).
REJECTION_REASONS = ("auth", "forbidden", "rate", "concurrency", "budget", "store",
                     "session_cancelled")  # fmt: skip
ENGINE_CAP_OUTCOMES = ("held", "stale")  # from a pool's first request (app.fairness)


@dataclass(frozen=True)
class Metric:
    name: str  # as registered: a counter is exported with ``_total`` after it
    kind: Kind
    group: Group
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    source: Source = "gateway"

    @property
    def exported(self) -> str:
        """The name a query uses (a histogram's series add ``_bucket|_sum|_count``)."""
        base = "ray_" + self.name if self.source == "replica" else self.name
        return base + "_total" if self.kind == "counter" else base

    @property
    def query_labels(self) -> tuple[str, ...]:
        """The labels a scraped series carries."""
        if self.source == "replica":
            return (*RAY_LABELS, *self.labels)
        return (*self.labels, "replica")  # the ingress replica (app.observability.board)

    @property
    def tenant(self) -> bool:
        return "tenant" in self.labels


METRICS: tuple[Metric, ...] = (
    # requests
    Metric("switchyard_requests", "counter", "requests",
           "Requests answered by the gateway, by model, endpoint and HTTP status.",
           ("model", "endpoint", "status")),
    Metric("switchyard_prompt_tokens", "counter", "requests", "Prompt tokens processed.",
           ("model",)),
    Metric("switchyard_completion_tokens", "counter", "requests",
           "Completion tokens generated.", ("model",)),
    Metric("switchyard_requests_aborted", "counter", "requests",
           "Requests aborted because the client went away before the end.", ("model",)),
    Metric("switchyard_rejections", "counter", "requests",
           "Requests refused by layer 1, by reason (" + ", ".join(REJECTION_REASONS) + "); "
           "every reason is exported from start-up, at 0.", ("reason",)),
    # latency
    Metric("switchyard_time_to_first_token_seconds", "histogram", "latency",
           "Gateway-measured time from request arrival to the first content chunk.",
           ("model",), LATENCY_BUCKETS),
    Metric("switchyard_inter_token_latency_seconds", "histogram", "latency",
           "Gateway-measured gap between consecutive content chunks.", ("model",),
           ITL_BUCKETS),
    Metric("switchyard_e2e_request_latency_seconds", "histogram", "latency",
           "Gateway-measured time from request arrival to the last byte.",
           ("model", "endpoint"), LATENCY_BUCKETS),
    Metric("switchyard_stage_seconds", "histogram", "latency",
           "Time a request spent in each stage of the ingress (app.api.stages): "
           "authenticate, parse, route, admit (tokenizing, limits, budgets), dispatch "
           "(to the first delta, fallbacks included) and respond (the first delta to the "
           "end); the stage a request failed in, and those after it, are not observed.",
           ("endpoint", "stage"), STAGE_BUCKETS),
    Metric("switchyard_adapter_load_seconds", "histogram", "latency",
           "Time a replica spent loading a LoRA adapter into its engine for a request (a "
           "cold load), by base model.", ("model",), LATENCY_BUCKETS),
    Metric("switchyard_pd_prefill_seconds", "histogram", "latency",
           "The prefill leg of a disaggregated request as the ingress saw it (a prefill "
           "replica computing the prompt's KV), when it succeeded.", ("model",),
           LATENCY_BUCKETS),
    Metric("switchyard_pd_handoff_seconds", "histogram", "latency",
           "From the prefill leg's end to the decode leg's first token: the KV transfer "
           "plus the decode replica's queue and one decode step.", ("model",),
           LATENCY_BUCKETS),
    # routing
    Metric("switchyard_route_decisions", "counter", "routing",
           "Routing decisions, by served model, pool (from the routes file) and the step "
           "that decided (canary, tenant, speculative, default, fallback).",
           ("model", "pool", "step")),
    Metric("switchyard_route_fallbacks", "counter", "routing",
           "Attempts that failed before the first token and moved to the next pool, by "
           "reason.", ("reason",)),
    Metric("switchyard_queue_wait_seconds", "histogram", "routing",
           "Time a request waited at the ingress for a slot of its saturated model (0 when "
           "it started at once), by band.", ("model", "band"), LATENCY_BUCKETS),
    Metric("switchyard_queue_shed", "counter", "routing",
           "Requests the fair queue shed, by band and reason (over_share: 429; pool_full, "
           "queue_timeout: 503; each with Retry-After).", ("model", "band", "reason")),
    Metric("switchyard_queue_waiting", "gauge", "routing",
           "Requests waiting for a slot of a saturated pool on this ingress replica, by "
           "band (read at scrape time).", ("pool", "band")),
    Metric("switchyard_queue_engine_caps", "counter", "routing",
           "The fair queue's engine caps on this ingress replica: held (every replica's "
           "last report said its engine was full, so no more requests start than run), "
           "stale (those reports aged out: the pool's slots alone decide, fail open).",
           ("pool", "outcome")),
    Metric("switchyard_queue_slots", "gauge", "routing",
           "A saturated pool's slots on this ingress replica, read at scrape time: cap (its "
           "slots now, lower while the engines are full), running, light (held by requests "
           "not batch whose tenant was under its fair part), reserved (free slots only "
           "light requests may take), and the token caps' sums (prefill_tokens: started "
           "prompts without their first token; kv_tokens: reserved KV).", ("pool", "kind")),
    Metric("switchyard_replica_decisions", "counter", "routing",
           "Replica decisions of Switchyard's replica router, by model and what decided "
           "(prefix, load, prefill, session, adapter, load:imbalance, tiebreak, only).",
           ("model", "scorer")),
    Metric("switchyard_replica_decision_seconds", "histogram", "routing",
           "Time the replica router's scorers took for one decision.", ("model",),
           DECISION_BUCKETS),
    Metric("switchyard_replica_prefix_blocks", "counter", "routing",
           "Prompt blocks of routed requests (kind: prompt) and those the chosen replica "
           "was believed to hold (kind: matched): matched / prompt is the affinity hit "
           "rate.", ("model", "kind")),
    Metric("switchyard_replica_index_blocks", "gauge", "routing",
           "Block hashes in this ingress replica's prefix index for the model's replicas "
           "(at most routing.prefix.max_blocks per replica), at its last decision.",
           ("model",)),
    Metric("switchyard_adapter_requests", "counter", "routing",
           "Requests that ran a LoRA adapter, by base model and whether the replica had to "
           "load the adapter first (cold: true|false). Adapter names are not labels.",
           ("model", "cold")),
    Metric("switchyard_pd_requests", "counter", "routing",
           "Requests to a disaggregated model, by how they were served (served: "
           "remote|local) and why (reason: the rule's, or fallback_<cause> when a remote "
           "choice was served locally).", ("model", "served", "reason")),
    # money
    Metric("switchyard_tenant_tokens", "counter", "money",
           "Tokens billed, by tenant and kind (prompt, completion, cached).",
           ("tenant", "kind")),
    Metric("switchyard_tenant_cost_usd", "counter", "money",
           "Cost billed in US dollars, by tenant.", ("tenant",)),
    Metric("switchyard_tenant_requests", "counter", "money",
           "Admitted requests settled on the ledger, by tenant.", ("tenant",)),
    Metric("switchyard_tenant_gpu_seconds", "counter", "money",
           "Engine seconds charged to the tenant's requests: each its share of every "
           "engine step it was in (prefix-cache hits not recomputed, both P/D legs).",
           ("tenant",)),
    Metric("switchyard_tenant_gpu_cost_usd", "counter", "money",
           "Those engine seconds priced at their pools' GPU-hour (gpu_hourly_usd), by "
           "tenant: what serving the tenant cost, beside what it was billed.", ("tenant",)),
    Metric("switchyard_tenant_service_tokens", "counter", "money",
           "Weighted tokens served to the tenant at saturated models (the fair queue's "
           "service: input_weight × prompt + output_weight × output), by tenant.",
           ("tenant",)),
    Metric("switchyard_reservations_outstanding", "gauge", "money",
           "Admitted requests whose budget reservation is not settled yet (read at "
           "scrape time)."),
    # sessions
    Metric("switchyard_session_duration_seconds", "histogram", "sessions",
           "Ended agent sessions: wall time from the first call's start to the last "
           "call's end.", ("tenant",), SESSION_BUCKETS),
    Metric("switchyard_session_calls", "histogram", "sessions",
           "Ended agent sessions: calls per session.", ("tenant",), CALL_BUCKETS),
    Metric("switchyard_sessions", "counter", "sessions",
           "Ended agent sessions by SLO verdict (met, missed, cancelled, none).",
           ("tenant", "slo")),
    Metric("switchyard_session_cancels", "counter", "sessions",
           "Whole-session cancels made through this replica.", ("tenant",)),
    Metric("switchyard_session_cancelled_calls", "counter", "sessions",
           "Calls in flight ended by a whole-session cancel.", ("tenant",)),
    # state
    Metric("switchyard_state_store_seconds", "histogram", "state",
           "Latency of state-store operations (principal, admit, settle).", ("op",),
           STORE_BUCKETS),
    Metric("switchyard_state_store_failures", "counter", "state",
           "State-store operations that failed or timed out.", ("op",)),
    Metric("switchyard_settlements_pending", "gauge", "state",
           "Settlements the state store did not take yet, kept in the replica's journal."),
    Metric("switchyard_settlements_journaled", "counter", "state",
           "Settlements journaled because the state store did not take them."),
    # engine: each LLMServer replica, from its engine's own statistics
    Metric("switchyard_engine_running_requests", "gauge", "engine",
           "Requests the engine is running (scheduled in its batch).", ("model",),
           source="replica"),
    Metric("switchyard_engine_waiting_requests", "gauge", "engine",
           "Requests queued in the engine, not yet scheduled.", ("model",),
           source="replica"),
    Metric("switchyard_engine_kv_cache_usage_ratio", "gauge", "engine",
           "Fraction of the engine's KV-cache blocks in use (0-1).", ("model",),
           source="replica"),
    Metric("switchyard_engine_prefix_cache_queried_tokens", "counter", "engine",
           "Prompt tokens the engine looked up in its prefix cache.", ("model",),
           source="replica"),
    Metric("switchyard_engine_prefix_cache_hit_tokens", "counter", "engine",
           "Prompt tokens the engine found in its prefix cache (hit rate: this over "
           "the queried tokens).", ("model",), source="replica"),
    Metric("switchyard_engine_preemptions", "counter", "engine",
           "Requests the engine preempted (KV cache full).", ("model",), source="replica"),
    Metric("switchyard_engine_busy_seconds", "counter", "engine",
           "Seconds the engine spent computing steps, by its own measure: what the "
           "requests' GPU-time charges (switchyard_tenant_gpu_seconds) add up to; busy / "
           "wall time is the engine's utilisation.", ("model",), source="replica"),
    Metric("switchyard_engine_spec_decode_drafts", "counter", "engine",
           "Speculative decoding: drafts the engine proposed (vLLM's "
           "spec_decode_num_drafts).", ("model",), source="replica"),
    Metric("switchyard_engine_spec_decode_draft_tokens", "counter", "engine",
           "Speculative decoding: tokens the drafts proposed.", ("model",),
           source="replica"),
    Metric("switchyard_engine_spec_decode_accepted_tokens", "counter", "engine",
           "Speculative decoding: proposed tokens the target model accepted (acceptance: "
           "this over the draft tokens; tokens per step: 1 + this over the drafts).",
           ("model",), source="replica"),
    Metric("switchyard_engine_step_tokens", "histogram", "engine",
           "Tokens one engine step processed (prompt and generated): the batch size.",
           ("model",), STEP_TOKEN_BUCKETS, source="replica"),
    Metric("switchyard_engine_queue_seconds", "histogram", "latency",
           "Per finished request: from its arrival in the engine to its first step.",
           ("model",), LATENCY_BUCKETS, source="replica"),
    Metric("switchyard_engine_prefill_seconds", "histogram", "latency",
           "Per finished request: from its first step to its first token.", ("model",),
           LATENCY_BUCKETS, source="replica"),
    Metric("switchyard_engine_decode_seconds", "histogram", "latency",
           "Per finished request: from its first token to its last.", ("model",),
           LATENCY_BUCKETS, source="replica"),
)  # fmt: skip

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

# Ray Serve's own series that the alert rules and dashboards use (Ray defines them).
RAY_SERIES: dict[str, tuple[str, ...]] = {
    "ray_serve_deployment_replica_starts_total": RAY_LABELS,
    "ray_serve_deployment_replica_healthy": RAY_LABELS,
}


def get(name: str) -> Metric:
    return BY_NAME[name]


def series_names() -> dict[str, Metric]:
    """Every series name a query may use (counters' ``_total``, histograms'
    ``_bucket|_sum|_count``), to the metric it belongs to."""
    out: dict[str, Metric] = {}
    for m in METRICS:
        if m.kind == "histogram":
            out.update({m.exported + s: m for s in ("_bucket", "_sum", "_count")})
        else:
            out[m.exported] = m
    return out


def problems(expr: str) -> list[str]:
    """What a PromQL expression names that the catalog does not define: unknown series
    (Switchyard's or Ray Serve's), and labels in a matcher or a ``by``/``without``
    clause that none of its series carries (``le`` is every histogram's)."""
    series = {n: m.query_labels for n, m in series_names().items()} | RAY_SERIES
    names = set(re.findall(r"\b(?:ray_)?(?:switchyard|serve)_\w+", expr))
    out = [f"unknown series {n}" for n in sorted(names - set(series))]
    if not names:
        out.append("names no Switchyard series")
    labels = {"le"} | {label for n in names & set(series) for label in series[n]}
    used = {m for block in re.findall(r"\{([^}]*)\}", expr)
            for m in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", block)}  # fmt: skip
    used |= {g.strip() for block in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
             for g in block.split(",") if g.strip()}  # fmt: skip
    out += [f"unknown label {label}" for label in sorted(used - labels)]
    return out


def markdown() -> str:
    """The README's metrics table (between its ``metrics-table`` markers)."""
    rows = ["| metric | type | labels | where | what it counts |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.query_labels) or "—"
        if m.source == "replica":
            who = "Ray's metrics export"
        else:
            who = "`/metrics`, admin token" if m.tenant else "`/metrics`"
        rows.append(f"| `{m.exported}` | {m.kind} | {labels} | {who} | {m.help} |")
    values = ["", "| label | values |", "|---|---|"]
    values += [f"| `{name}` | {v} |" for name, v in LABELS.items()]
    return "\n".join(rows + values) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
