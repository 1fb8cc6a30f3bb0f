"""The Grafana dashboard, as data: seed 003 §7's six rows (service health, user
experience, engine efficiency, scheduler, cache, cost) and fair sharing, each panel one PromQL query
over the catalog's series, with the variables model / tenant / pool / replica.

``python -m app.observability.dashboards`` writes ``grafana/dashboards/switchyard.json``
(what Grafana imports and the chart provisions); a test keeps the file equal to this
module and checks every query against the catalog."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

RATE = "[$__rate_interval]"
M = 'model=~"$model"'
ENGINE = 'model=~"$model", replica=~"$replica"'


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    unit: str = "short"
    legend: str = ""


def _q(quantile: float, series: str, by: str = "le", where: str = M) -> str:
    """A quantile over every replica's buckets (histograms aggregate with sum by le)."""
    return f"histogram_quantile({quantile}, {_agg(series + '_bucket', where, by)})"


def _agg(series: str, where: str = "", by: str = "", rate: bool = True, op: str = "sum") -> str:
    inner = f"{series}{{{where}}}"
    if rate:
        inner = f"rate({inner}{RATE})"
    return f"{op} by ({by}) ({inner})" if by else f"{op}({inner})"


def _share(part: str, whole: str, where_part: str, where_whole: str) -> str:
    """``part / whole``, 0 (not "no data") while nothing matches ``part``."""
    return f"({_agg(part, where_part)} or vector(0)) / {_agg(whole, where_whole)}"


