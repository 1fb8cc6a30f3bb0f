"""SIGTERM to `switchyard serve` (what `make run` runs) during streams: every stream
finishes, every request has its record with the tokens it got, the process exits 0.
It starts its own Ray cluster (`--address local`), apart from the session's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.state.protocol import LedgerQuery
from app.state.sqlite_store import SqliteStore

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stream(url: str, out: list[dict[str, Any]]) -> None:
    body = {
        "model": "sig-slow",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 60,
        "stream": True,
        "ignore_eos": True,
    }
    got: dict[str, Any] = {"chunks": 0, "done": False, "error": None}
    try:
        with httpx.stream("POST", url, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    got["done"] = True
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        got["error"] = event["error"]["code"]
                    elif event.get("choices") and event["choices"][0]["delta"].get("content"):
                        got["chunks"] += 1
    except httpx.HTTPError as exc:
        got["error"] = f"transport:{type(exc).__name__}"
    out.append(got)


def test_sigterm_drains_streams_and_loses_no_record(tmp_path: Path) -> None:
    port = _free_port()
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
                    "models": [
                        {
                            "id": "sig-slow",
                            "engine": "simulated",
                            "simulation": {"decode_base_s": 0.05, "prefill_s_per_token": 0.0001},
                        }
                    ],
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
        threads = [
            threading.Thread(target=_stream, args=(root + "/v1/chat/completions", results))
            for _ in range(4)
        ]
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
    assert results == [{"chunks": 60, "done": True, "error": None}] * 4

    async def records() -> list[Any]:
        store = SqliteStore(state)
        try:
            return await store.query_ledger(LedgerQuery(tenant="sig-t"))
        finally:
            await store.close()

    got = asyncio.run(records())
    assert sorted((r.status, r.completion_tokens) for r in got) == [("ok", 60)] * 4
