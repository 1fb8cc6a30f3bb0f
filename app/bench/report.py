"""Files of a load-generator run: the whole result as JSON, a Markdown report and plots.

A result is the runner's JSON-able dict (``schema`` ``switchyard.bench/1``): ``metadata``
(``metadata.collect_metadata``), ``config``, ``stages`` (one per load level, each with
a ``metrics.summarize`` summary), ``summary``, ``by_kind``, ``sessions``, ``self_check``
(was the generator itself a bottleneck?), ``connections``, ``ramp`` and ``records``.

The Markdown opens with a one-line verdict (INVALID when the generator's self-check
failed), then every seed 003 §12 metadata field, the configuration, headline figures,
latencies under both naming conventions (vLLM's and guidellm/AIPerf's, see
``metrics.NAMING``), per-stage, per-kind and session tables, connections opened versus
requests that succeeded, the self-check, the ramp outcome and the plots. It carries no
timestamp but the metadata's date, so the same result renders the same report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.bench import plots
from app.bench.metadata import REQUIRED_FIELDS
from app.bench.metrics import PERCENTILES, pkey

SCHEMA = "switchyard.bench/1"
LATENCY_ROWS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT (vLLM = guidellm/AIPerf)"),
    ("tpot_s", "TPOT (vLLM) = ITL (guidellm/AIPerf)"),
    ("itl_s", "ITL (vLLM: gap between chunks)"),
    ("e2e_s", "E2E (vLLM: E2EL)"),
)
QS: tuple[str, ...] = ("p50", "p95", "p99")


@dataclass(frozen=True)
class ReportFiles:
    """Paths written by ``write_report``."""

    json: Path
    markdown: Path
    plots: dict[str, Path]

    @property
    def paths(self) -> list[Path]:
        return [self.json, self.markdown, *self.plots.values()]


def result_json(result: dict[str, Any]) -> str:
    """The result as JSON: aggregates indented, one compact line per request record."""
    head = {k: v for k, v in result.items() if k != "records"}
    records = result.get("records") or []
    if not records:
        return json.dumps(result, indent=1) + "\n"
    lines = ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in records)
    return json.dumps(head, indent=1)[:-2] + ',\n "records": [\n' + lines + "\n ]\n}\n"


def write_report(result: dict[str, Any], out_dir: Path, name: str) -> ReportFiles:
    """Write ``<name>.json``, ``<name>.md`` and ``<name>-<plot>.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    json_path.write_text(result_json(result))
    pngs = plots.render_all(result, out_dir, name)
    md_path.write_text(render_markdown(result, {k: p.name for k, p in pngs.items()}))
    return ReportFiles(json=json_path, markdown=md_path, plots=pngs)


# ---- formatting -------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _num(value: Any, fmt: str = ".2f", scale: float = 1.0) -> str:
    return "–" if value is None else format(float(value) * scale, fmt)


def _ms(value: Any) -> str:
    return _num(value, ".1f", 1000.0)


def _pct(value: Any) -> str:
    return _num(value, ".2%")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def verdict(result: dict[str, Any]) -> str:
    """``valid`` or ``INVALID (<reason>)`` from the generator's self-check."""
    check = result.get("self_check")
    if not check:
        return "UNCHECKED (no generator self-check in the result)"
    if check.get("valid"):
        return "valid (the load generator kept its schedule)"
    return f"INVALID ({check.get('reason') or 'generator self-check failed'})"


# ---- sections ---------------------------------------------------------------------


def _metadata(meta: dict[str, Any]) -> list[str]:
    extra = [k for k in meta if k not in REQUIRED_FIELDS]
    rows = [(k, meta.get(k, "(missing)")) for k in (*REQUIRED_FIELDS, *extra)]
    return ["## Metadata", "", *_table(("field", "value"), rows)]


def _config(config: dict[str, Any], workload: Any) -> list[str]:
    rows = [(k, v) for k, v in config.items() if k != "workload"]
    lines = ["## Configuration", "", *_table(("setting", "value"), rows)]
    for title, spec in (("Workload spec", config.get("workload")), ("Workload", workload)):
        if spec:
            lines += [f"{title}:", "", "```json", json.dumps(spec, indent=1, sort_keys=True)]
            lines += ["```", ""]
    return lines


def _slo_text(slo: dict[str, Any] | None) -> str:
    if not slo:
        return "none (goodput not measured)"
    parts = [
        f"{m.upper()} ≤ {_ms(slo.get(f'{m}_s'))} ms"
        for m in ("ttft", "tpot", "e2e")
        if slo.get(f"{m}_s") is not None
    ]
    parts.append(f"error rate ≤ {_pct(slo.get('max_error_rate'))}")
    return ", ".join(parts)


