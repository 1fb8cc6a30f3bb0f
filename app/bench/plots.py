"""PNG plots of a load-generator run result (see ``report`` for the result's schema).

Five figures, all from the result dict alone: latency percentiles against offered load
per stage, throughput and goodput against offered load, latency CDFs from the records,
errors by kind per stage, and a per-second timeline in which a stall shows as a gap in
completions and a jump of p99 E2E. Latencies are drawn in milliseconds. Uses
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from app.bench.records import ERROR_KINDS, RequestRecord
from app.stats import percentile

PLOTS: tuple[str, ...] = ("latency", "throughput", "distributions", "errors", "timeline")
LATENCIES: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT (vLLM) = ITL (guidellm/AIPerf)"),
    ("itl_s", "ITL (vLLM: gap between chunks)"),
    ("e2e_s", "E2E"),
)
QS: tuple[str, ...] = ("p50", "p95", "p99")
_CDF_POINTS = 2000


def render_all(result: dict[str, Any], out_dir: Path, name: str) -> dict[str, Path]:
    """Write ``<name>-<plot>.png`` for every plot of ``PLOTS``; returns plot -> path."""
    records = [RequestRecord.from_json(r) for r in result.get("records") or []]
    stages = list(result.get("stages") or [])
    drawers = {
        "latency": lambda: plot_latency(stages),
        "throughput": lambda: plot_throughput(stages),
        "distributions": lambda: plot_distributions(records),
        "errors": lambda: plot_errors(stages),
        "timeline": lambda: plot_timeline(records),
    }
    paths: dict[str, Path] = {}
    for key in PLOTS:
        fig = drawers[key]()
        paths[key] = out_dir / f"{name}-{key}.png"
        fig.savefig(paths[key], dpi=100)
        plt.close(fig)
    return paths


def load_axis(stages: Sequence[dict[str, Any]]) -> tuple[list[float], str, bool]:
    """x of every stage: concurrency for closed-loop stages, else offered req/s; the
    flag says whether x is a rate (so the y = x line means "kept up")."""
    if stages and all(s.get("concurrency") is not None and s.get("rate") is None for s in stages):
        return [float(s["concurrency"]) for s in stages], "concurrency (users)", False
    return [float(s.get("offered_rps") or 0.0) for s in stages], "offered load (req/s)", True


def _ms(summary: dict[str, Any], metric: str, q: str) -> float:
    value = (summary.get(metric) or {}).get(q)
    return math.nan if value is None else float(value) * 1000.0


def _order(stages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float], str, bool]:
    xs, label, is_rate = load_axis(stages)
    pairs = sorted(zip(xs, range(len(stages)), strict=True))
    return [stages[i] for _, i in pairs], [x for x, _ in pairs], label, is_rate


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_latency(stages: Sequence[dict[str, Any]]) -> Figure:
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ordered, xs, xlabel, _ = _order(stages)
    for ax, (metric, title) in zip(axes.flat, LATENCIES, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("ms")
        if len(ordered) == 1:
            values = [_ms(ordered[0]["summary"], metric, q) for q in QS]
            ax.bar(QS, values, color=["tab:blue", "tab:orange", "tab:red"])
            ax.set_xlabel(str(ordered[0].get("label", "stage 0")))
        else:
            for q in QS:
                ax.plot(xs, [_ms(s["summary"], metric, q) for s in ordered], marker="o", label=q)
            ax.set_xlabel(xlabel)
            ax.legend(fontsize=8)
        if not ordered:
            _note(ax, "no stages")
        ax.grid(alpha=0.3)
    fig.suptitle("Latency percentiles per stage")
    fig.tight_layout()
    return fig


def plot_throughput(stages: Sequence[dict[str, Any]]) -> Figure:
    fig, (ax, ax_tok) = plt.subplots(1, 2, figsize=(11, 4.5))
    ordered, xs, xlabel, is_rate = _order(stages)
    sums = [s["summary"] for s in ordered]
    ax.plot(xs, [s.get("request_throughput") or 0.0 for s in sums], "o-", label="completed")
    goodput = [s.get("goodput") for s in sums]
    if any(g is not None for g in goodput):
        ax.plot(xs, [math.nan if g is None else g for g in goodput], "s-", label="goodput (SLO)")
    if is_rate and xs:
        top = max(xs) or 1.0
        ax.plot([0, top], [0, top], "k--", lw=1, label="y = x (kept up)")
    ax.set(xlabel=xlabel, ylabel="requests/s", title="Completed throughput and goodput")
    ax.legend(fontsize=8)
    ax_tok.plot(xs, [s.get("output_throughput") or 0.0 for s in sums], "o-", color="tab:green")
    ax_tok.set(xlabel=xlabel, ylabel="output tokens/s", title="Output token throughput")
    for a in (ax, ax_tok):
        a.grid(alpha=0.3)
        if not ordered:
            _note(a, "no stages")
    fig.tight_layout()
    return fig


def _cdf(ax: Axes, values: Sequence[float], label: str) -> bool:
    if not values:
        return False
    data: Any = np.sort(np.asarray(values, dtype=float) * 1000.0)
    if len(data) > _CDF_POINTS:
        data = np.quantile(data, np.linspace(0.0, 1.0, _CDF_POINTS))
    ax.step(data, np.arange(1, len(data) + 1) / len(data), where="post", label=label)
    return True


def plot_distributions(records: Sequence[RequestRecord]) -> Figure:
    measured = [r for r in records if not r.warmup and r.ok]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels: list[tuple[str, list[tuple[str, list[float]]]]] = [
        ("TTFT", [("TTFT", [t for r in measured if (t := r.ttft) is not None])]),
        (
            "ITL (vLLM: chunk gaps) and TPOT (= ITL in guidellm/AIPerf)",
            [
                ("ITL (vLLM)", [g for r in measured for g in r.itls()]),
                ("TPOT (vLLM)", [t for r in measured if (t := r.tpot) is not None]),
            ],
        ),
        ("E2E", [("E2E", [e for r in measured if (e := r.e2e) is not None])]),
    ]
    for ax, (title, series) in zip(axes, panels, strict=True):
        drawn = [_cdf(ax, values, label) for label, values in series]
        ax.set(title=title, xlabel="ms", ylabel="fraction of requests ≤ x", ylim=(0, 1.02))
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        if any(drawn):
            ax.legend(fontsize=8, loc="lower right")
        else:
            _note(ax, "no data")
    fig.suptitle("Latency distributions (CDF, measured requests)")
    fig.tight_layout()
    return fig


def plot_errors(stages: Sequence[dict[str, Any]]) -> Figure:
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(stages) + 3), 4.5))
    labels = [str(s.get("label", s.get("stage", i))) for i, s in enumerate(stages)]
    counts = {
        kind: [int((s["summary"].get("errors") or {}).get(kind, 0)) for s in stages]
        for kind in (*ERROR_KINDS, "other")
    }
    counts = {k: v for k, v in counts.items() if any(v)}
    bottom = np.zeros(len(stages))
    for kind, values in counts.items():
        ax.bar(labels, values, bottom=bottom, label=kind)
        bottom += np.asarray(values, dtype=float)
    for i, s in enumerate(stages):
        rate = float(s["summary"].get("error_rate") or 0.0)
        ax.annotate(f"{rate:.1%}", (i, bottom[i]), ha="center", va="bottom", fontsize=8)
    if counts:
        ax.legend(fontsize=8)
    else:
        ax.set_xticks(range(len(labels)), labels)
        ax.set(xlim=(-0.5, max(len(labels), 1) - 0.5), ylim=(0, 1))
        _note(ax, "no errors")
    ax.set(xlabel="stage", ylabel="failed requests", title="Errors by kind per stage")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def plot_timeline(records: Sequence[RequestRecord]) -> Figure:
    fig, (ax, ax_lat) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    done: dict[int, int] = defaultdict(int)
    failed: dict[int, int] = defaultdict(int)
    e2e_by_send: dict[int, list[float]] = defaultdict(list)
    t0 = min((r.intended for r in records), default=0.0)  # the clock's zero may not be t0
    for r in records:
        sent = r.intended - t0
        if r.ok and r.end is not None:
            done[math.floor(sent + r.end)] += 1
            e2e_by_send[math.floor(sent)].append(r.end * 1000.0)
        else:
            lag = 0.0 if math.isnan(r.lag) else max(r.lag, 0.0)
            failed[math.floor(sent + (r.end if r.end is not None else lag))] += 1
    last = max([*done, *failed, *e2e_by_send, 0])
    secs = np.arange(0, last + 1)
    ok_counts = np.array([done.get(int(t), 0) for t in secs])
    ax.bar(secs, ok_counts, width=1.0, align="edge", color="tab:green", label="completed")
    ax.bar(
        secs,
        [failed.get(int(t), 0) for t in secs],
        width=1.0,
        align="edge",
        bottom=ok_counts,
        color="tab:red",
        label="failed",
    )
    ax.set(ylabel="requests / s", title="Completions per second (by completion time)")
    p99 = [percentile(e2e_by_send[int(t)], 99.0) if e2e_by_send.get(int(t)) else None for t in secs]
    ax_lat.plot(secs + 0.5, [math.nan if v is None else v for v in p99], ".-", color="tab:purple")
    ax_lat.set(
        xlabel="seconds since the first request",
        ylabel="p99 E2E (ms)",
        title="p99 E2E of the requests sent in each second",
    )
    first: dict[int, float] = {}  # per stage: first send, first measured, last warm-up send
    measured: dict[int, float] = {}
    warm_last: dict[int, float] = {}
    for r in records:
        sent = r.intended - t0
        first[r.stage] = min(first.get(r.stage, math.inf), sent)
        if r.warmup:
            warm_last[r.stage] = max(warm_last.get(r.stage, -math.inf), sent)
        else:
            measured[r.stage] = min(measured.get(r.stage, math.inf), sent)
    for a in (ax, ax_lat):
        label: str | None = "warm-up"
        for n, stage in enumerate(sorted(first)):
            if n:
                a.axvline(first[stage], color="black", ls=":", lw=1)
            if stage in warm_last:
                hi = measured.get(stage, warm_last[stage])
                a.axvspan(first[stage], hi, color="gray", alpha=0.15, label=label)
                label = None
        a.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    if not records:
        _note(ax, "no records")
    fig.tight_layout()
    return fig
