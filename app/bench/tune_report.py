"""Files of ``switchyard profile tune``: the tuned profile (YAML, a ``Bundle`` that a
model's ``profile: {name, file}`` reads) and a report of how it was chosen —
``profile-tune-<stem>.json`` (the whole ``TuneResult``), ``.md`` (the chosen values, the
rule, the curve, the metadata and how to re-run it) and ``.png`` (goodput, then TTFT and
ITL p95 — and E2E p95 where the SLO sets it — against concurrency, one line per knob
value, the SLO as a dashed line and the chosen point starred).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml
from matplotlib.figure import Figure

from app.bench.report import _metadata, _table
from app.bench.tune import MODEL_ID, TuneConfig, TuneResult
from app.config import ModelSpec
from app.profiles.tune import DEFAULT_FACTORS, Point, is_candidate, violations

RULE = (
    "1. A point meets the SLO when every p95 the SLO sets (TTFT, ITL, E2E) is within it "
    "and its error rate is at most the error budget.",
    "2. A point is a candidate when the profile's checks accept its concurrency as "
    "`max_ongoing_requests` (interactive: at most `max_num_seqs`; throughput: at least "
    "`max_num_seqs`; long_context: any).",
    "3. A setting's best point is its candidate meeting the SLO with the highest goodput "
    "(requests/s meeting the SLO); a setting breaking the SLO at every point is never chosen.",
    "4. The chosen setting is the one whose best point has the highest goodput; goodputs "
    "within the tie tolerance count as ties, and a tie goes to the smaller value (less "
    "memory): the last good setting is kept.",
    "5. `max_ongoing_requests` is the best point's concurrency; the autoscaling target "
    "keeps the catalogue's ratio to it; `measured` gets the chosen setting's prefill rate "
    "at concurrency 1 (prompt tokens / TTFT) and the hardware.",
)
_PANELS: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))


@dataclass(frozen=True)
class TuneFiles:
    """Paths written by ``write_tune``."""

    profile: Path
    json: Path
    markdown: Path
    plot: Path

    @property
    def paths(self) -> list[Path]:
        return [self.profile, self.json, self.markdown, self.plot]


def rerun_command(config: TuneConfig, target: dict[str, str], out: Path, report_dir: Path) -> str:
    """The ``switchyard profile tune`` command line that repeats this tune."""
    args = ["switchyard", "profile", "tune", "--profile", config.profile]
    args += ["--slo", config.slo.header()]
    for name, value in target.items():
        args += [f"--{name}", value]
    args += ["--knob", f"{config.knob}=" + ",".join(str(v) for v in config.sweep())]
    if config.factors != DEFAULT_FACTORS:
        args += ["--concurrency", ",".join(f"{f:g}" for f in config.factors)]
    args += ["--duration-s", f"{config.duration_s:g}", "--warmup-s", f"{config.warmup_s:g}"]
    args += ["--input-tokens", str(config.input_tokens)]
    args += ["--output-tokens", str(config.output_tokens)]
    for key, value in config.fields.items():
        args += ["--set", f"{key}={value}"]
    args += ["--out", str(out), "--report-dir", str(report_dir)]
    return shlex.join(args)


def profile_yaml(result: TuneResult, report: Path) -> str:
    """The tuned profile file: a commented header, then the bundle."""
    meta = result.metadata
    head = [
        f"# The {result.config.profile} profile tuned by `switchyard profile tune`, "
        f"{result.engine} engine, {result.hardware};",
        f"# {meta.get('date', 'unknown date')}, commit {meta.get('git_commit', 'unknown')}; "
        f"how it was chosen: {report}",
        f"# Use: profile: {{name: {result.config.profile}, file: <this file>}}",
    ]
    body: str = yaml.safe_dump(
        result.bundle.model_dump(mode="json", exclude_none=True), sort_keys=False
    )
    return "\n".join(head) + "\n" + body


def write_tune(result: TuneResult, out: Path, report_dir: Path, command: str) -> TuneFiles:
    """Write the profile to ``out`` (once the loader and the profile's checks take it:
    ``ValueError`` otherwise) and the report into ``report_dir``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report_dir.mkdir(parents=True, exist_ok=True)
    stem = f"profile-tune-{out.stem}"
    files = TuneFiles(
        profile=out,
        json=report_dir / f"{stem}.json",
        markdown=report_dir / f"{stem}.md",
        plot=report_dir / f"{stem}.png",
    )
    out.write_text(profile_yaml(result, files.markdown))
    try:  # the loader and the profile's checks must take the file as a model would
        ModelSpec.model_validate(
            {
                "id": MODEL_ID,
                "engine": "simulated",
                "profile": {"name": result.config.profile, "file": str(out)},
            }
        )
    except ValueError as exc:
        out.unlink()
        raise ValueError(f"the tuned profile is refused, not written: {exc}") from None
    files.json.write_text(result.model_dump_json(indent=1) + "\n")
    fig = plot_curve(result)
    fig.savefig(files.plot, dpi=100)
    plt.close(fig)
    files.markdown.write_text(render_markdown(result, files, command))
    return files


