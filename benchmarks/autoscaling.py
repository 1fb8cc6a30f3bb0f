"""Ray Serve autoscaling of an LLMServer deployment under a load step, on local Ray with
the simulated engine: idle, then a closed loop at fixed concurrency, then idle again,
sampling Serve's running replica count and the requests in flight twice a second.

    python -m benchmarks.autoscaling [--concurrency 6] [--load-s 40] [--idle-s 60]

The load is a closed loop (fixed concurrency), so it is relative to this machine's
speed, never a fixed rate. Writes docs/benchmarks/autoscaling-<date>.md/.json/.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.layer1_http import ray_serve
from benchmarks.serving_lib import environment

APP = "autoscale-bench"
MODEL = "autoscale-sim"
SCALING = {
    "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1,
    "upscale_delay_s": 1, "downscale_delay_s": 5, "look_back_period_s": 2,
    "metrics_interval_s": 0.5,
}  # fmt: skip


def log(message: str) -> None:
    print(f"[autoscaling] {message}", file=sys.stderr, flush=True)


def run(concurrency: int, load_s: float, idle_s: float, out: Path) -> dict[str, Any]:
    from ray import serve

    from app.builders import build_application
    from app.config import AppArgs
    from app.settings import Settings

    with ray_serve() as cluster, tempfile.TemporaryDirectory() as tmp:
        model = {
            "id": MODEL, "engine": "simulated", "max_ongoing_requests": 4,
            "simulation": {"decode_base_s": 0.05, "prefill_s_per_token": 0.0001},
            "autoscaling_config": SCALING,
        }  # fmt: skip
        args = AppArgs.model_validate(
            {"models": [model], "gateway": {"anonymous_tenant": "bench"}}
        )
        settings = Settings(
            cache_dir=Path(tmp), data_dir=Path(tmp) / "d", state_url=f"sqlite:///{tmp}/s.db"
        )
        serve.run(build_application(args, settings), name=APP, route_prefix=f"/{APP}")
        url = f"http://127.0.0.1:{cluster.port}/{APP}/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 40, "stream": True, "ignore_eos": True}  # fmt: skip
        in_flight = [0]
        lock = threading.Lock()
        outcomes: list[tuple[float, int, bool]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def client() -> None:
            with httpx.Client(timeout=120) as http:
                while not stop.is_set():
                    with lock:
                        in_flight[0] += 1
                    ok, status = False, 0
                    try:
                        with http.stream("POST", url, json=body) as r:
                            status = r.status_code
                            ok = status == 200 and any(
                                line == "data: [DONE]" for line in r.iter_lines()
                            )
                    except httpx.HTTPError:
                        ok = False
                    finally:
                        with lock:
                            in_flight[0] -= 1
                    outcomes.append((time.monotonic() - t0, status, ok))

        samples: list[dict[str, float]] = []

        def sample() -> None:
            status = serve.status().applications[APP].deployments[f"LLMServer-{MODEL}"]
            samples.append({
                "t": round(time.monotonic() - t0, 2),
                "replicas": int(status.replica_states.get("RUNNING", 0)),
                "starting": int(status.replica_states.get("STARTING", 0)),
                "in_flight": in_flight[0],
            })  # fmt: skip

        phases = {"idle_before_s": 5.0, "load_s": load_s, "idle_after_s": idle_s}
        log(f"idle {phases['idle_before_s']} s, load c={concurrency} {load_s} s, idle {idle_s} s")
        end = phases["idle_before_s"]
        while time.monotonic() - t0 < end:
            sample()
            time.sleep(0.5)
        threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        end += load_s
        while time.monotonic() - t0 < end:
            sample()
            time.sleep(0.5)
        stop.set()
        end += idle_s
        while time.monotonic() - t0 < end:
            sample()
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=60)
        serve.delete(APP)
    failed = [o for o in outcomes if not o[2]]
    peak = max(s["replicas"] for s in samples)
    result = {
        "parameters": {"concurrency": concurrency, **phases, "autoscaling_config": SCALING,
                       "engine": "simulated, 0.05 s a token, 40 tokens a request"},
        "requests": len(outcomes),
        "failed": len(failed),
        "peak_replicas": peak,
        "final_replicas": samples[-1]["replicas"],
        "first_scale_up_s": next(
            (round(s["t"] - phases["idle_before_s"], 2) for s in samples if s["replicas"] > 1),
            None,
        ),
        "samples": samples,
        "environment": environment(),
    }  # fmt: skip
    _write(result, out)
    return result


def _write(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"autoscaling-{dt.date.today().isoformat()}"
    t = [s["t"] for s in result["samples"]]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(t, [s["replicas"] for s in result["samples"]], where="post", label="running replicas")
    ax.plot(t, [s["in_flight"] for s in result["samples"]], alpha=0.6, label="requests in flight")
    p = result["parameters"]
    start, stop = p["idle_before_s"], p["idle_before_s"] + p["load_s"]
    ax.axvspan(start, stop, color="grey", alpha=0.15, label=f"load c={p['concurrency']}")
    ax.set_xlabel("seconds")
    ax.set_title("LLMServer replicas under a load step (Ray Serve autoscaling)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Autoscaling: LLMServer replicas under a load step",
        "",
        "`python -m benchmarks.autoscaling` — local Ray, simulated engine, closed loop.",
        "",
        f"- requests: {result['requests']}, failed: {result['failed']}",
        f"- replicas: 1 → {result['peak_replicas']} → {result['final_replicas']}",
        f"- first scale-up {result['first_scale_up_s']} s after the load started",
        "",
        f"![replicas and requests in flight]({stem.name}.png)",
        "",
        "## Parameters and environment",
        "",
        "```json",
        json.dumps({"parameters": p, "environment": result["environment"]}, indent=1),
        "```",
        "",
    ]
    Path(f"{stem}.md").write_text("\n".join(lines))
    log(f"wrote {stem}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--load-s", type=float, default=40.0)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    a = parser.parse_args()
    result = run(a.concurrency, a.load_s, a.idle_s, a.out)
    log(
        f"{result['requests']} requests, {result['failed']} failed; replicas 1 → "
        f"{result['peak_replicas']} → {result['final_replicas']}"
    )


if __name__ == "__main__":
    main()
