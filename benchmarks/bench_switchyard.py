"""Reports of record for ``switchyard bench`` against the Switchyard application itself:
the simulated engine (calibrated to SmolLM2-135M on vLLM CPU, 2 replicas) and a
simulated embedding model behind the full gateway (API keys per tenant, SQLite state,
ledger), on one local Ray in throughput-optimized mode.

1. ramp    — the seed 003 §8.3 request mix, closed loop 1 → 8 → 32 → 64 → 128 → 256
             users (warm-up 10 s, steady 30 s each; the seed's 5 minutes with
             ``--steady 300``), SLO TTFT ≤ 5 s at p95 and TPOT ≤ 150 ms for goodput,
             errors ≤ 1 %; stops at the first unsafe stage;
2. agentic — Knowledge-Agent sessions (planner → embedding → 2–3 chained generations),
             open loop 0.5 sessions/s: session E2E and the observed 1 − 0.95^N tail;
3. prefix  — 4 tenants (their own keys) with 512-token shared system prompts, open loop
             2 req/s, next to the same lengths without sharing (``bench compare``).

    python -m benchmarks.bench_switchyard [--only ramp,agentic,prefix] [--steady S] [--quick]

Writes docs/benchmarks/bench-switchyard-<date>/ (one ``switchyard bench`` report per
run, per-request JSON gzipped) and docs/benchmarks/bench-switchyard-<date>.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gzip
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.bench.client import raise_fd_limit
from app.bench.compare import compare, format_comparison
from app.bench.metrics import SLO
from app.bench.report import write_report
from app.bench.run import BenchConfig, execute
from benchmarks.layer1_common import BIG_LIMITS, log
from benchmarks.layer1_http import App, ray_serve

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "docs" / "benchmarks"
MODELS = [
    {"id": "simulated-llm", "engine": "simulated", "num_replicas": 2},
    {"id": "simulated-embed", "engine": "simulated", "task": "embed"},
]
TENANTS = ("tenant-1", "tenant-2", "tenant-3", "tenant-4")
ENGINE = "simulated (calibrated: SmolLM2-135M, vLLM CPU, 2 cores) behind Switchyard"


def _progress(message: str, always: bool) -> None:
    if always:
        log(message)


def _run(config: BenchConfig, runs_dir: Path, name: str) -> dict[str, Any]:
    result = asyncio.run(execute(config, _progress))
    files = write_report(result, runs_dir, name)
    files.json.with_suffix(".json.gz").write_bytes(gzip.compress(files.json.read_bytes(), mtime=0))
    files.json.unlink()
    s, check = result["summary"], result["self_check"]
    log(
        f"{name}: {s['completed']}/{s['requests']} ok, {s['request_throughput']:.2f} req/s, "
        f"lag p99 {1e3 * check['lag_p99_s']:.1f} ms, valid {check['valid']}"
    )
    result["report"] = f"{runs_dir.name}/{files.markdown.name}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="ramp,agentic,prefix")
    parser.add_argument("--steady", type=float, default=30.0, help="steady window per stage (s)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    parts = set(args.only.split(","))
    raise_fd_limit()
    date = dt.date.today().isoformat()
    stem = f"bench-switchyard-{date}"
    runs_dir = args.out / stem
    steady = 10.0 if args.quick else args.steady
    results: dict[str, dict[str, Any]] = {}
    comparison = None
    with tempfile.TemporaryDirectory() as tmp, ray_serve() as cluster:
        app: App = cluster.deploy("sy", {"models": MODELS}, f"sqlite:///{tmp}/state.db")
        keys = {t: app.new_key(t, BIG_LIMITS, BIG_LIMITS) for t in TENANTS}
        common: dict[str, Any] = {
            "base_url": app.root,
            "api_key": keys["tenant-1"],
            "engine": ENGINE,
            "seed": 7,
        }
        if "ramp" in parts:
            stages = [1, 8, 32] if args.quick else [1, 8, 32, 64, 128, 256]
            config = BenchConfig(
                **common,
                mode="ramp",
                ramp_by="concurrency",
                stages=stages,
                warmup_s=10.0,
                duration_s=steady,
                workload={"kind": "mix"},
                slo=SLO(ttft_s=5.0, tpot_s=0.150, p95_metric="ttft", max_error_rate=0.01),
            )
            results["ramp"] = _run(config, runs_dir, "ramp-mix")
        if "agentic" in parts:
            config = BenchConfig(
                **common,
                mode="open",
                rate=0.5,
                warmup_s=10.0,
                duration_s=steady * 2,
                workload={"kind": "agentic", "planner_output": 64, "step_output": 128},
                slo=SLO(e2e_s=30.0),
            )
            results["agentic"] = _run(config, runs_dir, "agentic")
        if "prefix" in parts:
            shared = {
                "kind": "shared_prefix",
                "tenants": 4,
                "prefix_tokens": 512,
                "suffix_tokens": 32,
                "output_tokens": 32,
                "tenant_keys": keys,
            }
            fixed = {"kind": "fixed", "input_tokens": 544, "output_tokens": 32}
            for label, workload in (("unshared", fixed), ("shared-prefix", shared)):
                config = BenchConfig(
                    **common,
                    mode="open",
                    rate=2.0,
                    warmup_s=10.0,
                    duration_s=steady * 2,
                    workload=workload,
                    slo=SLO(ttft_s=1.0),
                )
                results[label] = _run(config, runs_dir, f"prefix-{label}")
            comparison = format_comparison(compare(results["unshared"], results["shared-prefix"]))
            log("\n" + comparison)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(markdown(date, results, comparison))
    log(f"wrote {args.out / stem}.md")


def markdown(date: str, results: dict[str, dict[str, Any]], comparison: str | None) -> str:
    lines = [
        f"# `switchyard bench` against Switchyard — {date}",
        "",
        "The simulated engine (no weights; its timing model is calibrated to "
        "SmolLM2-135M on the vLLM CPU engine, 2 cores) behind the full Switchyard "
        "application on one local Ray: API keys per tenant, SQLite state, ledger. The "
        "load generator runs on the same 2-core box; each report carries its "
        "self-check.",
        "",
        "```",
        "python -m benchmarks.bench_switchyard " + " ".join(sys.argv[1:]),
        "```",
        "",
    ]
    for label, result in results.items():
        s, check = result["summary"], result["self_check"]
        lines += [
            f"## {label}",
            "",
            f"Full report: [{result['report']}]({result['report']})",
            "",
            f"- {s['completed']}/{s['requests']} completed, "
            f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s"
            + (f", goodput {s['goodput']:.2f} req/s" if s["goodput"] is not None else ""),
            f"- TTFT p50/p95/p99 {_ms(s['ttft_s'])}; TPOT p50/p95/p99 {_ms(s['tpot_s'])}; "
            f"E2E p50/p95/p99 {_ms(s['e2e_s'])}",
            f"- generator: lag p99 {1e3 * check['lag_p99_s']:.2f} ms, CPU "
            f"{check['cpu_process_pct']:.0f} % of a core, valid {check['valid']}",
        ]
        if s.get("cache_hit_rate") is not None:
            lines.append(f"- prefix cache hit rate {s['cache_hit_rate']:.1%}")
        if result.get("ramp"):
            ramp = result["ramp"]
            lines.append(
                f"- ramp: last safe stage {ramp['last_safe_stage']}, "
                f"stopped at {ramp['stop_stage']}: {ramp['reason']}"
            )
            if ramp["stop_stage"] is not None:
                stop = result["stages"][ramp["stop_stage"]]["summary"]["errors"]
                statuses = sorted(
                    {r["status"] for r in result["records"]
                     if r["stage"] == ramp["stop_stage"] and r["error_kind"]},
                    key=str,
                )  # fmt: skip
                kinds = {k: v for k, v in stop.items() if v}
                lines.append(f"- errors at the stop stage: {kinds}, HTTP statuses {statuses}")
            lines += [
                "",
                "| stage | users | req/s | TTFT p95 | TPOT p95 | E2E p95 | errors | safe |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for st in result["stages"]:
                x = st["summary"]
                lines.append(
                    f"| {st['stage']} | {st['concurrency']} | {x['request_throughput']:.2f} | "
                    f"{_one(x['ttft_s']['p95'])} | {_one(x['tpot_s']['p95'])} | "
                    f"{_one(x['e2e_s']['p95'])} | {x['error_rate']:.1%} | {st['safe']} |"
                )
        if result.get("sessions"):
            ss = result["sessions"]
            lines.append(
                f"- sessions: {ss['completed']}/{ss['sessions']} completed, session E2E "
                f"p50/p95/p99 {_ms(ss['session_e2e_s'])}; sessions with a call in its "
                f"step's 5 % tail: observed {ss['observed_tail_fraction']:.1%} vs "
                f"1 − 0.95^N = {ss['predicted_tail_fraction']:.1%}"
            )
        lines.append("")
    if comparison:
        lines += [
            "## Shared prefix vs unshared (`switchyard bench compare`)",
            "",
            "```",
            comparison,
            "```",
            "",
        ]
    return "\n".join(lines)


def _ms(d: dict[str, Any]) -> str:
    return " / ".join(_one(d.get(q)) for q in ("p50", "p95", "p99"))


def _one(v: float | None) -> str:
    return "–" if v is None else f"{1e3 * v:.0f} ms"


if __name__ == "__main__":
    main()
