"""SIGTERM to `switchyard serve` (what `make run` runs) during streams: every stream
finishes, every request has its record with the tokens it got, the process exits 0.
It starts its own Ray cluster (`--address local`), apart from the session's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from benchmarks.local_redis import free_port
from tests.integration.streams import read_stream, slow_sim, sqlite_records

pytestmark = pytest.mark.integration


def test_sigterm_drains_streams_and_loses_no_record(tmp_path: Path) -> None:
    port = free_port()
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "sig",
                "route_prefix": "/",
                "import_path": "app.builders:build_app",
                "args": {
                    "gateway": {"anonymous_tenant": "sig-t"},
                    "graceful_shutdown_timeout_s": 20,
                    "models": [slow_sim("sig-slow")],
                },
            }
        ],
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    state = tmp_path / "state.db"
    env = {
        **os.environ,
        "SWITCHYARD_STATE_URL": f"sqlite:///{state}",
        "SWITCHYARD_DATA_DIR": str(tmp_path / "data"),
    }
    env.pop("RAY_ADDRESS", None)
    exe = Path(sys.executable).with_name("switchyard")
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(exe), "serve", str(tmp_path / "serve.yaml"), "--address", "local"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(root + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "switchyard serve did not become ready"
            time.sleep(0.5)
        results: list[dict[str, Any]] = []
        body = {
            "model": "sig-slow",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 60,
            "stream": True,
            "ignore_eos": True,
        }
        url = root + "/v1/chat/completions"
        args = (url, body, results)
        threads = [threading.Thread(target=read_stream, args=args) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every stream has produced tokens
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=120)
        assert proc.wait(timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert results == [{"chunks": 60, "done": True, "error": None, "status": 200}] * 4
    got = sqlite_records(f"sqlite:///{state}", "sig-t")
    assert sorted((r.status, r.completion_tokens) for r in got) == [("ok", 60)] * 4
