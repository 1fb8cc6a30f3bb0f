"""Latency under load: Switchyard against bare vLLM at Poisson loads of 50 %, 70 % and
90 % of bare vLLM's capacity, measured first in the same run.

    python -m benchmarks.latency_under_load [--rounds 2] [--prompts 48] [--fractions 0.5,0.7,0.9]

Both servers run at once, with serving_tax's engine settings (serve_configs/local.yaml's:
SmolLM2 in float32, LoRA slots, 2048-token window, 1 GiB of KV, 32 sequences): bare
vLLM as ``python -m vllm.entrypoints.openai.api_server`` and Switchyard exactly as `make
run` runs it (``switchyard serve`` on local.yaml, Ray Serve's HAProxy data plane on the
HTTP port). The client is vLLM's own benchmark client (``vllm.benchmarks.serve``):
64-token random prompts, ``--output-tokens`` (32) tokens with ``ignore_eos``.

1. Capacity: a closed loop at 32 users (the engine's ``max_num_seqs``) against bare
   vLLM; its completed requests per second are the capacity C.
2. For each fraction f and round: Poisson arrivals at f × C (``--request-rate``,
   ``--prompts`` requests) through bare vLLM and through Switchyard, in alternating
   order (a drift of this machine's speed hits both alike).

Reported per load: TTFT p50/p99, ITL p50/p99, E2E p50 of each side (the mean of the
rounds' values) and Switchyard's ratios to bare vLLM, against issue 19's targets
(TTFT p50 ≤ 1.25, ITL p50 ≤ 1.10, E2E p50 ≤ 1.15 at 50 % and 70 %). Writes
docs/benchmarks/latency-under-load-<date>.md/.json/.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import scaffold
from benchmarks.serving_lib import MAX_NUM_SEQS, environment, prepared_model_dir
from benchmarks.serving_tax import (
    PROMPT_TOKENS,
    bench,
    log,
    stop,
    switchyard_server,
    vllm_server,
)

METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms")
TARGETS = {"median_ttft_ms": 1.25, "median_itl_ms": 1.10, "median_e2el_ms": 1.15}
TARGET_FRACTIONS = (0.5, 0.7)  # the ratios hold there; at 90 % they are reported
ARMS = ("vllm", "haproxy")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir = prepared_model_dir()
    servers = {"vllm": vllm_server(model_dir, work), "haproxy": switchyard_server(work, True)}
    urls = {name: s.base_url for name, s in servers.items()}
    out: dict[str, Any] = {"loads": []}
    try:
        for server in servers.values():
            log(f"starting {server.name}")
            server.start()
            log(f"{server.name} ready in {server.wait_ready(900):.0f}s")
        for name in ARMS:  # warm both: first requests pay one-off costs
            bench(urls[name], model_dir, 8, 16, 7, work / f"warm-{name}.json",
                  output_tokens=args.output_tokens)  # fmt: skip
        cap = bench(urls["vllm"], model_dir, MAX_NUM_SEQS, args.capacity_prompts, 11,
                    work / "capacity.json", output_tokens=args.output_tokens)  # fmt: skip
        capacity = float(cap["request_throughput"])
        out["capacity"] = {
            "request_throughput": capacity, "output_throughput": cap["output_throughput"],
            "concurrency": MAX_NUM_SEQS, "prompts": args.capacity_prompts,
        }  # fmt: skip
        log(f"bare vLLM's capacity: {capacity:.2f} req/s at {MAX_NUM_SEQS} users")
        for f in args.fractions:
            rate = f * capacity
            rounds = []
            for i in range(args.rounds):
                order = ARMS if i % 2 == 0 else ARMS[::-1]
                row: dict[str, Any] = {}
                for name in order:
                    res = bench(urls[name], model_dir, 4 * MAX_NUM_SEQS, args.prompts,
                                100 + i, work / f"{name}-{f}-{i}.json",
                                output_tokens=args.output_tokens, rate=rate)  # fmt: skip
                    keep = (*METRICS, "completed", "failed", "request_throughput")
                    row[name] = {k: res.get(k) for k in keep}
                    log(f"{f:.0%} round {i + 1} {name}: " + ", ".join(
                        f"{k}={row[name][k]:.1f}" for k in METRICS))  # fmt: skip
                rounds.append(row)
            out["loads"].append({"fraction": f, "rate": rate, "rounds": rounds,
                                 "summary": summarize(rounds)})  # fmt: skip
    finally:
        for server in servers.values():
            stop(server)
    return out


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's metrics as the mean over rounds, and Switchyard's ratios to bare."""
    mean = {arm: {k: sum(r[arm][k] for r in rounds) / len(rounds) for k in METRICS} for arm in ARMS}
    return {
        **mean,
        "ratio": {k: mean["haproxy"][k] / mean["vllm"][k] for k in METRICS},
        "failed": {arm: sum(r[arm]["failed"] for r in rounds) for arm in ARMS},
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = doc["result"]["loads"]
    labels = [f"{ld['fraction']:.0%}" for ld in loads]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, (metric, limit) in zip(axes, TARGETS.items(), strict=True):
        ax.bar(labels, [ld["summary"]["ratio"][metric] for ld in loads], color="tab:blue")
        ax.axhline(limit, color="tab:red", linestyle="--", label=f"target {limit}")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_title(metric.replace("median_", "").replace("_ms", "") + " p50: Switchyard / bare")
        ax.set_xlabel("Poisson load, share of bare vLLM's capacity")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc: dict[str, Any]) -> str:
    res, cap = doc["result"], doc["result"]["capacity"]
    lines = [
        f"# Latency under load — {doc['date']}", "",
        f"`python -m benchmarks.latency_under_load {doc['argv']}`. Bare vLLM's OpenAI server "
        "and Switchyard as `make run` runs it (HAProxy in front), the same engine settings, "
        f"one run. vLLM's benchmark client: {PROMPT_TOKENS}-token random prompts, "
        f"{doc['output_tokens']}-token streams with ignore_eos, {doc['prompts']} requests "
        f"per load, {doc['rounds']} rounds in alternating order. Capacity, measured first: "
        f"bare vLLM completed **{cap['request_throughput']:.2f} req/s** "
        f"({cap['output_throughput']:.0f} output tok/s) at {cap['concurrency']} users.", "",
        f"![ratios]({doc['image']})", "",
        "| load | rate req/s | arm | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | "
        "E2E p50 ms | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for ld in res["loads"]:
        s = ld["summary"]
        for arm in ARMS:
            m = s[arm]
            lines.append(f"| {ld['fraction']:.0%} | {ld['rate']:.2f} | {arm} | " + " | ".join(
                f"{m[k]:.1f}" for k in METRICS) + f" | {s['failed'][arm]} |")  # fmt: skip
        r = s["ratio"]
        lines.append(f"| {ld['fraction']:.0%} | | **ratio** | " + " | ".join(
            f"**{r[k]:.2f}×**" for k in METRICS) + " | |")  # fmt: skip
    lines += ["", "Targets (issue 19, target 3):", "",
              "| load | metric | ratio | target | verdict |", "|---|---|---|---|---|"]  # fmt: skip
    for ld in res["loads"]:
        for metric, limit in TARGETS.items():
            ratio = ld["summary"]["ratio"][metric]
            if ld["fraction"] in TARGET_FRACTIONS:
                verdict = "met" if ratio <= limit else f"missed by {ratio / limit - 1:.0%}"
            else:
                verdict = "reported"
            lines.append(
                f"| {ld['fraction']:.0%} | {metric} | {ratio:.2f} | ≤ {limit} | {verdict} |"
            )
    lines += ["", "## Environment", "", "```json", json.dumps(doc["environment"], indent=1),
              "```", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--capacity-prompts", type=int, default=96)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.5, 0.7, 0.9])  # fmt: skip
    args = parser.parse_args()
    date = dt.date.today().isoformat()
    stem = scaffold.stem("latency-under-load", args, date)
    work = Path(tempfile.mkdtemp(prefix="latency-under-load-"))  # logs: kept on failure
    result = run(args, work)
    shutil.rmtree(work, ignore_errors=True)
    doc = {"argv": " ".join(sys.argv[1:]), "date": date, "rounds": args.rounds,
           "prompts": args.prompts, "output_tokens": args.output_tokens,
           "environment": environment(prepared_model_dir()), "result": result,
           "image": f"{stem}.png"}  # fmt: skip
    scaffold.finish(args, stem, doc, report(doc), lambda png: plot(doc, png))


if __name__ == "__main__":
    main()
