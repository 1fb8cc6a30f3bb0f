"""app.bench.report and app.bench.plots: the files a run writes, from a synthetic result
built with ``metrics.summarize`` over made-up records (no runner, no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from app.bench import plots
from app.bench.metadata import REQUIRED_FIELDS
from app.bench.metrics import SLO, by_kind, sessions, summarize
from app.bench.per_dollar import per_dollar
from app.bench.records import RequestRecord
from app.bench.report import SCHEMA, ReportFiles, render_markdown, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SLO_ = SLO(ttft_s=0.5, tpot_s=0.05, e2e_s=2.0, max_error_rate=0.05)


def make_record(
    index: int,
    intended: float,
    *,
    stage: int = 0,
    ttft: float = 0.1,
    gap: float = 0.02,
    tokens: int = 16,
    kind: str = "short",
    error: str | None = None,
    warmup: bool = False,
    session: int | None = None,
    step: int | None = None,
) -> RequestRecord:
    """A streamed chat request: ``tokens`` chunks ``gap`` apart after ``ttft``, or a
    failure of kind ``error`` (429 or 503)."""
    rec = RequestRecord(
        index=index,
        kind=kind,
        endpoint="chat",
        intended=intended,
        sent=intended + 0.0004,
        stage=stage,
        warmup=warmup,
        session=session,
        step=step,
        input_tokens=128,
        max_tokens=tokens,
    )
    if error is not None:
        rec.error_kind = error  # type: ignore[assignment]
        rec.status = 429 if error == "http_429" else 503
        rec.error = f"HTTP {rec.status}"
        rec.end = 0.01
        return rec
    rec.chunks = [ttft + i * gap for i in range(tokens)]
    rec.end = rec.chunks[-1] + 0.001
    rec.status, rec.prompt_tokens, rec.output_tokens, rec.cached_tokens = 200, 130, tokens, 64
    return rec


def make_result(
    *,
    rates: tuple[float, ...] = (2.0, 4.0, 8.0),
    valid: bool = True,
    with_errors: bool = True,
    with_sessions: bool = True,
    stall: bool = True,
) -> dict[str, Any]:
    """A ramp (or, with one rate, an open-loop run) result in the runner's schema.

    Each stage: 1 s of warm-up then 4 s measured at its rate. Latency grows with load;
    the last stage has 429/503 errors (unsafe) and, with ``stall``, a 3 s stall in
    which nothing completes (its requests finish 3 s late)."""
    records: list[RequestRecord] = []
    stage_rows: list[dict[str, Any]] = []
    t = 0.0
    last = len(rates) - 1
    for stage, rate in enumerate(rates):
        start, n_warm, n = t, int(rate), int(rate * 4)
        first = len(records)
        for i in range(n_warm + n):
            at = start + i / rate
            warm = i < n_warm
            j = i - n_warm
            error = None
            if with_errors and stage == last and not warm and j % 8 == 3:
                error = "http_429" if j % 16 == 3 else "http_5xx"
            ttft = 0.05 * (stage + 1) + 0.01 * (j % 5)
            if stall and stage == last and not warm and 4 <= j < 10:
                ttft += 3.0 - (j - 4) / rate
            kind = ("short", "chat", "long_doc")[i % 3]
            sess = step = None
            if with_sessions and not warm and kind == "chat":
                sess, step = len(records) // 6, (j // 3) % 2
            records.append(
                make_record(
                    len(records),
                    at,
                    stage=stage,
                    ttft=ttft,
                    gap=0.01 + 0.005 * stage,
                    tokens=8 + 4 * (i % 4),
                    kind=kind,
                    error=error,
                    warmup=warm,
                    session=sess,
                    step=step,
                )
            )
        t = start + (n_warm + n) / rate + 0.5
        measured = [r for r in records[first:] if not r.warmup]
        summary = summarize(measured, SLO_)
        safe = summary["error_rate"] <= SLO_.max_error_rate
        stage_rows.append(
            {
                "stage": stage,
                "label": f"rate={rate:g}/s",
                "rate": rate,
                "concurrency": None,
                "offered_rps": rate,
                "summary": summary,
                "safe": safe,
                "reason": None if safe else f"error rate {summary['error_rate']:.1%} > 5.0%",
            }
        )
    measured = [r for r in records if not r.warmup]
    summary = summarize(measured, SLO_)
    failed = [r for r in measured if not r.ok]
    ramp = len(rates) > 1
    stop = next((s["stage"] for s in stage_rows if not s["safe"]), None)
    ramp_outcome = None
    if ramp:
        ramp_outcome = {
            "stopped": stop is not None,
            "stop_stage": stop,
            "reason": None if stop is None else stage_rows[stop]["reason"],
            "last_safe_stage": last if stop is None else (stop - 1 if stop > 0 else None),
        }
    result = {
        "schema": SCHEMA,
        "metadata": {f: f"value-of-{f}" for f in REQUIRED_FIELDS}
        | {
            "sampling_parameters": {"temperature": 0.0, "ignore_eos": True},
            "generator": {"tool": "switchyard bench", "version": "0.1.0"},
        },
        "config": {
            "mode": "ramp" if ramp else "open",
            "base_url": "http://127.0.0.1:8000",
            "model": "smollm2",
            "endpoint": "chat",
            "workload": {"kind": "mix", "mix": {"short": 0.5, "chat": 0.3, "long_doc": 0.2}},
            "arrival": "poisson",
            "burstiness": None,
            "seed": 7,
            "warmup_s": 1.0,
            "duration_s": 4.0,
            "slo": SLO_.model_dump(),
            "sampling": {"temperature": 0.0, "ignore_eos": True},
        },
        "stages": stage_rows,
        "summary": summary,
        "by_kind": by_kind(measured, SLO_, summary["duration_s"]),
        "sessions": sessions(measured) if with_sessions else None,
        "self_check": {
            "lag_p50_s": 0.0004,
            "lag_p99_s": 0.0009 if valid else 0.25,
            "lag_max_s": 0.3,
            "cpu_process_pct": 12.5,
            "cpu_system_pct": 30.0,
            "max_in_flight": 9,
            "valid": valid,
            "reason": None if valid else "schedule lag p99 250.0 ms > 20 ms: generator overloaded",
        },
        "connections": {
            "opened": len(measured),
            "completed": len(measured) - len(failed),
            "failed": len(failed),
            "never_opened": 0,
            "errors": {
                k: sum(r.error_kind == k for r in failed) for k in {r.error_kind for r in failed}
            },
            "max_concurrent_streams": 9,
        },
        "ramp": ramp_outcome,
        "records": [r.to_json() for r in records],
    }
    return json.loads(json.dumps(result))  # as read back from the JSON file


@pytest.fixture(scope="module")
def ramp_result() -> dict[str, Any]:
    return make_result()


@pytest.fixture(scope="module")
def written(ramp_result: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> ReportFiles:
    return write_report(ramp_result, tmp_path_factory.mktemp("report"), "ramp")


# ---- files --------------------------------------------------------------------------


def test_writes_json_markdown_and_five_valid_pngs(written: ReportFiles) -> None:
    assert set(written.plots) == {"latency", "throughput", "distributions", "errors", "timeline"}
    assert written.json.name == "ramp.json" and written.markdown.name == "ramp.md"
    assert len(written.paths) == 7
    for key, path in written.plots.items():
        assert path.name == f"ramp-{key}.png"
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE
        assert len(data) > 10_000, key
        image = mpimg.imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
        assert image.std() > 0.01  # not a blank canvas


def test_json_is_the_whole_result_records_included(
    written: ReportFiles, ramp_result: dict[str, Any]
) -> None:
    stored = json.loads(written.json.read_text())
    assert stored == ramp_result
    assert len(stored["records"]) == len(ramp_result["records"]) > 50
    assert RequestRecord.from_json(stored["records"][0]).ok


def test_markdown_embeds_every_plot_with_a_relative_link(written: ReportFiles) -> None:
    md = written.markdown.read_text()
    for key, path in written.plots.items():
        assert f"![{key}]({path.name})" in md
        assert (written.markdown.parent / path.name).is_file()


def test_report_is_deterministic(ramp_result: dict[str, Any], tmp_path: Path) -> None:
    a = write_report(ramp_result, tmp_path / "a", "run")
    b = write_report(ramp_result, tmp_path / "b", "run")
    assert a.markdown.read_text() == b.markdown.read_text()
    assert a.json.read_bytes() == b.json.read_bytes()


# ---- Markdown content ---------------------------------------------------------------


def test_markdown_lists_every_seed_metadata_field(written: ReportFiles) -> None:
    md = written.markdown.read_text()
    for field in REQUIRED_FIELDS:
        assert f"| {field} |" in md, field
    assert "| git_commit | value-of-git_commit |" in md
    assert '| sampling_parameters | {"ignore_eos": true, "temperature": 0.0} |' in md


def test_markdown_names_latencies_in_both_conventions(
    written: ReportFiles, ramp_result: dict[str, Any]
) -> None:
    md = written.markdown.read_text()
    lines = md.splitlines()
    tpot = next(line for line in lines if line.startswith("| TPOT (vLLM) = ITL (guidellm/AIPerf)"))
    itl = next(line for line in lines if line.startswith("| ITL (vLLM: gap between chunks)"))
    summary = ramp_result["summary"]
    assert f"| {summary['tpot_s']['p99'] * 1000:.1f} |" in tpot
    assert f"| {summary['itl_s']['p50'] * 1000:.1f} |" in itl
    assert "| p99.9 |" in md and "| mean |" in md
    assert "guidellm and AIPerf report that per-token mean as ITL" in md


def test_markdown_verdict_valid_and_invalid(tmp_path: Path) -> None:
    good = render_markdown(make_result(rates=(4.0,), with_errors=False, stall=False))
    assert "**Verdict: valid" in good.splitlines()[2]
    bad = render_markdown(make_result(rates=(4.0,), valid=False))
    verdict = bad.splitlines()[2]
    assert verdict.startswith("**Verdict: INVALID")
    assert "schedule lag p99 250.0 ms > 20 ms" in verdict
    assert "| valid | no |" in bad


def test_markdown_headline_stages_and_ramp(
    written: ReportFiles, ramp_result: dict[str, Any]
) -> None:
    md = written.markdown.read_text()
    s = ramp_result["summary"]
    assert f"| completed | {s['completed']} |" in md
    assert f"| error rate | {s['error_rate']:.2%} |" in md
    assert f"| goodput (req/s meeting every SLO) | {s['goodput']:.2f} |" in md
    assert "TTFT ≤ 500.0 ms, TPOT ≤ 50.0 ms, E2E ≤ 2000.0 ms, error rate ≤ 5.00%" in md
    for st in ramp_result["stages"]:
        row = next(line for line in md.splitlines() if f"| {st['label']} |" in line)
        e2e = st["summary"]["e2e_s"]
        assert f"{e2e['p50'] * 1000:.1f} / {e2e['p95'] * 1000:.1f} / {e2e['p99'] * 1000:.1f}" in row
        assert row.rstrip().endswith("| yes |") == st["safe"]
    assert "| no (error rate" in md
    assert "## Ramp outcome" in md
    assert "| last safe stage | 1 (rate=4/s) |" in md
    assert "| stopped at stage | 2 (rate=8/s) |" in md


def test_markdown_connections_sessions_kinds_and_self_check(
    written: ReportFiles, ramp_result: dict[str, Any]
) -> None:
    md = written.markdown.read_text()
    conn, s = ramp_result["connections"], ramp_result["summary"]
    assert conn["failed"] > 0
    assert (
        f"{conn['opened']} connections opened, {s['completed']} of {s['requests']} measured "
        "requests succeeded: an opened connection is not a successful request." in md
    )
    assert f"| failed | {conn['failed']} |" in md
    assert f"| http_429 | {conn['errors']['http_429']} |" in md
    sess = ramp_result["sessions"]
    assert "## Sessions" in md and f"| sessions | {sess['sessions']} |" in md
    assert f"{sess['predicted_tail_fraction']:.2%}" in md and "1 − 0.95^N" in md
    for kind in ("short", "chat", "long_doc"):
        assert f"| {kind} | {ramp_result['by_kind'][kind]['requests']} |" in md
    assert "| schedule lag p50 / p99 / max (ms) | 0.4 / 0.9 / 300.0 |" in md
    assert "| CPU, generator process (%) | 12.5 |" in md


def test_single_stage_run_without_errors_sessions_or_ramp(tmp_path: Path) -> None:
    result = make_result(rates=(5.0,), with_errors=False, with_sessions=False, stall=False)
    files = write_report(result, tmp_path, "open")
    md = files.markdown.read_text()
    assert "## Sessions" not in md and "## Ramp outcome" not in md
    assert "| failed | 0 |" in md
    for path in files.plots.values():
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_per_dollar_section_lists_the_run_each_kind_and_each_tenant(tmp_path: Path) -> None:
    result = make_result(rates=(5.0,), with_errors=False, with_sessions=False, stall=False)
    measured = [RequestRecord.from_json(r) for r in result["records"]]
    measured = [r for r in measured if not r.warmup]
    for i, r in enumerate(measured):
        r.tenant = ("acme", "beta")[i % 2]
    got = per_dollar(measured, SLO(e2e_s=1.0), hourly_usd=2.0, duration_s=4.0)
    md = render_markdown(result | {"per_dollar": got})
    section = md.split("## Per dollar", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[0].lstrip("| ") for line in section.splitlines() if "| " in line]
    assert rows[1:] == ["run", "kind chat", "kind long_doc", "kind short", "tenant acme",
                        "tenant beta"]  # fmt: skip
    assert "$2/hour" in section
    assert "## Per dollar" not in render_markdown(result)  # no price given: no section


def test_empty_result_still_renders(tmp_path: Path) -> None:
    result = {
        "schema": SCHEMA,
        "metadata": {},
        "config": {},
        "stages": [],
        "summary": summarize([]),
        "records": [],
    }
    files = write_report(result, tmp_path, "empty")
    md = files.markdown.read_text()
    assert "| model_id | (missing) |" in md
    assert "UNCHECKED" in md
    assert all(p.stat().st_size > 1000 for p in files.plots.values())


# ---- plots --------------------------------------------------------------------------


def _heights(ax: Any) -> list[float]:
    return [p.get_height() for p in ax.patches if isinstance(p, Rectangle)]


def _texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_errors_plot_stacks_kinds_and_notes_no_errors(ramp_result: dict[str, Any]) -> None:
    fig = plots.plot_errors(ramp_result["stages"])
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["http_429", "http_5xx"]
    heights = _heights(ax)
    total = sum(s["summary"]["failed"] for s in ramp_result["stages"])
    assert sum(heights) == total > 0
    plt.close(fig)
    clean = make_result(rates=(2.0, 4.0), with_errors=False, stall=False)
    fig = plots.plot_errors(clean["stages"])
    assert "no errors" in _texts(fig)
    plt.close(fig)


@pytest.mark.parametrize("clock_zero", [0.0, 17_600.0])  # run-relative or raw monotonic
def test_timeline_shows_a_stall_as_seconds_without_completions(clock_zero: float) -> None:
    records = [make_record(i, clock_zero + i * 0.25, ttft=0.05, tokens=4) for i in range(40)]
    for r in records[12:24]:  # sent during 3..6 s, all complete at 6.5 s
        r.chunks = [clock_zero + 6.4 - r.intended + k * 0.01 for k in range(4)]
        r.end = r.chunks[-1] + 0.001
    fig = plots.plot_timeline(records)
    ax, ax_lat = fig.axes
    done = _heights(ax)[: len(ax.patches) // 2]
    assert done[3] == done[4] == done[5] == 0
    assert done[6] == 12 + 4  # the held-back ones and the four sent in that second
    p99 = np.asarray(ax_lat.lines[0].get_ydata(), dtype=float)
    assert p99[3] > 2500 and p99[1] < 200
    plt.close(fig)


def test_load_axis_rate_vs_concurrency() -> None:
    stages = [{"rate": None, "concurrency": c, "offered_rps": c * 1.5} for c in (1, 8, 32)]
    assert plots.load_axis(stages) == ([1.0, 8.0, 32.0], "concurrency (users)", False)
    rates = [{"rate": r, "concurrency": None, "offered_rps": r} for r in (2.0, 4.0)]
    assert plots.load_axis(rates) == ([2.0, 4.0], "offered load (req/s)", True)


def test_throughput_plot_draws_y_equals_x_only_for_rates(ramp_result: dict[str, Any]) -> None:
    fig = plots.plot_throughput(ramp_result["stages"])
    assert "y = x (kept up)" in fig.axes[0].get_legend_handles_labels()[1]
    plt.close(fig)
    closed = [dict(s, rate=None, concurrency=2**i) for i, s in enumerate(ramp_result["stages"])]
    fig = plots.plot_throughput(closed)
    assert "y = x (kept up)" not in fig.axes[0].get_legend_handles_labels()[1]
    plt.close(fig)


def test_latency_plot_uses_milliseconds_per_stage(ramp_result: dict[str, Any]) -> None:
    fig = plots.plot_latency(ramp_result["stages"])
    e2e_ax = fig.axes[3]
    line = dict(zip(["p50", "p95", "p99"], e2e_ax.lines, strict=True))["p99"]
    p99 = np.asarray(line.get_ydata(), dtype=float)
    expected = [s["summary"]["e2e_s"]["p99"] * 1000 for s in ramp_result["stages"]]
    assert list(p99) == pytest.approx(expected)
    assert not any(math.isnan(v) for v in p99)
    plt.close(fig)


def test_server_side_figures_are_reported_per_stage_or_said_missing() -> None:
    from app.bench.report import render_markdown

    result = make_result(rates=(2.0,), with_errors=False, with_sessions=False)
    assert "not reported by the server" in render_markdown(result)
    result["stages"][0]["server"] = {
        "queue_time": {"count": 8, "mean": 0.5375, "p50": 0.5, "p95": 0.95, "p99": 0.99},
        "prefix_cache": {"queries": 200.0, "hits": 50.0, "hit_rate": 0.25},
    }
    text = render_markdown(result)
    assert "| queue_time | n=8, mean 537.5 ms, p50/p95/p99 500.0 / 950.0 / 990.0 ms |" in text
    assert "hit rate 25.0%" in text and "not reported" not in text