def _headline(summary: dict[str, Any], slo: dict[str, Any] | None) -> list[str]:
    s = summary
    rows = [
        ("requests (measured)", s.get("requests")),
        ("completed", s.get("completed")),
        ("failed", s.get("failed")),
        ("error rate", _pct(s.get("error_rate"))),
        ("duration (s)", _num(s.get("duration_s"))),
        ("request throughput (req/s)", _num(s.get("request_throughput"))),
        ("output throughput (tok/s)", _num(s.get("output_throughput"), ".1f")),
        ("total token throughput (tok/s)", _num(s.get("total_token_throughput"), ".1f")),
        ("goodput (req/s meeting every SLO)", _num(s.get("goodput"))),
        ("good requests", s.get("good_requests")),
        ("SLOs", _slo_text(slo)),
        ("prefix cache hit rate", _pct(s.get("cache_hit_rate"))),
    ]
    return ["## Headline", "", *_table(("metric", "value"), rows)]


def _latency(summary: dict[str, Any]) -> list[str]:
    header = ("metric (ms)", "count", "mean", *(pkey(q) for q in PERCENTILES), "max")
    rows = []
    for key, label in LATENCY_ROWS:
        d = summary.get(key) or {}
        stats = [d.get("mean"), *(d.get(pkey(q)) for q in PERCENTILES), d.get("max")]
        rows.append((label, d.get("count"), *(_ms(v) for v in stats)))
    note = (summary.get("naming") or {}).get("note", "")
    return ["## Latency", "", *_table(header, rows), f"Naming: {note}", ""]


def _trio(d: dict[str, Any] | None, qs: Sequence[str] = QS) -> str:
    return " / ".join(_ms((d or {}).get(q)) for q in qs)


def _stages(stages: Sequence[dict[str, Any]]) -> list[str]:
    header: tuple[str, ...] = ("stage", "label", "offered (req/s)", "sent (req/s)")
    header += ("completed/s", "goodput/s", "E2E p50/p95/p99 (ms)", "TTFT p50/p95/p99 (ms)")
    header += ("error rate", "safe?")
    rows = []
    for st in stages:
        s = st.get("summary") or {}
        safe = "yes" if st.get("safe") else f"no ({st.get('reason') or 'unsafe'})"
        rate, good = _num(s.get("request_throughput")), _num(s.get("goodput"))
        e2e, ttft = _trio(s.get("e2e_s")), _trio(s.get("ttft_s"))
        offered, errors = _num(st.get("offered_rps")), _pct(s.get("error_rate"))
        sent = _num((st.get("schedule") or {}).get("achieved_rps"))
        rows.append(
            (st.get("stage"), st.get("label"), offered, sent, rate, good, e2e, ttft, errors, safe)
        )
    return ["## Stages", "", *_table(header, rows)]


def _by_kind(by_kind: dict[str, dict[str, Any]]) -> list[str]:
    header: tuple[str, ...] = (
        "kind",
        "requests",
        "completed",
        "error rate",
        "req/s",
        "output tok/s",
    )
    header += ("TTFT p50/p99 (ms)", "TPOT p50/p99 (ms)", "E2E p50/p99 (ms)")
    rows = []
    for k, s in by_kind.items():
        lat = (_trio(s.get(m), ("p50", "p99")) for m in ("ttft_s", "tpot_s", "e2e_s"))
        rate, tok = _num(s.get("request_throughput")), _num(s.get("output_throughput"), ".1f")
        rows.append(
            (k, s.get("requests"), s.get("completed"), _pct(s.get("error_rate")), rate, tok, *lat)
        )
    return ["## By workload kind", "", *_table(header, rows)] if rows else []


def _per_dollar(pd: dict[str, Any] | None) -> list[str]:
    if not pd:
        return []
    header = ("group", "cost ($)", "goodput / $", "completed / $", "output tokens / $")
    rows = []
    for label, groups in (("", {"run": pd["run"]}), ("kind ", pd["by_kind"]),
                          ("tenant ", pd["by_tenant"])):  # fmt: skip
        for name, f in groups.items():
            rows.append(
                (
                    f"{label}{name}",
                    _num(f["cost_usd"], ".6f"),
                    _num(f["goodput_per_usd"], ".1f"),
                    _num(f["completed_per_usd"], ".1f"),
                    _num(f["output_tokens_per_usd"], ".0f"),
                )
            )
    note = (
        f"The served hardware at ${pd['hourly_usd']:g}/hour over the measured window, split "
        f"over the groups by their tokens (a prompt token weighs {pd['input_weight']:g} of an "
        "output token); the server's own per-tenant cost is the ledger's GPU-time cost "
        "(`switchyard usage`)."
    )
    return ["## Per dollar", "", note, "", *_table(header, rows)]


