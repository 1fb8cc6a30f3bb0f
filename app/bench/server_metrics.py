"""Server-side figures scraped from a server's Prometheus ``/metrics`` around a stage.

Rules:
* Scrape ``GET {base_url}/metrics`` (a trailing ``/v1`` is dropped) before and after a
  stage window; any error, non-200 status or timeout reads as "not reported" (None).
* Metric names read (vLLM v1, ``vllm/v1/metrics/loggers.py``; Switchyard's gateway):
  histograms ``vllm:request_queue_time_seconds`` (queue_time: waiting in the scheduler
  queue), ``vllm:request_prefill_time_seconds`` (prefill_time),
  ``vllm:request_decode_time_seconds`` (decode_time), ``vllm:time_to_first_token_seconds``
  (server_ttft) and ``switchyard_time_to_first_token_seconds`` (gateway_ttft); counters
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens).
* Every label set (engine, model) of a metric is summed. Buckets are summed over the
  bounds that every label set exports, so cumulative counts stay exact.
* Over the window, each histogram's buckets, sum and count are ``after - before`` (a
  counter that went down means the server restarted: ``after`` alone is used).
  count, mean = sum / count, and p50/p95/p99 estimated as Prometheus'
  ``histogram_quantile``: rank = q * count, found in the first bucket whose cumulative
  count reaches it, interpolated linearly between that bucket's bounds (the lowest
  bucket starts at 0; a rank in the +Inf bucket returns the highest finite bound).
* These are the server's aggregates over the stage window (any other client's traffic
  included), at bucket resolution, not per-request measurements; seconds throughout.
* Only what the server exported appears: ``delta`` returns {} when nothing known was
  found, so a report can say "queue time: not reported by the server".
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS: dict[str, str] = {
    "queue_time": "vllm:request_queue_time_seconds",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
    "server_ttft": "vllm:time_to_first_token_seconds",
    "gateway_ttft": "switchyard_time_to_first_token_seconds",
}
COUNTERS: dict[str, str] = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
}
QUANTILES: tuple[float, ...] = (0.50, 0.95, 0.99)


@dataclass
class Hist:
    """A histogram summed over label sets: cumulative count per upper bound, sum, count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0


@dataclass
class Snapshot:
    """The known metrics found in one scrape (absent ones are simply missing)."""

    histograms: dict[str, Hist] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


async def scrape(
    session: aiohttp.ClientSession | None, base_url: str, *, timeout_s: float = 5.0
) -> str | None:
    """The text of ``{base_url}/metrics``, or None on any error or non-200 status. Pass
    a session without the API key (or None for a fresh one): Switchyard answers a
    ``/metrics`` request that carries a non-admin credential with 401."""
    base = base_url.rstrip("/")
    base = base.removesuffix("/v1")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await _get(own, f"{base}/metrics", timeout)
        return await _get(session, f"{base}/metrics", timeout)
    except Exception:
        return None


async def _get(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout
) -> str | None:
    async with session.get(url, timeout=timeout) as resp:
        return await resp.text() if resp.status == 200 else None


def parse(text: str | None) -> Snapshot:
    """Sum the known histograms and counters over all their label sets (text that is not
    Prometheus exposition format yields an empty snapshot)."""
    try:
        return _parse(text or "")
    except ValueError:
        return Snapshot()


def _parse(text: str) -> Snapshot:
    snap = Snapshot()
    by_name = {name: key for key, name in HISTOGRAMS.items()}
    # per metric, per label set (without "le"): bound -> cumulative count
    series: dict[str, dict[tuple[tuple[str, str], ...], dict[float, float]]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for suffix in ("_bucket", "_sum", "_count"):
                key = by_name.get(s.name.removesuffix(suffix)) if s.name.endswith(suffix) else None
                if key is None:
                    continue
                hist = snap.histograms.setdefault(key, Hist())
                if suffix == "_sum":
                    hist.sum += s.value
                elif suffix == "_count":
                    hist.count += s.value
                else:
                    labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    series[key].setdefault(labels, {})[float(s.labels["le"])] = s.value
                break
            for key, name in COUNTERS.items():
                if s.name in (name, f"{name}_total"):
                    snap.counters[key] = snap.counters.get(key, 0.0) + s.value
    for key, per_labels in series.items():
        common = set.intersection(*(set(b) for b in per_labels.values()))
        snap.histograms[key].buckets = {
            le: sum(b[le] for b in per_labels.values()) for le in sorted(common)
        }
    return snap


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' estimate of the q-quantile (0..1) from cumulative bucket counts."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0 or not 0.0 <= q <= 1.0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for i, le in enumerate(bounds):
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return bounds[-2] if len(bounds) > 1 else None
            if i == 0 and le <= 0:
                return le
            if count == prev_count:
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None  # unreachable: the +Inf bucket holds the total


def _sub(before: Hist | None, after: Hist) -> Hist:
    if before is None or after.count < before.count:
        return after
    common = before.buckets.keys() & after.buckets.keys()
    if any(after.buckets[le] < before.buckets[le] for le in common):
        return after
    return Hist(
        buckets={le: after.buckets[le] - before.buckets[le] for le in sorted(common)},
        sum=after.sum - before.sum,
        count=after.count - before.count,
    )


def delta(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Server-side figures over the window between two snapshots (see the module rules)."""
    out: dict[str, Any] = {}
    for key in HISTOGRAMS:
        if key not in after.histograms:
            continue
        h = _sub(before.histograms.get(key), after.histograms[key])
        count = round(h.count)
        fig: dict[str, Any] = {"count": count, "mean": h.sum / h.count if count > 0 else None}
        for q in QUANTILES:
            fig[f"p{q * 100:g}"] = histogram_quantile(q, h.buckets) if count > 0 else None
        out[key] = fig
    if "prefix_cache_queries" in after.counters:
        queries = after.counters["prefix_cache_queries"]
        hits = after.counters.get("prefix_cache_hits", 0.0)
        b_queries = before.counters.get("prefix_cache_queries", 0.0)
        if queries >= b_queries:
            queries, hits = (
                queries - b_queries,
                hits - before.counters.get("prefix_cache_hits", 0.0),
            )
        out["prefix_cache"] = {
            "queries": queries,
            "hits": hits,
            "hit_rate": hits / queries if queries > 0 else None,
        }
    return out
