"""The Grafana dashboard as a person would look at it, after a load run: no Grafana can be
installed here (it is not on PyPI, npm or in Debian's main archive), so this script runs
the dashboard's own queries through a real Prometheus and plots each panel the way the
dashboard lays it out, one image per row.

    python -m benchmarks.dashboard_snapshot [--load-s 180] [--concurrency 3]

What runs: local Ray with a Switchyard app (a simulated chat model on two replicas with
Switchyard's replica router, a disaggregated simulated model, the real vLLM CPU engine
on a tiny random-weight Llama with a LoRA adapter, a routes file with a dead upstream
that falls back), Redis for shared state, and Debian's ``prometheus`` scraping the
gateway (admin token) and Ray's metrics export every 2 s. The load is a closed loop at
fixed concurrency (relative to this machine's speed): chats over a few shared prefixes,
streams, long prompts to the disaggregated model, the dead route, the adapter, a tenant
outside ``metrics_tenants``, a key whose budget runs out, and clients that leave.

Writes docs/observability/dashboard-<date>-<row>.png and dashboard-<date>.md/.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.observability import dashboards
from benchmarks.layer1_http import App, ray_serve
from benchmarks.local_prometheus import Prometheus, Target, prometheus_server
from benchmarks.local_redis import free_port, redis_server
from benchmarks.report_files import write_report
from benchmarks.serving_lib import environment

APP = "dash"
OUT = Path(__file__).resolve().parents[1] / "docs" / "observability"
TENANT = "acme"
FAST = {"prefill_s_per_token": 0.0002, "decode_base_s": 0.01, "decode_s_per_seq": 0.001}
ROUTES = """
pools:
  main: {kind: local, model: chat}
  pd:   {kind: local, model: long-context}
  lora: {kind: local, model: tiny}
  dead: {kind: openai, base_url: "http://127.0.0.1:DEAD_PORT/v1", model: gone,
         connect_timeout_s: 1}
models:
  chat:
    pool: main
    profile: {max_context: 4096, input_per_1m: 0.5, output_per_1m: 1.5, cached_input_per_1m: 0.25}
  long-context:
    pool: pd
    profile: {max_context: 4096, input_per_1m: 1, output_per_1m: 3}
  tiny:
    pool: lora
    profile: {max_context: 512, input_per_1m: 0.1, output_per_1m: 0.2}
  flaky:
    pool: dead
    profile: {max_context: 4096}
    fallbacks: [main]