def _sessions(sess: dict[str, Any] | None) -> list[str]:
    if not sess:
        return []
    e2e, calls = sess.get("session_e2e_s") or {}, sess.get("calls_per_session") or {}
    share = float(sess.get("tail_quantile", 95.0)) / 100.0
    per_session = f"{_num(calls.get('mean'))} / {_num(calls.get('max'), 'g')}"
    rows = [
        ("sessions", sess.get("sessions")),
        ("completed (every call succeeded)", sess.get("completed")),
        ("calls per session (mean / max)", per_session),
        ("session E2E p50 / p95 / p99 (ms)", _trio(e2e)),
        (
            f"observed share with ≥ 1 call beyond its step's p{share * 100:g}",
            _pct(sess.get("observed_tail_fraction")),
        ),
        (f"predicted mean of 1 − {share:g}^N", _pct(sess.get("predicted_tail_fraction"))),
    ]
    return ["## Sessions", "", *_table(("metric", "value"), rows)]


def _connections(conn: dict[str, Any] | None, summary: dict[str, Any]) -> list[str]:
    if not conn:
        return []
    rows = [
        (k, conn.get(k))
        for k in ("opened", "completed", "failed", "never_opened", "max_concurrent_streams")
    ]
    errors = sorted((conn.get("errors") or {}).items())
    note = (
        f"{conn.get('opened')} connections opened, {summary.get('completed')} of "
        f"{summary.get('requests')} measured requests succeeded: an opened connection is "
        "not a successful request."
    )
    lines = ["## Connections", "", note, "", *_table(("connections", "count"), rows)]
    if errors:
        lines += _table(("error kind", "count"), errors)
    return lines


def _self_check(check: dict[str, Any] | None) -> list[str]:
    if not check:
        return ["## Generator self-check", "", "Not recorded.", ""]
    rows = [
        (
            "schedule lag p50 / p99 / max (ms)",
            _trio(check, ("lag_p50_s", "lag_p99_s", "lag_max_s")),
        ),
        ("schedule lag p99 limit (ms)", _ms(check.get("max_lag_p99_s"))),
        ("CPU, generator process (%)", _num(check.get("cpu_process_pct"), ".1f")),
        ("CPU, whole system (%)", _num(check.get("cpu_system_pct"), ".1f")),
        ("max requests in flight", check.get("max_in_flight")),
        ("valid", check.get("valid")),
        ("reason", check.get("reason")),
    ]
    return ["## Generator self-check", "", *_table(("check", "value"), rows)]


def _ramp(ramp: dict[str, Any] | None, stages: Sequence[dict[str, Any]]) -> list[str]:
    if not ramp:
        return []
    labels = {st.get("stage"): st.get("label") for st in stages}

    def name(i: Any) -> str:
        return "none" if i is None else f"{i} ({labels.get(i, '?')})"

    outcome = "stopped early" if ramp.get("stopped") else "ran every stage"
    rows = [
        ("outcome", outcome),
        ("last safe stage", name(ramp.get("last_safe_stage"))),
        ("stopped at stage", name(ramp.get("stop_stage"))),
        ("why", ramp.get("reason")),
    ]
    return ["## Ramp outcome", "", *_table(("ramp", "value"), rows)]


def _server(stages: Sequence[dict[str, Any]]) -> list[str]:
    """Server-side figures scraped from ``/metrics`` around each stage, when exported."""
    rows = []
    for st in stages:
        for key, figures in sorted((st.get("server") or {}).items()):
            if key == "prefix_cache":
                rate = figures.get("hit_rate")
                value = "–" if rate is None else f"hit rate {rate:.1%}"
            else:
                value = f"n={figures.get('count')}, mean {_ms(figures.get('mean'))} ms, "
                value += "p50/p95/p99 " + _trio(figures, ("p50", "p95", "p99")) + " ms"
            rows.append((st.get("label"), key, value))
    head = ["## Server-side (scraped from /metrics)", ""]
    if not rows:
        return [*head, "Queue time and engine timings: not reported by the server.", ""]
    return [*head, *_table(("stage", "figure", "value"), rows)]


def render_markdown(result: dict[str, Any], plot_files: dict[str, str] | None = None) -> str:
    """The Markdown report; ``plot_files`` maps plot names to paths relative to it."""
    config, summary = result.get("config") or {}, result.get("summary") or {}
    stages = result.get("stages") or []
    title = f"# Load test: {config.get('model', '?')} at {config.get('base_url', '?')}"
    lines = [title, "", f"**Verdict: {verdict(result)}**", ""]
    lines += _metadata(result.get("metadata") or {})
    lines += _config(config, result.get("workload"))
    lines += _headline(summary, config.get("slo"))
    lines += _latency(summary)
    lines += _stages(stages)
    lines += _server(stages)
    lines += _by_kind(result.get("by_kind") or {})
    lines += _per_dollar(result.get("per_dollar"))
    lines += _sessions(result.get("sessions"))
    lines += _connections(result.get("connections"), summary)
    lines += _self_check(result.get("self_check"))
    lines += _ramp(result.get("ramp"), stages)
    if plot_files:
        lines += ["## Plots", ""]
        lines += [f"![{key}]({path})\n" for key, path in plot_files.items()]
    return "\n".join(lines).rstrip() + "\n"
