"""A throw-away Prometheus server (Debian's ``prometheus`` package, installed by
``make services``) on a free loopback port, scraping the targets it is given: for the
test that evaluates every dashboard panel (tests/integration/test_prometheus.py) and
for the dashboard snapshot (benchmarks/dashboard_snapshot.py). Never a fake: the real
server, queried through its HTTP API."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.local_redis import free_port, stop_process

START_TIMEOUT_S = 30.0


class PrometheusUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    """One scrape job: ``address`` is ``host:port``; ``bearer`` is sent as
    ``Authorization: Bearer`` (Switchyard's admin token for the tenant families);
    ``interval_s``: this job's scrape interval and timeout, when not the global one (a
    scrape may take no longer than its interval: Ray's metrics export, with every
    replica's series on a loaded node, can take longer than a second to answer)."""

    job: str
    address: str
    path: str = "/metrics"
    bearer: str | None = None
    interval_s: float | None = None


def scrape_config(targets: list[Target], interval_s: float, token_dir: Path) -> dict[str, Any]:
    """A ``prometheus.yml`` scraping ``targets`` every ``interval_s``; tokens go to files
    in ``token_dir`` (the way a cluster mounts a secret), never into the config."""
    jobs: list[dict[str, Any]] = []
    for t in targets:
        job: dict[str, Any] = {
            "job_name": t.job,
            "metrics_path": t.path,
            "static_configs": [{"targets": [t.address]}],
        }
        if t.interval_s is not None:
            every = f"{int(t.interval_s * 1000)}ms"
            job["scrape_interval"] = job["scrape_timeout"] = every
        if t.bearer is not None:
            token = token_dir / f"{t.job}.token"
            token.write_text(t.bearer)
            token.chmod(0o600)
            job["authorization"] = {"type": "Bearer", "credentials_file": str(token)}
        jobs.append(job)
    interval = f"{int(interval_s * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }


@dataclass
class Prometheus:
    url: str
    workdir: Path
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (``ValueError`` when Prometheus refuses it)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        body = self.client.get(self.url + "/api/v1/query", params=params).json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Any]:
        params = {"query": expr, "start": start, "end": end, "step": step_s}
        body = self.client.get(self.url + "/api/v1/query_range", params=params).json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[Any] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active targets with their last scrape's health and error."""
        body = self.client.get(self.url + "/api/v1/targets").json()
        active: list[dict[str, Any]] = body["data"]["activeTargets"]
        return active

    def wait_scraped(self, jobs: set[str], deadline_s: float = 60.0) -> None:
        """Until every job's target was scraped successfully at least once."""
        end = time.monotonic() + deadline_s
        while True:
            up = {t["labels"]["job"] for t in self.targets() if t["health"] == "up"}
            if jobs <= up:
                return
            if time.monotonic() > end:
                states = [(t["labels"]["job"], t["health"], t["lastError"]) for t in self.targets()]
                raise TimeoutError(f"targets not up after {deadline_s:g} s: {states}")
            time.sleep(0.5)


@contextlib.contextmanager
def prometheus_server(
    workdir: Path, targets: list[Target], interval_s: float = 1.0
) -> Iterator[Prometheus]:
    """Start ``prometheus`` scraping ``targets`` (data and log in ``workdir``); stop it on
    exit. ``PrometheusUnavailable`` when it is not installed or does not start."""
    exe = shutil.which("prometheus")
    if exe is None:
        raise PrometheusUnavailable("prometheus is not installed: run `make services` first")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(targets, interval_s, workdir)))
    port = free_port()
    args = [exe, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    with (workdir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise PrometheusUnavailable(
                    f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise PrometheusUnavailable(f"prometheus not ready in {START_TIMEOUT_S:g} s")
            time.sleep(0.2)
        server = Prometheus(url, workdir)
        try:
            yield server
        finally:
            server.client.close()
    finally:
        stop_process(proc)
