"""Integration fixtures: one local Ray cluster and one Serve instance per test session;
applications are deployed once per session under their own route prefix."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
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

pytestmark = pytest.mark.integration


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
    ray.init(address="local", include_dashboard=False, num_cpus=4, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


Deploy = Callable[..., Gateway]


@pytest.fixture(scope="session")
def deploy(serve_port: int, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Deploy:
    """Deploy an application under ``/<name>`` with its own state store (SQLite unless
    ``state_url`` is given) and the admin API on; returns it with a fresh API key."""

    def _deploy(
        name: str, args: dict[str, Any], state_url: str | None = None, **more_settings: Any
    ) -> Gateway:
        started = time.monotonic()
        url = state_url or f"sqlite:///{tmp_path_factory.mktemp(name) / 'state.db'}"
        update = {"state_url": url, "admin_token": SecretStr(ADMIN_TOKEN), **more_settings}
        own = settings.model_copy(update=update)
        serve.run(
            build_application(AppArgs.model_validate(args), own),
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
                {"id": "sim-chat", "engine": "simulated", "simulation": SIM_FAST},
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
            "gateway": {"anonymous_tenant": "anonymous"},
        },
    )


@pytest.fixture(scope="session")
def tiny_gateway(deploy: Deploy, tiny_model_dir: Path) -> Gateway:
    """The real vLLM CPU engine on a random-weight tiny Llama."""
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
                }
            ],
            "gateway": {"anonymous_tenant": "anonymous"},
        },
    )
