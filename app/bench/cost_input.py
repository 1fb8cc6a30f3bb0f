"""What a report of record measured, as the cost model needs it (``switchyard cost``).

Rule: any mapping in a report's JSON holding ``records`` — a list of the load
generator's request records (``RequestRecord.to_json``) — is a *run*, named by its key
path (``arms.default.loads.c32-run1``, or ``records`` for a ``switchyard bench`` result).
A run's figures come from ``app.bench.metrics.summarize`` over its measured records
(warm-up excluded): input and output tokens per second (the server's usage counts over
the run's duration, first intended send to last completion), requests per second, the
success rate (completed / sent), the cached share of prompt tokens where the server
reported it, and tokens per request — for the whole run and per workload class (the
records' ``kind``) — and, given per-request SLO limits (or the report's own, a bench
result's ``config.slo``), the share of the measured requests meeting them. Retries are
not in the records, so the retry overhead is reported
as not measured (None) rather than zero.

``select`` names one run (a path, or a unique suffix of one); with none given a report
with exactly one run uses it, and any other refuses with the list of runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.bench.metrics import SLO, summarize
from app.bench.records import RequestRecord


@dataclass(frozen=True)
class MeasuredClass:
    """One workload class of a run (its records' ``kind``)."""

    name: str
    requests: int
    success_rate: float
    input_tokens_per_request: float
    output_tokens_per_request: float


@dataclass(frozen=True)
class MeasuredRun:
    run: str
    requests: int
    success_rate: float
    duration_s: float
    requests_per_s: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    input_tokens_per_request: float
    output_tokens_per_request: float
    cached_share: float | None
    retry_overhead: float | None = None  # not in the records
    classes: tuple[MeasuredClass, ...] = ()
    slo_met: float | None = None  # share of requests meeting the SLO, when one is known


def runs(data: Any, path: str = "") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Every (path, records) in a report's JSON, depth first, in file order."""
    if isinstance(data, dict):
        recs = data.get("records")
        if (
            isinstance(recs, list)
            and recs
            and all(isinstance(r, dict) and "intended" in r for r in recs)
        ):
            yield path or "records", recs
        for key, value in data.items():
            if key != "records":
                yield from runs(value, f"{path}.{key}" if path else str(key))


def pick(data: Any, select: str | None) -> tuple[str, list[dict[str, Any]]]:
    found = list(runs(data))
    if not found:
        raise ValueError("the report holds no request records (a run with `records`)")
    if select is None:
        if len(found) == 1:
            return found[0]
        names = ", ".join(name for name, _ in found)
        raise ValueError(f"the report holds {len(found)} runs: pick one with --run ({names})")
    matches = [(n, r) for n, r in found if n == select or n.endswith("." + select)]
    if len(matches) != 1:
        names = ", ".join(name for name, _ in found)
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ValueError(f"{what} named {select!r} in the report; runs: {names}")
    return matches[0]


def report_slo(data: Any) -> SLO | None:
    """A bench result's own per-request SLO (``config.slo``), when it set one."""
    raw = data.get("config", {}).get("slo") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        slo = SLO.model_validate(raw)
    except ValueError:
        return None  # another report's SLO shape (a profile tune's p95 goals)
    return slo if slo.has_limits else None


def measured(data: Any, select: str | None = None, slo: SLO | None = None) -> MeasuredRun:
    """The figures of one run; ``slo``: per-request limits (default: the report's own)."""
    slo = slo or report_slo(data)
    name, raw = pick(data, select)
    records = [RequestRecord.from_json(r) for r in raw]
    records = [r for r in records if not r.warmup]
    if not records:
        raise ValueError(f"run {name!r} has only warm-up records")
    s = summarize(records)
    if s["duration_s"] <= 0:
        raise ValueError(f"run {name!r} has no duration")
    done = s["completed"]
    return MeasuredRun(
        run=name,
        requests=s["requests"],
        success_rate=done / s["requests"],
        duration_s=s["duration_s"],
        requests_per_s=s["request_throughput"],
        input_tokens_per_s=s["total_input_tokens"] / s["duration_s"],
        output_tokens_per_s=s["output_throughput"],
        input_tokens_per_request=s["total_input_tokens"] / done if done else 0.0,
        output_tokens_per_request=s["total_output_tokens"] / done if done else 0.0,
        cached_share=s["cache_hit_rate"],
        classes=tuple(_class(kind, group) for kind, group in _by_kind(records).items()),
        slo_met=None if slo is None else sum(map(slo.good, records)) / len(records),
    )


def _by_kind(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.kind, []).append(r)
    return dict(sorted(groups.items()))


def _class(kind: str, records: list[RequestRecord]) -> MeasuredClass:
    s = summarize(records)
    done = s["completed"]
    return MeasuredClass(
        name=kind,
        requests=s["requests"],
        success_rate=done / s["requests"],
        input_tokens_per_request=s["total_input_tokens"] / done if done else 0.0,
        output_tokens_per_request=s["total_output_tokens"] / done if done else 0.0,
    )
