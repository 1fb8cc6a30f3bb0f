"""Replicas that stop or whose engine dies: nothing admitted goes unrecorded, and a
dead engine is a retryable 503 (never a 500) until Ray replaces the replica."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from ray import serve

from tests.integration.conftest import Deploy
from tests.integration.processes import describe, engine_processes
from tests.integration.streams import read_stream, slow_sim, sqlite_records

HELLO = [{"role": "user", "content": "hi"}]


def test_deleting_the_app_mid_stream_loses_no_record(deploy: Deploy) -> None:
    gw = deploy(
        "drain",
        {
            "models": [slow_sim("drain-slow")],
            "gateway": {"anonymous_tenant": "drain-t"},
            "graceful_shutdown_timeout_s": 20,
        },
    )
    body = {
        "model": "drain-slow",
        "messages": HELLO,
        "max_tokens": 60,
        "stream": True,
        "ignore_eos": True,
    }
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=read_stream, args=(gw.v1 + "/chat/completions", body, results))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)  # every stream has produced tokens
    serve.delete("drain")
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 4
    records = sqlite_records(gw.state_url, "drain-t")
    assert len(records) == 4, (results, records)
    for r in results:  # each stream finished, or ended with an error event
        assert r["done"] or r["error"] is not None
    finished = sorted(r["chunks"] for r in results if r["done"] and r["error"] is None)
    ok = sorted(rec.completion_tokens for rec in records if rec.status == "ok")
    assert ok == finished
    assert all(rec.completion_tokens > 0 for rec in records)


def test_streams_longer_than_the_grace_are_ended_and_billed_when_the_app_stops(
    deploy: Deploy,
) -> None:
    """Ray waits for ongoing requests before it runs ``__del__`` and kills the replica
    ``graceful_shutdown_timeout_s`` (+ the settle margin) after the stop began: streams
    longer than that must be ended by the ingress's own grace, counted from Ray's stop
    signal, each with an error event and a record billing the tokens it produced."""
    gw = deploy(
        "longdrain",
        {
            "models": [slow_sim("longdrain-slow", decode_base_s=0.1)],
            "gateway": {"anonymous_tenant": "longdrain-t"},
            "graceful_shutdown_timeout_s": 2,
        },
    )
    body = {
        "model": "longdrain-slow",
        "messages": HELLO,
        "max_tokens": 400,  # 40 s: past the grace and past Ray's kill at 2 + 15 s
        "stream": True,
        "ignore_eos": True,
    }
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=read_stream, args=(gw.v1 + "/chat/completions", body, results))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    time.sleep(1.5)  # every stream has produced tokens
    serve.delete("longdrain")
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 3
    for r in results:
        assert r["status"] == 200, results
        assert r["error"] == "shutting_down", results
        assert 0 < r["chunks"] < 400
    records = sqlite_records(gw.state_url, "longdrain-t")
    assert sorted((rec.status, rec.http_status) for rec in records) == [("error", 503)] * 3
    billed = sorted(rec.completion_tokens for rec in records)
    seen = sorted(r["chunks"] for r in results)
    assert all(b >= s for b, s in zip(billed, seen, strict=True)), (billed, seen)
    assert all(b < 400 for b in billed)


def test_scaling_the_ingress_down_mid_stream_loses_no_record(deploy: Deploy) -> None:
    """Two ingress replicas with streams, then the app is redeployed with one: Ray
    replaces the replicas (a new code version), the stopping ones drain their streams
    (they finish) and every stream has its record."""
    args = {
        "models": [slow_sim("scale-slow")],
        "ingress_replicas": 2,
        "gateway": {"anonymous_tenant": "scale-t"},
        "graceful_shutdown_timeout_s": 20,
    }
    gw = deploy("scaledown", args)
    body = {
        "model": "scale-slow",
        "messages": HELLO,
        "max_tokens": 60,
        "stream": True,
        "ignore_eos": True,
    }
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=read_stream, args=(gw.v1 + "/chat/completions", body, results))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)
    deploy("scaledown", {**args, "ingress_replicas": 1}, state_url=gw.state_url)
    for t in threads:
        t.join(timeout=120)
    assert [r["status"] for r in results] == [200] * 6
    assert all(r["done"] and r["error"] is None and r["chunks"] == 60 for r in results), results
    records = sqlite_records(gw.state_url, "scale-t")
    assert sorted((r.status, r.completion_tokens) for r in records) == [("ok", 60)] * 6
    serve.delete("scaledown")


def test_a_killed_ingress_replica_leaves_lost_records(deploy: Deploy) -> None:
    """SIGKILL the ingress replica mid-stream: its in-memory state is gone, but after
    the reservation TTL the restarted replica's heartbeat writes a `lost` record (prompt
    tokens billed) for each request it was serving, so admitted = recorded."""
    gw = deploy(
        "ingresskill",
        {
            "models": [slow_sim("ik")],
            "gateway": {"reservation_ttl_s": 3},
        },
    )
    key = gw.new_key(tenant="ik-t", max_concurrent=10)
    body = {"model": "ik", "messages": HELLO, "max_tokens": 200, "stream": True}
    results: list[dict[str, Any]] = []

    def stream() -> None:
        got: dict[str, Any] = {"chunks": 0}
        headers = {"Authorization": f"Bearer {key}"}
        try:
            with httpx.stream(
                "POST", gw.v1 + "/chat/completions", json=body, headers=headers, timeout=60
            ) as r:
                for line in r.iter_lines():
                    if '"content"' in line:
                        got["chunks"] += 1
        except httpx.HTTPError as exc:
            got["error"] = type(exc).__name__
        results.append(got)

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    os.kill(_replica_pid("ingresskill", "OpenAiIngress"), signal.SIGKILL)
    for t in threads:
        t.join(timeout=60)
    assert all(0 < r["chunks"] < 200 for r in results), results  # cut short by the kill
    client = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"})
    deadline = time.monotonic() + 90
    lost: list[Any] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):  # starts the new replica's heartbeat
            one = {**body, "stream": False, "max_tokens": 1}
            client.post(gw.v1 + "/chat/completions", json=one)
        lost = [r for r in sqlite_records(gw.state_url, "ik-t") if r.status == "lost"]
        if len(lost) >= 3:
            break
        time.sleep(1.0)
    assert len(lost) == 3, lost
    assert all(r.prompt_tokens > 0 and r.completion_tokens == 0 for r in lost)
    assert all(r.http_status == 0 for r in lost)
    serve.delete("ingresskill")


def _replica_pid(app: str, deployment_prefix: str) -> int:
    """The process of the live replica of ``app``'s deployment (Ray titles its actor
    processes ``ray::ServeReplica:<app>:<deployment>``)."""
    title = f"ServeReplica:{app}:{deployment_prefix}"
    for proc in psutil.process_iter(["cmdline"]):
        if title in " ".join(proc.info["cmdline"] or ()):
            return int(proc.pid)
    raise AssertionError(f"no live replica process titled {title}")


def test_a_replica_killed_before_the_first_token_is_503_not_500(deploy: Deploy) -> None:
    """SIGKILL the LLMServer replica while requests wait for their first token (a long
    prefill): those requests are a retryable 503, the one mid-stream ends with an error
    event, /ready says 503 until Ray has restarted the replica, and every admitted
    request has its record."""
    gw = deploy(
        "replicakill",
        {
            "models": [
                {
                    "id": "rk",
                    "engine": "simulated",
                    "simulation": {"prefill_s_per_token": 0.003, "decode_base_s": 0.05},
                }
            ],
            "gateway": {"anonymous_tenant": "rk-t"},
        },
    )
    client = httpx.Client(timeout=60)
    assert client.get(gw.root + "/ready").status_code == 200
    streaming: list[dict[str, Any]] = []
    stream_body = {
        "model": "rk", "messages": HELLO, "max_tokens": 200, "stream": True, "ignore_eos": True
    }
    t = threading.Thread(
        target=read_stream, args=(gw.v1 + "/chat/completions", stream_body, streaming)
    )
    t.start()
    time.sleep(1.0)  # the stream is producing tokens
    waiting: list[int] = []
    long_prompt = [{"role": "user", "content": "word " * 1500}]  # ~4.5 s of prefill

    def slow_request() -> None:
        body = {"model": "rk", "messages": long_prompt, "max_tokens": 2}
        waiting.append(client.post(gw.v1 + "/chat/completions", json=body).status_code)

    waiters = [threading.Thread(target=slow_request) for _ in range(2)]
    for w in waiters:
        w.start()
    time.sleep(1.0)
    ready: list[int] = []

    def poll_ready() -> None:  # from the kill until the restarted replica answers
        probe = httpx.Client(timeout=10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready.append(probe.get(gw.root + "/ready").status_code)
            if ready[-1] == 200 and 503 in ready:
                return
            time.sleep(0.1)

    os.kill(_replica_pid("replicakill", "LLMServer"), signal.SIGKILL)
    poller = threading.Thread(target=poll_ready)
    poller.start()
    for w in waiters:
        w.join(timeout=120)
    t.join(timeout=120)
    poller.join(timeout=130)
    assert waiting == [503, 503], waiting
    assert streaming[0]["error"] is not None and streaming[0]["done"]
    assert 503 in ready and ready[-1] == 200, ready
    records = sqlite_records(gw.state_url, "rk-t")
    assert sorted((r.status, r.http_status) for r in records) == [
        ("error", 503),
        ("rejected_by_engine", 503),
        ("rejected_by_engine", 503),
    ]
    serve.delete("replicakill")


def test_a_dead_vllm_engine_is_503_and_the_replica_is_replaced(
    deploy: Deploy, tiny_model_dir: Path
) -> None:
    gw = deploy(
        "enginekill",
        {
            "models": [
                {
                    "id": "kill-llama",
                    "source": str(tiny_model_dir),
                    "max_model_len": 256,
                    "kv_cache_memory_bytes": 32 * 1024**2,
                    "max_num_seqs": 4,
                }
            ],
            "gateway": {"anonymous_tenant": "kill-t"},
        },
    )
    body = {"model": "kill-llama", "messages": HELLO, "max_tokens": 2}
    client = httpx.Client(timeout=60)
    assert client.get(gw.root + "/ready").status_code == 200
    assert client.post(gw.v1 + "/chat/completions", json=body).status_code == 200
    pids = engine_processes("enginekill")
    assert pids, f"no vLLM engine-core process found under the replica: {describe('enginekill')}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    statuses: list[int] = []
    ready: list[int] = []
    deadline = time.monotonic() + 240
    recovered = False
    while time.monotonic() < deadline:
        response = client.post(gw.v1 + "/chat/completions", json=body)
        statuses.append(response.status_code)
        if response.status_code != 200:
            error = response.json()["error"]
            assert response.status_code == 503, error
            assert response.headers.get("retry-after"), response.headers
        ready.append(client.get(gw.root + "/ready").status_code)
        if statuses[-1] == 200 and 503 in statuses:
            recovered = True
            break
        time.sleep(1.0)
    assert 503 in statuses, statuses  # the dead engine was noticed
    assert 500 not in statuses
    assert 503 in ready  # readiness followed the engine
    assert recovered, statuses[-10:]
    assert ready[-1] == 200 or client.get(gw.root + "/ready").status_code == 200
    serve.delete("enginekill")
    # The old engine's processes ended with their replica.
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie" for p in pids)


pytestmark = pytest.mark.integration
