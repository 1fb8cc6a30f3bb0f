"""Idle cost: the CPU Switchyard spends outside its engines with no traffic, by process,
for Ray Serve settings side by side (one server at a time: HAProxy binds fixed ports).

    python -m benchmarks.idle_cost [--settle 30] [--window 30]

Each arm is ``switchyard serve`` on serve_configs/local.yaml (as `make run` runs it)
with the environment of the Ray processes it starts changed as the arm says; after the
first generation and ``--settle`` seconds, the CPU seconds (utime + stime from /proc) of
every process of the server over ``--window`` seconds, as a share of one core. Arms:

- ``shipped``: the environment `switchyard serve` sets today (app.cli.serve.RAY_ENV);
- ``ray-defaults``: Ray Serve's own intervals (controller loop 0.1 s, Serve's cached
  metrics exported every 100 ms), whatever RAY_ENV says of them.

Writes docs/benchmarks/idle-cost-<date>.md/.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import scaffold
from benchmarks.serving_lib import environment, prepared_model_dir
from benchmarks.serving_tax import Meter, log, stop, switchyard_server

RAY_DEFAULTS = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "100",
}
ARMS: dict[str, dict[str, str]] = {"ray-defaults": RAY_DEFAULTS, "shipped": {}}


def idle(arm: str, env: dict[str, str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    (work / arm).mkdir(parents=True, exist_ok=True)
    server = switchyard_server(work / arm, haproxy=True)
    server.env.update(env)
    log(f"{arm}: starting")
    server.start()
    try:
        log(f"{arm}: ready in {server.wait_ready(900):.0f}s; settling {args.settle:.0f}s")
        time.sleep(args.settle)
        with Meter(server) as meter:
            time.sleep(args.window)
    finally:
        stop(server)
    outside = {k: v for k, v in meter.cpu.items() if not k.startswith("engine/")}
    share = sum(outside.values()) / meter.seconds
    log(f"{arm}: {100 * share:.1f} % of a core outside the engines")
    return {
        "env": env,
        "core_share_outside_engine": share,
        "by_process": {
            k: v / meter.seconds for k, v in sorted(meter.cpu.items(), key=lambda kv: -kv[1])
        },
        "window_s": meter.seconds,
    }


def report(doc: dict[str, Any]) -> str:
    res = doc["result"]
    lines = [
        f"# Idle cost — {doc['date']}", "",
        f"`python -m benchmarks.idle_cost {doc['argv']}`: `switchyard serve` on "
        "serve_configs/local.yaml (HAProxy in front; SmolLM2 and the embedding model, both "
        f"idle), {doc['window']:.0f} s with no traffic after {doc['settle']:.0f} s of rest. "
        "Share of one core; target (issue 19): ≤ 2 % outside the engines.", "",
        "| arm | environment | outside the engines | engines |", "|---|---|---|---|",
    ]  # fmt: skip
    for arm, r in res.items():
        engines = sum(v for k, v in r["by_process"].items() if k.startswith("engine/"))
        env = ", ".join(f"`{k}={v}`" for k, v in r["env"].items()) or "as shipped"
        lines.append(f"| {arm} | {env} | {100 * r['core_share_outside_engine']:.1f} % | "
                     f"{100 * engines:.1f} % |")  # fmt: skip
    lines += ["", "By process (% of one core):", "", "| process | " + " | ".join(res) + " |",
              "|---|" + "---|" * len(res)]  # fmt: skip
    names = sorted({k for r in res.values() for k in r["by_process"]},
                   key=lambda k: -max(r["by_process"].get(k, 0) for r in res.values()))  # fmt: skip
    for name in names:
        vals = [100 * r["by_process"].get(name, 0.0) for r in res.values()]
        if max(vals) >= 0.05:
            lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    lines += ["", "## Environment", "", "```json", json.dumps(doc["environment"], indent=1),
              "```", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    date = dt.date.today().isoformat()
    work = Path(tempfile.mkdtemp(prefix="idle-cost-"))  # servers' logs: kept on failure
    result = {arm: idle(arm, env, args, work) for arm, env in ARMS.items()}
    shutil.rmtree(work, ignore_errors=True)
    doc = {"argv": " ".join(sys.argv[1:]), "date": date, "settle": args.settle,
           "window": args.window, "environment": environment(prepared_model_dir()),
           "result": result}  # fmt: skip
    scaffold.finish(args, scaffold.stem("idle-cost", args, date), doc, report(doc))


if __name__ == "__main__":
    main()