default_model: chat
fallback: {max_attempts: 3, total_timeout_s: 20}
"""


def log(message: str) -> None:
    print(f"[dashboard] {message}", file=sys.stderr, flush=True)


def _words(prefix: str, n: int, rng: random.Random) -> str:
    shared = " ".join(f"{prefix}{i}" for i in range(n))
    return f"{shared} question {rng.randrange(10**6)}"


class Load:
    """A closed loop: each worker sends one request of the next kind, then the next."""

    KINDS = ("chat", "chat", "stream", "long", "chat", "flaky", "lora", "stranger", "poor",
             "leave")  # fmt: skip

    def __init__(self, app: App, keys: dict[str, str], seed: int) -> None:
        self.v1 = app.root + "/v1/chat/completions"
        self.keys = keys
        self.rng = random.Random(seed)
        self.counts: dict[str, dict[int, int]] = {}
        self.lock = threading.Lock()

    def one(self, http: httpx.Client, kind: str) -> int:
        rng = self.rng
        key, model, max_tokens, stream = self.keys["main"], "chat", 16, False
        content = _words(f"ctx{rng.randrange(4)}w", 200, rng)  # four shared prefixes
        if kind == "stream":
            stream, max_tokens = True, 32
        elif kind == "long":
            model, content = "long-context", _words(f"doc{rng.randrange(3)}w", 900, rng)
        elif kind == "flaky":
            model = "flaky"
        elif kind == "lora":
            model, content = "tiny:a1", _words("t", 40, rng)
        elif kind == "stranger":
            key = self.keys["stranger"]
        elif kind == "poor":
            key = self.keys["poor"]
        elif kind == "leave":
            stream, max_tokens = True, 400
        body = {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "stream": stream}  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        if not stream:
            return http.post(self.v1, json=body, headers=headers).status_code
        with http.stream("POST", self.v1, json=body, headers=headers) as r:
            for i, _ in enumerate(r.iter_lines()):
                if kind == "leave" and i >= 2:
                    break  # the client leaves mid-stream
            return r.status_code

    def worker(self, stop: threading.Event, offset: int) -> None:
        with httpx.Client(timeout=120) as http:
            i = offset
            while not stop.is_set():
                kind = self.KINDS[i % len(self.KINDS)]
                i += 1
                try:
                    status = self.one(http, kind)
                except httpx.HTTPError:
                    status = 0
                with self.lock:
                    by = self.counts.setdefault(kind, {})
                    by[status] = by.get(status, 0) + 1


def _deploy(cluster: Any, tmp: Path, redis_url: str) -> App:
    from app.models.tiny import build_tiny_llama, build_tiny_lora

    routes = tmp / "routes.yaml"
    routes.write_text(ROUTES.replace("DEAD_PORT", str(free_port())))
    tiny = build_tiny_llama(tmp / "tiny")
    lora = build_tiny_lora(tmp / "a1", 1)
    routing = {"prefix": {"block_size": 16}}
    args = {
        "models": [
            {"id": "chat", "engine": "simulated", "simulation": FAST, "num_replicas": 2,
             "routing": routing},
            {"id": "long-context", "engine": "simulated", "routing": routing,
             "simulation": {**FAST, "kv_connector": True},
             "disaggregation": {"min_uncached_tokens": 256}},
            {"id": "tiny", "source": str(tiny), "max_model_len": 512,
             "kv_cache_memory_bytes": 32 * 1024**2, "max_num_seqs": 4,
             "lora": {"max_loras": 1, "max_cpu_loras": 1, "max_lora_rank": 8}},
        ],
        "routes_file": str(routes),
        "gateway": {"metrics_tenants": [TENANT]},
    }  # fmt: skip
    app: App = cluster.deploy(APP, args, redis_url + "/3")
    app.admin("POST", "/adapters", json={"name": "a1", "base": "tiny", "source": str(lora)})
    return app


def _targets(app: App) -> list[Target]:
    import ray

    (node,) = [n for n in ray.nodes() if n["Alive"]]
    host = app.root.split("/")[2]
    return [
        Target("switchyard", host, f"/{APP}/metrics", bearer=app.token),
        Target("ray", f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"),
    ]


def _series(prom: Prometheus, expr: str, start: float, end: float, step: float) -> list[Any]:
    return prom.query_range(dashboards.concrete(expr, "30s"), start, end, step)


def _label(metric: dict[str, str], legend: str) -> str:
    if not legend:
        return ", ".join(f"{k}={v}" for k, v in metric.items() if k != "__name__") or "value"
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m.group(1), "?"), legend)


def plot(prom: Prometheus, start: float, end: float, date: str) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = 5.0
    summary: dict[str, Any] = {}
    OUT.mkdir(parents=True, exist_ok=True)
    for row_title, row in dashboards.ROWS:
        cols = 3
        rows = (len(row) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(15, 3.4 * rows), squeeze=False)
        for ax in axes.flat[len(row):]:
            ax.axis("off")
        for ax, panel in zip(axes.flat, row, strict=False):
            result = _series(prom, panel.expr, start, end, step)
            summary[panel.title] = len(result)
            for s in result[:8]:
                xs = [float(t) - start for t, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                ax.plot(xs, ys, label=_label(s["metric"], panel.legend), linewidth=1.2)
            ax.set_title(f"{panel.title} ({panel.unit})", fontsize=10)
            ax.set_xlabel("s since the load started", fontsize=8)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
            if result:
                ax.legend(fontsize=7, loc="upper left")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(f"Switchyard — {row_title}", fontsize=13)
        fig.tight_layout()
        slug = row_title.lower().replace(" ", "-")
        fig.savefig(OUT / f"dashboard-{date}-{slug}.png", dpi=80)
        plt.close(fig)
    return summary


def run(load_s: float, concurrency: int) -> dict[str, Any]:
    date = dt.date.today().isoformat()
    with (
        tempfile.TemporaryDirectory() as tmpdir,
        redis_server(Path(tmpdir)) as redis_url,
        ray_serve() as cluster,
    ):
        tmp = Path(tmpdir)
        app = _deploy(cluster, tmp, redis_url)
        keys = {
            "main": app.new_key(TENANT, {}),
            "stranger": app.new_key("stranger-1", {}),
            "poor": app.new_key(TENANT, {"daily_tokens": 2000}),
        }
        (tmp / "prom").mkdir()
        with prometheus_server(tmp / "prom", _targets(app), interval_s=2.0) as prom:
            prom.wait_scraped({"switchyard", "ray"})
            load = Load(app, keys, seed=7)
            stop = threading.Event()
            threads = [threading.Thread(target=load.worker, args=(stop, i * 3), daemon=True)
                       for i in range(concurrency)]  # fmt: skip
            start = time.time()
            log(f"load: {concurrency} workers for {load_s:.0f} s")
            for t in threads:
                t.start()
            while time.time() - start < load_s:
                time.sleep(min(30.0, load_s - (time.time() - start)))
                done = sum(sum(v.values()) for v in load.counts.values())
                log(f"{time.time() - start:.0f} s: {done} requests")
            stop.set()
            for t in threads:
                t.join(timeout=180)
            time.sleep(10)  # the last exports and scrapes
            end = time.time()
            panels = plot(prom, start, end, date)
    return {
        "environment": environment(),
        "parameters": {"load_s": load_s, "concurrency": concurrency, "scrape_interval_s": 2.0,
                       "rate_interval": "30s", "step_s": 5.0},
        "requests": load.counts,
        "series_per_panel": panels,
    }  # fmt: skip


def report(result: dict[str, Any], date: str) -> str:
    env = result["environment"]
    lines = [
        f"# Dashboard snapshot, {date}",
        "",
        "The dashboard's own queries (`app/observability/dashboards.py`), evaluated by a",
        "real Prometheus over a load run and plotted one row per image (no Grafana can be",
        "installed here). `python -m benchmarks.dashboard_snapshot "
        f"--load-s {result['parameters']['load_s']:g} "
        f"--concurrency {result['parameters']['concurrency']}`.",
        "",
        f"Commit {env['git_commit']}, {env['cpu_model']} ({env['cpu_count']} cores), "
        f"{env['date']}.",
        "",
        "| kind | answers by status |",
        "|---|---|",
    ]
    for kind, by in sorted(result["requests"].items()):
        lines.append(f"| {kind} | {', '.join(f'{s}: {n}' for s, n in sorted(by.items()))} |")
    lines += ["", "| panel | series |", "|---|---|"]
    lines += [f"| {t} | {n} |" for t, n in result["series_per_panel"].items()]
    lines.append("")
    for row_title, _ in dashboards.ROWS:
        slug = row_title.lower().replace(" ", "-")
        lines += [f"## {row_title}", "", f"![{row_title}](dashboard-{date}-{slug}.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-s", type=float, default=180.0)
    parser.add_argument("--concurrency", type=int, default=3)
    a = parser.parse_args()
    result = run(a.load_s, a.concurrency)
    date = dt.date.today().isoformat()
    write_report(OUT, f"dashboard-{date}", result, report(result, date))
    log(f"wrote {OUT}/dashboard-{date}.md")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