def plot_curve(result: TuneResult) -> Figure:
    """Goodput and the SLO's p95s against concurrency, a line per knob value."""
    slo, knob = result.config.slo, result.config.knob
    panels = [(m, t) for m, t in _PANELS if m != "e2e" or slo.e2e_p95_ms is not None]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(5 * (1 + len(panels)), 4.5))
    values = sorted({p.value for p in result.curve})
    for value in values:
        points = sorted((p for p in result.curve if p.value == value), key=lambda p: p.concurrency)
        xs = [p.concurrency for p in points]
        axes[0].plot(xs, [p.goodput for p in points], "o-", label=f"{knob}={value}")
        for ax, (metric, _) in zip(axes[1:], panels, strict=True):
            ys = [float("nan") if p.p95(metric) is None else p.p95(metric) for p in points]
            ax.plot(xs, ys, "o-", label=f"{knob}={value}")
    chosen = result.chosen
    axes[0].plot([chosen.concurrency], [chosen.goodput], "k*", ms=14, label="chosen")
    axes[0].set(title="Goodput (requests/s meeting the SLO)", ylabel="requests/s")
    for ax, (metric, title) in zip(axes[1:], panels, strict=True):
        limit = getattr(slo, f"{metric}_p95_ms")
        if limit is not None:
            ax.axhline(limit, color="red", ls="--", lw=1, label=f"SLO {limit:g} ms")
        if chosen.p95(metric) is not None:
            ax.plot([chosen.concurrency], [chosen.p95(metric)], "k*", ms=14, label="chosen")
        ax.set(title=f"{title} p95", ylabel="ms")
    for ax in axes:
        ax.set_xlabel("concurrency (closed loop)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"profile tune: {result.config.profile}, {result.engine} engine, {result.hardware}"
    )
    fig.tight_layout()
    return fig


def _q(point: Point, metric: str) -> str:
    q = getattr(point, f"{metric}_ms")
    return " / ".join("–" if v is None else f"{v:.0f}" for v in (q.p50, q.p95, q.p99))


def _curve(result: TuneResult) -> list[str]:
    c = result.config
    header = (
        "value",
        "concurrency",
        "candidate",
        "goodput req/s",
        "output tok/s",
        "TTFT p50/p95/p99 ms",
        "ITL p50/p95/p99 ms",
        "E2E p95 ms",
        "errors",
        "verdict",
    )
    rows: list[Sequence[Any]] = []
    for p in sorted(result.curve, key=lambda p: (p.value, p.concurrency)):
        problems = violations(p, c.slo, c.max_error_rate)
        best = result.best.get(p.value)
        mark = " (chosen)" if p == result.chosen else " (best)" if p == best else ""
        e2e = "–" if p.e2e_ms.p95 is None else f"{p.e2e_ms.p95:.0f}"
        rows.append(
            (
                p.value,
                p.concurrency,
                is_candidate(c.profile, p),
                p.goodput,
                p.output_tokens_per_s,
                _q(p, "ttft"),
                _q(p, "itl"),
                e2e,
                f"{p.error_rate:.1%}",
                ("; ".join(problems) or "meets the SLO") + mark,
            )
        )
    return _table(header, rows)


def render_markdown(result: TuneResult, files: TuneFiles, command: str) -> str:
    c, b, chosen = result.config, result.bundle, result.chosen
    lines = [
        f"# Profile tune: {c.profile}, {result.engine} engine, {result.hardware}",
        "",
        f"Chosen: **{c.knob}={chosen.value}**, **max_ongoing_requests={b.max_ongoing_requests}**"
        f" (goodput {chosen.goodput:.2f} req/s at concurrency {chosen.concurrency}) for the "
        f"SLO `{c.slo.header()}`. Profile file: `{files.profile}`; use it with "
        f"`profile: {{name: {c.profile}, file: {files.profile}}}`.",
        "",
        *_table(
            ("knob", "value"),
            [
                (c.knob, chosen.value),
                ("max_ongoing_requests", b.max_ongoing_requests),
                ("target_ongoing_requests", b.target_ongoing_requests),
                ("measured.prefill_tokens_per_s", b.measured.prefill_tokens_per_s),
                ("measured.hardware", b.measured.hardware),
            ],
        ),
        "## Rule",
        "",
        *RULE,
        "",
        f"Parameters: knob `{c.knob}` over {', '.join(str(v) for v in c.sweep())}; "
        f"concurrency 1 and {', '.join(f'{f:g}' for f in c.factors)} × each setting's "
        f"max_num_seqs (closed loop); {c.warmup_s:g} s warm-up and {c.duration_s:g} s steady "
        f"state per point; fixed workload of {c.input_tokens} prompt and {c.output_tokens} "
        f"output tokens; error budget {c.max_error_rate:.1%}; tie tolerance "
        f"{c.tie_tolerance:.0%}. Goodput counts a request whose TTFT, TPOT (held to the ITL "
        "limit) and E2E are within the SLO.",
        "",
        "## Curve",
        "",
        *_curve(result),
    ]
    if result.refused:
        lines += ["Settings refused (not measured):", ""]
        lines += [f"- {c.knob}={v}: {why}" for v, why in sorted(result.refused.items())]
        lines += [""]
    lines += [f"![curve]({files.plot.name})", "", "## Profile file", "", "```yaml"]
    lines += [yaml.safe_dump(b.model_dump(mode="json", exclude_none=True), sort_keys=False)]
    lines += ["```", "", *_metadata(result.metadata), "## Re-run", "", "```sh", command, "```"]
    return "\n".join(lines) + "\n"
