"""Integration fixtures: one local Ray cluster and one Serve instance per test session;
applications are deployed once per session under their own route prefix.

The Ray cluster with every application deployed on it, and vLLM's own server, are
stopped right after the last integration test when other tests follow (``make test``
runs the unit tests after these): they held ~14 GB of the machine's 24 through the
unit tests otherwise."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from pydantic import SecretStr
from ray import serve

from app.builders import build_application
from app.config import AppArgs
from app.settings import Settings
from tests.integration.upstreams import _Broken
from tests.s3_server import CREDENTIALS as S3_CREDENTIALS

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
_STOPS: list[Callable[[], None]] = []  # the session resources' stops, in start order


def _stop_once(stop: Callable[[], None]) -> Callable[[], None]:
    """``stop``, run at most once: by its fixture at the session's end, or earlier by
    ``pytest_runtest_teardown``."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            stop()

    _STOPS.append(once)
    return once


def _integration(item: pytest.Item) -> bool:
    return HERE in item.path.parents


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the last module's fixtures
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or _integration(nextitem):
        return
    items = item.session.items
    if any(_integration(i) for i in items[items.index(nextitem) :]):
        return
    for stop in reversed(_STOPS):
        stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ADMIN_TOKEN = "integration-admin-token"
TENANT = "acme"


@dataclass(frozen=True)
class Gateway:
    """A deployed Switchyard application reachable over HTTP."""

    name: str
    root: str  # http://127.0.0.1:PORT/PREFIX
    api_key: str  # a key of tenant ``TENANT`` without limits
    state_url: str

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        return httpx.request(method, self.root + "/admin" + path, headers=headers, **kwargs)

    def records(self, tenant: str, expected: int = 1, deadline_s: float = 10.0) -> list[Any]:
        """Ledger records of ``tenant`` once ``expected`` exist (settlement runs just after
        the response), or what there is at the deadline."""
        end = time.monotonic() + deadline_s
        while True:
            params = {"tenant": tenant, "group": "records"}
            got = list(self.admin("GET", "/usage", params=params, timeout=30).json()["data"])
            if len(got) >= expected or time.monotonic() > end:
                return got
            time.sleep(0.05)

    def new_key(self, tenant: str = TENANT, **fields: Any) -> str:
        """A fresh API key (through the admin API) with the given limits."""
        body: dict[str, Any] = {"tenant": tenant, "limits": {}}
        for name, value in fields.items():
            if name in ("team", "user", "name", "expires_at"):
                body[name] = value
            else:
                body["limits"][name] = value
        response = self.admin("POST", "/keys", json=body, timeout=30)
        assert response.status_code == 201, response.text
        return str(response.json()["key"])

    @property
    def v1(self) -> str:
        return self.root + "/v1"

    def server(self, model_id: str) -> Any:
        """Handle to the LLMServer deployment serving ``model_id`` (to read engine stats)."""
        from app.config import ModelSpec

        pool = ModelSpec(id=model_id, engine="simulated").pool
        return serve.get_deployment_handle(pool, app_name=self.name)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        text = httpx.get(self.root + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, value = line.rsplit(" ", 1)
            series, _, label_text = head.partition("{")
            if series != name:
                continue
            pairs = dict(p.split("=", 1) for p in label_text.rstrip("}").split(",") if "=" in p)
            if all(pairs.get(k) == f'"{v}"' for k, v in labels.items()):
                total += float(value)
        return total


@pytest.fixture(scope="session")
def serve_port() -> Iterator[int]:
    port = _free_port()
    # The Ray processes run in the mode `make run` uses. This driver imported Ray Serve
    # before the flag was set, so its own handles keep their default event-loop model
    # (the synchronous `.result()` calls the tests make need that).
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    os.environ["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] = "app.api.proxy_guard:middlewares"
    # as `switchyard serve` sets it: a stopping ingress replica stays reachable 2 s, not
    # Ray's 30 s (in this mode ingress replicas also serve HTTP directly, and every
    # ingress stop waited that long: each app deleted cost 30 s)
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "2"
    os.environ["SWITCHYARD_BODY_TIMEOUT_S"] = "5"  # the proxy guard's body deadline, short
    os.environ["SWITCHYARD_HEADER_TIMEOUT_S"] = "3"  # and its header deadline
    for key, value in S3_CREDENTIALS.items():  # dummy ones the local S3 server accepts
        os.environ.setdefault(key, value)
    ray.init(address="local", include_dashboard=False, num_cpus=4, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    def stop() -> None:
        serve.shutdown()
        ray.shutdown()

    stop_once = _stop_once(stop)
    yield port
    stop_once()


Deploy = Callable[..., Gateway]


@pytest.fixture(scope="session")
def deploy(serve_port: int, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Deploy:
    """Deploy an application under ``/<name>`` with its own state store (SQLite unless
    ``state_url`` is given) and the admin API on; returns it with a fresh API key."""

    def _deploy(
        name: str,
        args: dict[str, Any],
        state_url: str | None = None,
        before_run: Callable[[], None] | None = None,
        **more_settings: Any,
    ) -> Gateway:
        """``before_run`` is called between building the application and running it."""
        started = time.monotonic()
        url = state_url or f"sqlite:///{tmp_path_factory.mktemp(name) / 'state.db'}"
        update = {"state_url": url, "admin_token": SecretStr(ADMIN_TOKEN), **more_settings}
        own = settings.model_copy(update=update)
        app = build_application(AppArgs.model_validate(args), own)
        if before_run is not None:
            before_run()
        serve.run(
            app,
            name=name,
            route_prefix=f"/{name}",
        )
        print(f"deployed {name} in {time.monotonic() - started:.1f}s")
        root = f"http://127.0.0.1:{serve_port}/{name}"
        gateway = Gateway(name=name, root=root, api_key="", state_url=url)
        return replace(gateway, api_key=gateway.new_key())

    return _deploy


SIM_FAST = {"prefill_s_per_token": 0.0001, "decode_base_s": 0.002, "decode_s_per_seq": 0.0}


@pytest.fixture(scope="session")
def sim_gateway(deploy: Deploy) -> Gateway:
    """Simulated engines only: fast, for the API surface and error cases."""
    return deploy(
        "sim",
        {
            "models": [
                {
                    "id": "sim-chat",
                    "engine": "simulated",
                    "simulation": SIM_FAST,
                    "gpu_hourly_usd": GPU_HOURLY_USD,
                },
                {
                    "id": "sim-slow",
                    "engine": "simulated",
                    "simulation": {"decode_base_s": 0.05, "prefill_s_per_token": 0.002},
                },
                {
                    "id": "sim-one-slot",
                    "engine": "simulated",
                    "simulation": {
                        "max_batch_size": 1,
                        "max_waiting": 1,
                        "decode_base_s": 0.05,
                    },
                },
                {"id": "sim-embed", "engine": "simulated", "task": "embed"},
            ],
            "default_model": "sim-chat",
            "max_body_bytes": 64 * 1024,
            # three requests may wait per saturated model (the fair queue's tests)
            "gateway": {"anonymous_tenant": "anonymous", "fairness": {"max_waiting": 3}},
        },
    )


GPU_HOURLY_USD = 3.6  # an engine second costs $0.001 (GPU-time cost on the ledger)


@pytest.fixture(scope="session")
def tiny_gateway(deploy: Deploy, tiny_model_dir: Path, s3_endpoint: str) -> Gateway:
    """The real vLLM CPU engine on a random-weight tiny Llama (LoRA adapters on, from
    directories or the local S3 server)."""
    return deploy(
        "tiny",
        {
            "models": [
                {
                    "id": "tiny-llama",
                    "source": str(tiny_model_dir),
                    "max_model_len": 512,
                    "kv_cache_memory_bytes": 64 * 1024**2,
                    "max_num_seqs": 8,
                    "tool_parser": "hermes",
                    "lora": {"max_loras": 2, "max_cpu_loras": 2, "max_lora_rank": 8},
                    "gpu_hourly_usd": GPU_HOURLY_USD,
                }
            ],
            "gateway": {"anonymous_tenant": "anonymous"},
        },
        s3_endpoint_url=s3_endpoint,
    )


# ---- real OpenAI-compatible upstreams: vLLM's own server, and a broken one --------------

SERVED = "tiny-upstream"
MAX_MODEL_LEN = 2048
STARTUP_S = 240


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class _Upstream:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path


def _start_vllm_upstream(tiny_model_dir: Path, tmp: Path, low_priority: bool) -> _Upstream:
    port = _free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir),
        "--served-model-name", SERVED,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(64 * 1024**2),
        "--max-num-seqs", "4",
        "--enforce-eager",
        "--seed", "0",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp / "cache")}
    log_path = tmp / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=(lambda: os.nice(19)) if low_priority else None,
        )  # fmt: skip
    return _Upstream(proc, f"http://127.0.0.1:{port}", log_path)