TTFT = "switchyard_time_to_first_token_seconds"
HIT = "ray_switchyard_engine_prefix_cache_hit_tokens_total"
QUERIED = "ray_switchyard_engine_prefix_cache_queried_tokens_total"
TOKENS = "switchyard_tenant_tokens_total"
T = 'tenant=~"$tenant"'
GPU_USD = "switchyard_tenant_gpu_cost_usd_total"
REQUESTS = "switchyard_tenant_requests_total"
BILLED = T + ', kind=~"prompt|completion"'

ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Service health", (
        Panel("Requests by status", _agg("switchyard_requests_total", M, "status"), "reqps",
              "{{status}}"),
        Panel("Server errors (5xx share)",
              _share("switchyard_requests_total", "switchyard_requests_total",
                     f'{M}, status=~"5.."', M), "percentunit"),
        Panel("Refused by layer 1", _agg("switchyard_rejections_total", by="reason"), "reqps",
              "{{reason}}"),
        Panel("State store p99", _q(0.99, "switchyard_state_store_seconds", "op, le", ""), "s",
              "{{op}}"),
        Panel("Settlements pending", _agg("switchyard_settlements_pending", rate=False,
                                          op="max")),
    )),
    ("User experience", (
        Panel("Time to first token p50", _q(0.5, TTFT, "model, le"), "s", "{{model}}"),
        Panel("Time to first token p95", _q(0.95, TTFT, "model, le"), "s", "{{model}}"),
        Panel("Inter-token latency p95",
              _q(0.95, "switchyard_inter_token_latency_seconds", "model, le"), "s", "{{model}}"),
        Panel("End to end p95",
              _q(0.95, "switchyard_e2e_request_latency_seconds", "endpoint, le"), "s",
              "{{endpoint}}"),
        Panel("Clients that left", _agg("switchyard_requests_aborted_total", M, "model"), "reqps",
              "{{model}}"),
        Panel("Ingress stages p95 (app.api.stages)",
              _q(0.95, "switchyard_stage_seconds", "stage, le", ""), "s", "{{stage}}"),
    )),
    ("Engine efficiency", (
        Panel("Generated tokens/s", _agg("switchyard_completion_tokens_total", M, "model"),
              "short", "{{model}}"),
        Panel("Running requests", _agg("ray_switchyard_engine_running_requests", ENGINE,
                                       "replica", rate=False), "short", "{{replica}}"),
        Panel("Waiting requests", _agg("ray_switchyard_engine_waiting_requests", ENGINE,
                                       "replica", rate=False), "short", "{{replica}}"),
        Panel("KV-cache usage", _agg("ray_switchyard_engine_kv_cache_usage_ratio", ENGINE,
                                     "replica", rate=False, op="max"), "percentunit",
              "{{replica}}"),
        Panel("Tokens per engine step (mean batch)",
              _agg("ray_switchyard_engine_step_tokens_sum", ENGINE) + " / "
              + _agg("ray_switchyard_engine_step_tokens_count", ENGINE)),
        Panel("Preemptions",
              _agg("ray_switchyard_engine_preemptions_total", ENGINE, "replica") + " or "
              + _agg("ray_switchyard_engine_running_requests", ENGINE, "replica", rate=False)
              + " * 0", "short", "{{replica}}"),  # 0, not "no data", before the first
        Panel("Speculative acceptance (accepted / draft tokens)",
              _agg("ray_switchyard_engine_spec_decode_accepted_tokens_total", ENGINE, "replica")
              + " / " + _agg("ray_switchyard_engine_spec_decode_draft_tokens_total", ENGINE,
                             "replica"), "percentunit", "{{replica}}"),
        Panel("Speculative tokens per draft (accepted / drafts)",
              _agg("ray_switchyard_engine_spec_decode_accepted_tokens_total", ENGINE, "replica")
              + " / " + _agg("ray_switchyard_engine_spec_decode_drafts_total", ENGINE,
                             "replica"), "short", "{{replica}}"),
    )),
    ("Scheduler", (
        Panel("Route decisions by step",
              _agg("switchyard_route_decisions_total", f'{M}, pool=~"$pool"', "step"), "reqps",
              "{{step}}"),
        Panel("Replica decisions by scorer",
              _agg("switchyard_replica_decisions_total", M, "scorer"), "reqps", "{{scorer}}"),
        Panel("Fallbacks by reason", _agg("switchyard_route_fallbacks_total", by="reason"),
              "reqps", "{{reason}}"),
        Panel("Engine queue time p95",
              _q(0.95, "ray_switchyard_engine_queue_seconds", "le", ENGINE), "s"),
        Panel("Engine prefill time p95",
              _q(0.95, "ray_switchyard_engine_prefill_seconds", "le", ENGINE), "s"),
        Panel("Engine decode time p95",
              _q(0.95, "ray_switchyard_engine_decode_seconds", "le", ENGINE), "s"),
        Panel("Prefill/decode split", _agg("switchyard_pd_requests_total", M, "served, reason"),
              "reqps", "{{served}} {{reason}}"),
    )),
    ("Fair sharing", (
        Panel("Wait for a slot p95 by band (fair queue)",
              _q(0.95, "switchyard_queue_wait_seconds", "band, le"), "s", "{{band}}"),
        Panel("Waiting for a slot by band",
              _agg("switchyard_queue_waiting", 'pool=~"$pool"', "band", rate=False), "short",
              "{{band}}"),
        Panel("Shed by band and reason",
              _agg("switchyard_queue_shed_total", M, "band, reason") + " or "
              + _agg("switchyard_queue_waiting", "", "band", rate=False) + " * 0", "reqps",
              "{{band}} {{reason}}"),  # 0, not "no data", before the first
        Panel("Weighted service by tenant (VTC)",
              _agg("switchyard_tenant_service_tokens_total", T, "tenant"), "short",
              "{{tenant}}"),
        Panel("Slots: cap, running, held light, kept free for light",
              _agg("switchyard_queue_slots",
                   'pool=~"$pool", kind=~"cap|running|light|reserved"', "kind", rate=False),
              "short", "{{kind}}"),
        Panel("Engine caps: held, stale (fail open)",
              _agg("switchyard_queue_engine_caps_total", 'pool=~"$pool"', "outcome") + " or "
              + _agg("switchyard_queue_waiting", 'pool=~"$pool"', "band", rate=False)
              + " * 0", "reqps", "{{outcome}}"),
    )),
    ("Cache", (
        Panel("Engine prefix-cache hit rate", _share(HIT, QUERIED, ENGINE, ENGINE),
              "percentunit"),
        Panel("Billed cached share of prompt tokens",
              _share(TOKENS, TOKENS, f'kind="cached", {T}', f'kind="prompt", {T}'),
              "percentunit"),
        Panel("Replica-router affinity hit rate",
              _share("switchyard_replica_prefix_blocks_total",
                     "switchyard_replica_prefix_blocks_total", f'{M}, kind="matched"',
                     f'{M}, kind="prompt"'), "percentunit"),
        Panel("Prefix index blocks (replica router)",
              _agg("switchyard_replica_index_blocks", M, "model", rate=False, op="max"),
              "short", "{{model}}"),
        Panel("Adapter requests (cold loads)",
              _agg("switchyard_adapter_requests_total", M, "cold"), "reqps", "cold={{cold}}"),
    )),
    ("Cost", (
        Panel("Spend per hour by tenant",
              _agg("switchyard_tenant_cost_usd_total", T, "tenant") + " * 3600", "currencyUSD",
              "{{tenant}}"),
        Panel("Tokens by tenant and kind", _agg(TOKENS, T, "tenant, kind"), "short",
              "{{tenant}} {{kind}}"),
        Panel("GPU-time cost per hour by tenant",
              _agg(GPU_USD, T, "tenant") + " * 3600", "currencyUSD", "{{tenant}}"),
        Panel("GPU-time cost per request by tenant",
              f"{_agg(GPU_USD, T, 'tenant')} / {_agg(REQUESTS, T, 'tenant')}",
              "currencyUSD", "{{tenant}}"),
        Panel("GPU-time cost per 1M tokens by tenant",
              f"{_agg(GPU_USD, T, 'tenant')} * 1e6 / {_agg(TOKENS, BILLED, 'tenant')}",
              "currencyUSD", "{{tenant}}"),
        Panel("Budget refusals", _agg("switchyard_rejections_total", 'reason="budget"'),
              "reqps"),
        Panel("Reservations outstanding",
              _agg("switchyard_reservations_outstanding", rate=False)),
    )),
)  # fmt: skip

