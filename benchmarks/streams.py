"""Concurrent streams through the full path: how many open streams Switchyard holds on
this box, and tokens/s per gateway core, with 1 and 2 ingress replicas.

    python -m benchmarks.streams [--streams 1000] [--duration 60] [--step-s 1.0] [--tag NAME]

Switchyard runs as `make run` runs it (``switchyard serve``: HAProxy in front of the
ingress replicas) with one simulated model on a fast profile: the engine is not the
bottleneck (every running sequence gets a token every ``--step-s``, a batch of up to
4096). The project's load generator (``switchyard bench``, closed loop at
``--streams`` users, 64-token answers, so a stream stays open about
64 × ``--step-s`` seconds) keeps that many streams open; how many were open at once
comes from its own per-request records (first byte sent → response complete), over the
steady window. CPU seconds of the gateway's processes (ingress replicas, HAProxy, Ray's
proxy) and of the LLMServer replica come from /proc over the run. Writes
docs/benchmarks/streams-<date>.md/.json/.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from app.cli.serve import RAY_ENV
from benchmarks import scaffold
from benchmarks.serving_lib import REPO, Server, _free_port, environment
from benchmarks.serving_tax import Meter, _env, log, stop

MODEL = "streams-sim"
OUTPUT_TOKENS = 64


def config(port: int, replicas: int, step_s: float, streams: int) -> dict[str, Any]:
    cap = 4 * streams
    simulation = {"decode_base_s": step_s, "decode_s_per_seq": 0.0,
                  "prefill_s_per_token": 0.00001, "max_batch_size": 4096,
                  "max_waiting": cap, "kv_capacity_tokens": 4096 * 512}  # fmt: skip
    model = {
        "id": MODEL,
        "engine": "simulated",
        "max_ongoing_requests": cap,
        "max_queued_requests": cap,
        "simulation": simulation,
    }
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "streams", "route_prefix": "/", "import_path": "app.builders:build_app",
            "args": {"gateway": {"anonymous_tenant": "streams"}, "models": [model],
                     "ingress_replicas": replicas, "ingress_max_ongoing_requests": cap},
        }],
    }  # fmt: skip


def open_streams(result: dict[str, Any], warmup_s: float, duration_s: float) -> dict[str, float]:
    """Streams open at once over the steady window, from the generator's records: each
    is open from its send (``sent``, on the generator's clock) to its end (``end``,
    seconds after ``intended``; a stream that never ended is open to the run's end).
    Every stream counts, those begun in the warm-up too; the window starts
    ``warmup_s`` after the first send and lasts ``duration_s``."""
    spans = []
    for r in result["records"]:
        start = r["sent"] if r["sent"] == r["sent"] else r["intended"]  # NaN: never sent
        end = r["intended"] + r["end"] if r.get("end") is not None else float("inf")
        spans.append((start, end))
    if not spans:
        return {"min": 0, "median": 0, "max": 0}
    lo = min(s for s, _ in spans) + warmup_s
    samples = []
    t = lo
    while t < lo + duration_s:
        samples.append(sum(1 for s, e in spans if s <= t < e))
        t += 0.5
    samples.sort()
    return {"min": samples[0], "median": samples[len(samples) // 2], "max": samples[-1]}


def one(replicas: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = _free_port()
    path = work / f"streams-{replicas}.yaml"
    path.write_text(yaml.safe_dump(config(port, replicas, args.step_s, args.streams)))
    exe = str(Path(sys.executable).parent / "switchyard")
    server = Server(f"switchyard-{replicas}", [exe, "serve", str(path)], port, work,
                    {**_env(work), **RAY_ENV})  # fmt: skip
    server.start()
    try:
        _wait(server)
        name = f"streams-{replicas}"
        cmd = [exe, "bench", "run", "--url", server.base_url, "--model", MODEL, "--mode", "closed",
               "-c", str(args.streams), "--workload", "fixed", "--input-tokens", "32",
               "--output-tokens", str(OUTPUT_TOKENS), "--warmup", str(args.warmup),
               "--duration", str(args.duration), "--timeout", "600", "--out", str(work),
               "--name", name, "--quiet"]  # fmt: skip
        meter = Meter(server, "haproxy")
        with meter:
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  env=_env(work))  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"bench failed: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        result = json.loads((work / f"{name}.json").read_text())
    finally:
        stop(server)  # its whole session: an HAProxy left behind holds fixed ports
    summary = result["summary"]
    gateway = sum(v for k, v in meter.cpu.items()
                  if k.startswith("path/") and "llm replica" not in k)  # fmt: skip
    replica = sum(v for k, v in meter.cpu.items() if "llm replica" in k)
    seconds = meter.seconds
    # Every token the run streamed (warm-up streams too) over the metered window: the
    # same window as the CPU seconds (the generator's steady-window figure in
    # ``summary`` counts only the streams begun in that window).
    records = result["records"]
    tokens = sum(r["output_tokens"] or len(r["chunks"]) for r in records)
    tok_s = tokens / seconds
    return {
        "ingress_replicas": replicas,
        "open_streams": open_streams(result, args.warmup, args.duration),
        "summary": {k: summary.get(k) for k in sorted(summary) if not isinstance(summary[k], dict)},
        "self_check": result.get("self_check"),
        "requests": len(records),
        "failed_all": sum(1 for r in records if r["error_kind"] or r["end"] is None),
        "cpu_s": dict(meter.cpu),
        "window_s": seconds,
        "gateway_cores": gateway / seconds,
        "replica_cores": replica / seconds,
        "tok_s": tok_s,
        "tok_s_per_gateway_core": tok_s / (gateway / seconds) if gateway else None,
    }


def _wait(server: Server) -> None:
    import time

    import httpx

    deadline = time.monotonic() + 600
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    while time.monotonic() < deadline:
        try:
            if httpx.post(server.base_url + "/v1/chat/completions", json=body,
                          timeout=30).status_code == 200:  # fmt: skip
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{server.name} not ready; see {server.log_path}")


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['ingress_replicas']} ingress" for r in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
    a.bar(labels, [r["open_streams"]["median"] for r in runs], color="tab:blue")
    a.set_title("streams open at once (median of the window)")
    b.bar(labels, [r["tok_s_per_gateway_core"] or 0 for r in runs], color="tab:green")
    b.set_title("output tokens/s per gateway core")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"# Concurrent streams — {doc['date']}", "",
        f"`python -m benchmarks.streams {doc['argv']}`: Switchyard as `make run` runs it "
        f"(HAProxy in front), one simulated model (a token every {doc['step_s']} s to every "
        f"running sequence), the load generator's closed loop at {doc['streams']} users, "
        f"{OUTPUT_TOKENS}-token streams, {doc['warmup']} s warm-up + {doc['duration']} s "
        "steady window.", "",
        "| ingress replicas | open streams min / median / max | requests (all) | failed (all) | "
        "tok/s (whole run) | gateway cores | tok/s per gateway core | LLMServer replica cores | "
        "generator self-check |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in doc["runs"]:
        o = r["open_streams"]
        check = r["self_check"] or {}
        verdict = "valid" if check.get("valid") else f"INVALID ({check.get('reason')})"
        lines.append(
            f"| {r['ingress_replicas']} | {o['min']} / {o['median']} / {o['max']} | "
            f"{r['requests']} | {r['failed_all']} | {r['tok_s']:.0f} | "
            f"{r['gateway_cores']:.2f} | {r['tok_s_per_gateway_core'] or 0:.0f} | "
            f"{r['replica_cores']:.2f} | {verdict} |"
        )
    lines += ["", f"![streams]({doc['image']})", "", "CPU seconds by process:", ""]
    for r in doc["runs"]:
        top = sorted(r["cpu_s"].items(), key=lambda kv: -kv[1])[:10]
        lines.append(f"- {r['ingress_replicas']} ingress: " + ", ".join(
            f"{k} {v:.1f} s" for k, v in top) + f" (window {r['window_s']:.0f} s)")  # fmt: skip
    lines += ["", "## Environment", "", "```json", json.dumps(doc["environment"], indent=1),
              "```", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--replicas", default="1,2")
    args = parser.parse_args()
    date = dt.date.today().isoformat()
    work = Path(tempfile.mkdtemp(prefix="streams-"))
    runs = []
    for n in (int(x) for x in args.replicas.split(",")):
        log(f"{args.streams} streams, {n} ingress replica(s)")
        runs.append(one(n, args, work))
        log(f"  open {runs[-1]['open_streams']}, {runs[-1]['tok_s']:.0f} tok/s")
    shutil.rmtree(work, ignore_errors=True)
    stem = scaffold.stem("streams", args, date)
    doc = {"argv": " ".join(sys.argv[1:]), "date": date, "streams": args.streams,
           "step_s": args.step_s, "warmup": args.warmup, "duration": args.duration,
           "runs": runs, "environment": environment(), "image": f"{stem}.png"}  # fmt: skip
    scaffold.finish(args, stem, doc, report(doc), lambda png: plot(runs, png))


if __name__ == "__main__":
    main()
