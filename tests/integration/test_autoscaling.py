"""Ray Serve autoscaling of an LLMServer deployment, measured on local Ray with the
simulated engine: a load step scales the replicas 1 → N, they come back to 1 after the
load stops, and no request fails on the way (the replica count is read from Serve's
own status, in both directions)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ray import serve

from tests.integration.conftest import Deploy
from tests.integration.streams import read_stream, slow_sim

APP = "autoscale"
DEPLOYMENT = "LLMServer-autoscale-sim"


def running_replicas() -> int:
    status = serve.status().applications[APP].deployments[DEPLOYMENT]
    return int(status.replica_states.get("RUNNING", 0))


def test_a_load_step_scales_llmserver_replicas_up_and_back_down(deploy: Deploy) -> None:
    model = {
        **slow_sim("autoscale-sim", decode_base_s=0.05),
        "max_ongoing_requests": 4,
        "autoscaling_config": {
            "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1,
            "upscale_delay_s": 1, "downscale_delay_s": 4,
            "look_back_period_s": 2, "metrics_interval_s": 0.5,
        },
    }  # fmt: skip
    gw = deploy(APP, {"models": [model], "gateway": {"anonymous_tenant": "scale-t"}})
    assert running_replicas() == 1
    body = {
        "model": "autoscale-sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,  # 2 s a stream
        "stream": True,
        "ignore_eos": True,
    }
    results: list[dict[str, Any]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            read_stream(gw.v1 + "/chat/completions", body, results)

    clients = [threading.Thread(target=client) for _ in range(6)]  # 6 in flight: target 1
    for t in clients:
        t.start()
    seen: list[int] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and max(seen, default=0) < 2:
        seen.append(running_replicas())
        time.sleep(0.5)
    peak = max(seen)
    stop.set()
    for t in clients:
        t.join(timeout=60)
    assert peak >= 2, f"no scale-up under load: replicas seen {seen}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and running_replicas() > 1:
        time.sleep(1.0)
    assert running_replicas() == 1, "no scale-down after the load stopped"
    assert results and all(
        r["status"] == 200 and r["done"] and r["error"] is None for r in results
    ), [r for r in results if r["error"] is not None or r["status"] != 200][:3]
    serve.delete(APP)
