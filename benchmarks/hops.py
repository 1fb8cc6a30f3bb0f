"""Per-hop cost of the request path, measured side by side in one run.

Deploys Switchyard with a zero-latency SIMULATED engine (so engine time is ~0) and
times, sequentially from one client on loopback:
  proxy+ingress        GET /health
  +LLMServer (unary)   POST /v1/completions, max_tokens=1, stream=false
  +LLMServer (stream)  same with stream=true, time to the first content chunk
  64-token stream      the whole stream of 64 one-token chunks (per-token path cost)
  router hop (unary)   ModelRouter.route() through a DeploymentHandle from the driver
                       (skipped under RAY_SERVE_THROUGHPUT_OPTIMIZED=1, where driver-side
                       handles need a running event loop)

Usage: python -m benchmarks.hops [--n 300] [--tag NAME]
writes docs/benchmarks/hops-<date>[-NAME].json/.md; the Ray Serve environment flags in
effect are recorded in the metadata.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import ray
from ray import serve

from app.builders import build_app
from app.routing.table import RouteRequest
from app.stats import percentile
from benchmarks import scaffold

ZERO = {
    "prefill_s_per_token": 0.0,
    "prefill_base_s": 0.0,
    "decode_base_s": 0.0,
    "decode_s_per_seq": 0.0,
}


def _pct(xs: list[float], q: float) -> float:
    value = percentile(xs, q * 100)
    assert value is not None
    return value * 1000


def _time(fn: Any, n: int) -> list[float]:
    for _ in range(20):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--n", type=int, default=300)
    a = parser.parse_args()
    ray.init(address="local", include_dashboard=False, num_cpus=4, log_to_driver=False)
    # Port 8000: under direct ingress the ingress replica itself listens there.
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    app = build_app(
        {
            "models": [{"id": "zero", "engine": "simulated", "simulation": ZERO}],
            "gateway": {"anonymous_tenant": "bench"},  # no credentials: the skeleton's path
        }
    )
    serve.run(app, name="hops", route_prefix="/")
    base = "http://127.0.0.1:8000"
    client = httpx.Client(timeout=30)
    body = {"model": "zero", "prompt": "hello world", "max_tokens": 1}

    def health() -> None:
        client.get(base + "/health").raise_for_status()

    def unary() -> None:
        client.post(base + "/v1/completions", json=body).raise_for_status()

    def first_chunk() -> None:
        with client.stream("POST", base + "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break

    def stream_64() -> None:
        long = {**body, "max_tokens": 64, "ignore_eos": True, "stream": True}
        with client.stream("POST", base + "/v1/completions", json=long) as r:
            for _ in r.iter_lines():
                pass

    rows = {
        "proxy+ingress (GET /health)": _time(health, a.n),
        "proxy+ingress+LLMServer, unary completion": _time(unary, a.n),
        "proxy+ingress+LLMServer, stream to first chunk": _time(first_chunk, a.n),
        "proxy+ingress+LLMServer, whole 64-token stream": _time(stream_64, a.n),
    }
    if os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") != "1":
        router = serve.get_deployment_handle("ModelRouter", app_name="hops")

        def router_hop() -> None:
            router.route.remote(RouteRequest("zero")).result()

        rows["one handle hop (driver -> ModelRouter.route)"] = _time(router_hop, a.n)
    serve.shutdown()
    ray.shutdown()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": commit,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "n_per_row": a.n,
        "engine": "simulated, zero latency",
        "ray_serve_env": {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")},
    }
    summary = {
        k: {"p50_ms": _pct(v, 0.5), "p99_ms": _pct(v, 0.99), "mean_ms": statistics.mean(v) * 1000}
        for k, v in rows.items()
    }
    stem = scaffold.stem("hops", a, meta["date"])
    stamp = stem.removeprefix("hops-")
    lines = [f"# Per-hop cost ({stamp})", "", "```", json.dumps(meta, indent=2), "```", ""]
    lines += ["| path | p50 ms | p99 ms | mean ms |", "|---|---|---|---|"]
    for k, v in summary.items():
        lines.append(f"| {k} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['mean_ms']:.2f} |")
    scaffold.finish(a, stem, {"meta": meta, "summary": summary}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