VARIABLES = (
    ("model", "label_values(switchyard_requests_total, model)"),
    ("tenant", "label_values(switchyard_tenant_tokens_total, tenant)"),
    ("pool", "label_values(switchyard_route_decisions_total, pool)"),
    ("replica", "label_values(ray_switchyard_engine_running_requests, replica)"),
)


def panels() -> list[Panel]:
    return [p for _, row in ROWS for p in row]


def concrete(expr: str, rate_interval: str = "1m", **values: str) -> str:
    """``expr`` as Grafana sends it: each variable replaced by its value (``.*`` for
    All, the default) and ``$__rate_interval`` by ``rate_interval``."""
    out = expr.replace("$__rate_interval", rate_interval)
    for name, _ in VARIABLES:
        out = out.replace("$" + name, values.get(name, ".*"))
    return out


def dashboard() -> dict[str, object]:
    source = {"type": "prometheus", "uid": "${datasource}"}
    out: list[dict[str, object]] = []
    y, next_id = 0, 1
    for title, row in ROWS:
        out.append({"type": "row", "title": title, "id": next_id, "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        next_id, y = next_id + 1, y + 1
        for i, p in enumerate(row):
            out.append({
                "type": "timeseries", "title": p.title, "id": next_id, "datasource": source,
                "gridPos": {"h": 8, "w": 8, "x": 8 * (i % 3), "y": y + 8 * (i // 3)},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "targets": [{"refId": "A", "datasource": source, "expr": p.expr,
                             "legendFormat": p.legend or "__auto"}],
            })  # fmt: skip
            next_id += 1
        y += 8 * ((len(row) + 2) // 3)
    templating: list[dict[str, object]] = [
        {"name": "datasource", "type": "datasource", "query": "prometheus"}
    ]
    templating += [
        {"name": name, "type": "query", "datasource": source, "query": query,
         "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
         "current": {"text": "All", "value": "$__all"}}
        for name, query in VARIABLES
    ]  # fmt: skip
    return {
        "title": "Switchyard",
        "uid": "switchyard",
        "schemaVersion": 39,
        "tags": ["switchyard", "llm-serving"],
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": templating},
        "panels": out,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
