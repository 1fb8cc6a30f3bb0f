"""Hot reload of the routes file under load: an open-loop 200 req/s run against the
simulated engine while the routes file moves the public model between two pools every
few seconds. Target (issue 4): zero failed requests.

    python -m benchmarks.routing_reload [--rate 200] [--seconds 30] [--every 5] [--quick]

Writes docs/benchmarks/routing-reload-<date>.md/.json/.png (per-request records,
reload times, environment).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from app.bench.metrics import percentile
from benchmarks.layer1_http import CHAT, open_loop, ray_serve
from benchmarks.serving_lib import environment

ZERO = {"prefill_s_per_token": 0.0, "decode_base_s": 0.0, "decode_s_per_seq": 0.0}
ROUTES = """
pools:
  main:  {kind: local, model: sim-main}
  spare: {kind: local, model: sim-spare}
models:
  chat: {pool: POOL, profile: {max_context: 2048}}
"""


def log(message: str) -> None:
    print(f"[routing-reload] {message}", file=sys.stderr, flush=True)


def _pool(response: httpx.Response) -> dict[str, Any]:
    header = response.headers.get("x-switchyard-route", "")
    parts = dict(p.split("=", 1) for p in header.split("; ") if "=" in p)
    return {"pool": parts.get("pool")}


async def _reloader(path: Path, every: float, seconds: float, marks: list[float]) -> None:
    start = time.perf_counter()
    pool = "main"
    while time.perf_counter() - start + every < seconds:
        await asyncio.sleep(every)
        pool = "spare" if pool == "main" else "main"
        path.write_text(ROUTES.replace("POOL", pool))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        marks.append(round(time.perf_counter() - start, 3))
        log(f"routes file now sends chat to {pool}")


def run(rate: float, seconds: float, every: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, ray_serve() as cluster:
        routes = Path(tmp) / "routes.yaml"
        routes.write_text(ROUTES.replace("POOL", "main"))
        app = cluster.deploy(
            "reload",
            {
                "models": [
                    {"id": "sim-main", "engine": "simulated", "simulation": ZERO},
                    {"id": "sim-spare", "engine": "simulated", "simulation": ZERO},
                ],
                "routes_file": str(routes),
                "route_refresh_s": 0.5,
                "gateway": {"anonymous_tenant": "bench"},
            },
            state_url=f"sqlite:///{Path(tmp) / 'state.db'}",
        )
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

        async def go() -> tuple[list[dict[str, Any]], list[float]]:
            marks: list[float] = []
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                for _ in range(50):  # warm-up
                    await client.post(app.root + CHAT, json=body)
                reloads = asyncio.create_task(_reloader(routes, every, seconds, marks))
                records = await open_loop(
                    client, app.root + CHAT, {}, body, rate, int(rate * seconds), _pool
                )
                await reloads
            return records, marks

        records, marks = asyncio.run(go())
        env = environment()
        env["parameters"] = {"rate": rate, "seconds": seconds, "every": every}
    return {"environment": env, "records": records, "reloads_at_s": marks}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    records = result["records"]
    statuses = Counter(str(r["status"]) for r in records)
    latencies = [r["latency_ms"] for r in records if r["status"] == 200]
    span = max(r["sent"] for r in records) or 1.0
    return {
        "sent": len(records),
        "achieved_rate": round(len(records) / span, 1),
        "statuses": dict(statuses),
        "failed": len(records) - statuses.get("200", 0),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "pools": dict(Counter(str(r.get("pool")) for r in records)),
        "reloads": len(result["reloads_at_s"]),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for pool, color in (("main", "tab:blue"), ("spare", "tab:orange")):
        per_s = Counter(int(r["sent"]) for r in result["records"] if r.get("pool") == pool)
        xs = sorted(per_s)
        a.plot(xs, [per_s[x] for x in xs], label=f"answered by {pool}", color=color)
    for mark in result["reloads_at_s"]:
        a.axvline(mark, color="grey", linestyle=":")
    a.set(xlabel="s", ylabel="requests/s", title="pool per second (dotted: routes file edits)")
    a.legend()
    xs = [r["sent"] for r in result["records"]]
    ys = [r["latency_ms"] for r in result["records"]]
    b.scatter(xs, ys, s=2)
    b.set(xlabel="s", ylabel="latency ms", yscale="log", title="per-request latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="10 s at 100 req/s")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args()
    rate, seconds = (100.0, 10.0) if args.quick else (args.rate, args.seconds)
    result = run(rate, seconds, args.every)
    summary = summarize(result)
    day = dt.date.today().isoformat()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"routing-reload-{day}-{rate:g}rps"
    (stem.with_suffix(".json")).write_text(json.dumps({**result, "summary": summary}, indent=1))
    plot(result, stem.with_suffix(".png"))
    verdict = "pass" if summary["failed"] == 0 else "FAIL"
    lines = [
        f"# Routes-file hot reload under load ({day})",
        "",
        "How: `python -m benchmarks.routing_reload` — open loop against the simulated engine "
        "(zero latency), the routes file rewritten to move `chat` between pools "
        f"every {args.every:g} s.",
        "",
        "| offered | achieved | seconds | reloads | sent | failed | p50 ms | p99 ms | pools |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {rate:g}/s | {summary['achieved_rate']}/s | {seconds:g} | {summary['reloads']} | "
        f"{summary['sent']} | {summary['failed']} | {summary['p50_ms']:.1f} | "
        f"{summary['p99_ms']:.1f} | {summary['pools']} |",
        "",
        f"Target: zero failed requests — **{verdict}**. Statuses: {summary['statuses']}.",
        "",
        f"![reload]({stem.name}.png)",
        "",
        "## Environment",
        "",
        "```json",
        json.dumps(result["environment"], indent=1),
        "```",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))


if __name__ == "__main__":
    main()
