"""Goodput per dollar of a bench run, for the whole run, each workload class and each
tenant (``switchyard bench --hourly-usd``).

Rule: the run cost ``hourly_usd × duration / 3600`` (the served hardware's price, all of
it, over the run's measured window). Each group — a workload class (the records'
``kind``), a tenant — is charged a share of that cost by its requests' weighted tokens,
``input_weight × prompt tokens + output tokens`` (the cost sheet's split of engine time
between a prompt token and an output token, ``app.cost.sheet``; a failed request counts
the prompt it sent), so the groups' costs add up to the run's. Per group: its cost, its
requests meeting every SLO per dollar (goodput per dollar; None without an SLO), its
completed requests per dollar and its output tokens per dollar.

This is the client's estimate from the load it sent. What the server measured per
tenant — each request's share of every engine step, priced at the pool's GPU-hour — is
the ledger's ``gpu_cost_usd`` (``switchyard usage``).

Parameters: input_weight = 0.2 (the cost sheet's default).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from app.bench.metrics import SLO
from app.bench.records import RequestRecord

INPUT_WEIGHT = 0.2
SECONDS_PER_HOUR = 3600.0


def _weight(r: RequestRecord, input_weight: float) -> float:
    prompt = r.prompt_tokens if r.prompt_tokens is not None else r.input_tokens
    return input_weight * (prompt or 0) + (r.n_output if r.ok else 0)


def _figures(records: Sequence[RequestRecord], cost: float, slo: SLO | None) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    good = sum(1 for r in ok if slo.good(r)) if slo is not None else None
    out = sum(r.n_output for r in ok if r.endpoint != "embeddings")
    per = (lambda n: n / cost) if cost > 0 else (lambda n: None)
    return {
        "cost_usd": cost,
        "goodput_per_usd": None if good is None else per(good),
        "completed_per_usd": per(len(ok)),
        "output_tokens_per_usd": per(out),
    }


def per_dollar(
    records: Sequence[RequestRecord],
    slo: SLO | None,
    hourly_usd: float,
    duration_s: float,
    input_weight: float = INPUT_WEIGHT,
) -> dict[str, Any]:
    """The run's figures per dollar: ``run``, ``by_kind`` and ``by_tenant`` (module rule)."""
    if slo is not None and not slo.has_limits:
        slo = None
    cost = hourly_usd * duration_s / SECONDS_PER_HOUR
    total = sum(_weight(r, input_weight) for r in records)

    def groups(key: Callable[[RequestRecord], str | None]) -> dict[str, Any]:
        found: dict[str, list[RequestRecord]] = defaultdict(list)
        for r in records:
            name = key(r)
            if name is not None:
                found[name].append(r)
        return {
            name: _figures(
                group,
                cost * sum(_weight(r, input_weight) for r in group) / total if total else 0.0,
                slo,
            )
            for name, group in sorted(found.items())
        }

    return {
        "hourly_usd": hourly_usd,
        "input_weight": input_weight,
        "run": _figures(records, cost, slo),
        "by_kind": groups(lambda r: r.kind),
        "by_tenant": groups(lambda r: r.tenant),
    }