@pytest.fixture(scope="session", autouse=True)
def _early_vllm_upstream(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Upstream | None]:
    """vLLM's OpenAI server takes minutes to start on this box: when a selected test
    needs it, it starts with the session at the lowest CPU priority, so it starts in the
    time other tests leave idle and is up when they ask for it (``vllm_url``)."""
    if not any("vllm_url" in getattr(i, "fixturenames", ()) for i in request.session.items):
        yield None
        return
    tiny = request.getfixturevalue("tiny_model_dir")
    upstream = _start_vllm_upstream(tiny, tmp_path_factory.mktemp("vllm-upstream"), True)

    def stop() -> None:
        upstream.proc.terminate()
        try:
            upstream.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(upstream.proc.pid, signal.SIGKILL)  # the group this fixture started
            upstream.proc.wait(timeout=10)

    stop_once = _stop_once(stop)
    try:
        yield upstream
    finally:
        stop_once()


@pytest.fixture(scope="session")
def vllm_url(_early_vllm_upstream: _Upstream | None) -> str:
    """vLLM's OpenAI server on a free port (started with the session); yields
    ``http://127.0.0.1:PORT`` once it is healthy."""
    upstream = _early_vllm_upstream
    assert upstream is not None  # started because this fixture is requested
    deadline = time.monotonic() + STARTUP_S
    while True:
        if upstream.proc.poll() is not None:
            pytest.fail(
                f"vLLM exited with {upstream.proc.returncode}:\n{_log_tail(upstream.log_path)}"
            )
        try:
            if httpx.get(upstream.url + "/health", timeout=2).status_code == 200:
                return upstream.url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM not healthy after {STARTUP_S} s:\n{_log_tail(upstream.log_path)}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def broken_url() -> Iterator[str]:
    """A deliberately broken OpenAI-compatible server (see ``tests.integration.upstreams``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Broken.release.set()
    server.shutdown()
    server.server_close()
    thread.join(10)
