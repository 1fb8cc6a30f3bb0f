"""Side-by-side comparison of two load-generator results (``switchyard bench compare``).

``compare(a, b)`` reads the overall ``summary`` of both results and returns one row per
key metric (throughputs, goodput, error rate, p50/p95/p99 of TTFT, TPOT, ITL and E2E)
with A, B and the ratio B/A, followed by metadata rows (model, engine, git commit, GPU,
workload, SLO) so a comparison of different setups is visible as such. The ratio is
``None`` ("n/a") when either value is missing or A is zero. ``format_comparison``
renders the rows as a plain-text table followed by one line on metadata differences.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from app.bench.report import SCHEMA


class ResultError(ValueError):
    """A file that is not a readable ``switchyard.bench/1`` result."""


@dataclass(frozen=True)
class Row:
    """One compared figure. Metric rows hold numbers (latencies in ms); metadata rows
    hold text."""

    name: str
    a: float | str | None
    b: float | str | None
    unit: str = ""
    kind: Literal["metric", "metadata"] = "metric"
    note: str | None = None
    """For the workload row: which settings differ."""

    @property
    def ratio(self) -> float | None:
        """B / A; None when either is missing or not a number, or A is zero."""
        a, b = self.a, self.b
        if not isinstance(a, int | float) or not isinstance(b, int | float) or a == 0:
            return None
        return float(b) / float(a)

    @property
    def differs(self) -> bool:
        return self.a != self.b


THROUGHPUTS: tuple[tuple[str, str], ...] = (
    ("request_throughput", "req/s"),
    ("output_throughput", "tok/s"),
    ("goodput", "req/s"),
    ("error_rate", "fraction"),
)
LATENCIES: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
QUANTILES: tuple[str, ...] = ("p50", "p95", "p99")


def load_result(path: Path | str) -> dict[str, Any]:
    """Read a result JSON (``.json.gz`` too); ``ResultError`` unless it is a
    ``switchyard.bench/1`` result."""
    try:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    except OSError as exc:
        raise ResultError(f"{path}: cannot read: {exc}") from exc
    except ValueError as exc:
        raise ResultError(f"{path}: not JSON: {exc}") from exc
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise ResultError(
            f"{path}: not a switchyard bench result (schema {schema!r}, expected {SCHEMA!r})"
        )
    checked: dict[str, Any] = data
    return checked


def _number(value: Any, scale: float = 1.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) * scale


def _metrics(a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    sa, sb = a.get("summary") or {}, b.get("summary") or {}
    rows = [Row(key, _number(sa.get(key)), _number(sb.get(key)), unit) for key, unit in THROUGHPUTS]
    for metric in LATENCIES:
        da, db = sa.get(f"{metric}_s") or {}, sb.get(f"{metric}_s") or {}
        for q in QUANTILES:
            rows.append(
                Row(f"{metric} {q}", _number(da.get(q), 1000.0), _number(db.get(q), 1000.0), "ms")
            )
    return rows


def _workload(result: dict[str, Any]) -> dict[str, Any]:
    """What was sent: the workload spec and the load shape (flattened ``a.b`` keys)."""
    config = result.get("config") or {}
    keys = ("mode", "arrival", "burstiness", "seed", "endpoint", "sampling", "workload")
    shape = {k: config.get(k) for k in keys}
    shape["stages"] = [s.get("label") for s in result.get("stages") or []]
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value

    walk("", shape)
    return flat


def _metadata(a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    def field(result: dict[str, Any], key: str) -> str | None:
        meta, config = result.get("metadata") or {}, result.get("config") or {}
        if key == "model":
            return meta.get("model_id") or config.get("model")
        if key == "engine":
            parts = [meta.get("engine"), meta.get("engine_version")]
            return " ".join(str(p) for p in parts if p) or None
        if key == "slo":
            return json.dumps(config.get("slo"), sort_keys=True)
        value = meta.get(key)
        return None if value is None else str(value)

    rows = [
        Row(key, field(a, key), field(b, key), kind="metadata")
        for key in ("model", "model_revision", "engine", "git_commit", "gpu", "slo")
    ]
    wa, wb = _workload(a), _workload(b)
    changed = sorted(k for k in wa.keys() | wb.keys() if wa.get(k) != wb.get(k))
    note = "differs in " + ", ".join(changed) if changed else None
    rows.append(Row("workload", _digest(wa), _digest(wb), kind="metadata", note=note))
    return rows


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    """Metric rows (A, B, B/A) for the key figures, then metadata rows."""
    return _metrics(a, b) + _metadata(a, b)


def _fmt(value: float | str | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if unit == "fraction":
        return f"{value:.2%}"
    return f"{value:.2f}"


def format_comparison(rows: list[Row]) -> str:
    """A plain-text table (metric, unit, A, B, B/A) and a metadata-differences line."""
    table = [("metric", "unit", "A", "B", "B/A")]
    for r in (r for r in rows if r.kind == "metric"):
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.3f}x"
        unit = "" if r.unit == "fraction" else r.unit
        table.append((r.name, unit, _fmt(r.a, r.unit), _fmt(r.b, r.unit), ratio))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    diffs = []
    for r in rows:
        if r.kind != "metadata" or not r.differs:
            continue
        detail = r.note or f"{_fmt(r.a, '')} vs {_fmt(r.b, '')}"
        diffs.append(f"{r.name} ({detail})")
    if diffs:
        lines.append("metadata differs, compare with care: " + "; ".join(diffs))
    else:
        lines.append("metadata: same model, engine, git commit, GPU, workload and SLO")
    return "\n".join(line.rstrip() for line in lines) + "\n"
