"""Helpers of the exit-path integration tests: read one SSE stream to its end, and read
a ledger straight from its store (also after the application that wrote it is gone)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from app.state.protocol import LedgerQuery
from app.state.records import LedgerRecord
from app.state.sqlite_store import SqliteStore


def read_stream(url: str, body: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """POST a streaming request; append how it went to ``out``: HTTP status, content
    chunks seen, whether ``[DONE]`` came, and the error code of an error event (or
    ``transport:<error>`` when the connection broke)."""
    got: dict[str, Any] = {"chunks": 0, "done": False, "error": None, "status": None}
    try:
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            got["status"] = response.status_code
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    got["done"] = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        got["error"] = event["error"]["code"]
                    elif event.get("choices") and event["choices"][0]["delta"].get("content"):
                        got["chunks"] += 1
    except httpx.HTTPError as exc:
        got["error"] = f"transport:{type(exc).__name__}"
    out.append(got)


def sqlite_records(state_url: str, tenant: str) -> list[LedgerRecord]:
    """The ledger records of ``tenant`` in the SQLite store at ``state_url``."""

    async def read() -> list[LedgerRecord]:
        store = SqliteStore(Path(state_url.removeprefix("sqlite:///")))
        try:
            return await store.query_ledger(LedgerQuery(tenant=tenant))
        finally:
            await store.close()

    return asyncio.run(read())


def slow_sim(model_id: str, decode_base_s: float = 0.05) -> dict[str, Any]:
    """A simulated model whose streams take ``decode_base_s`` a token."""
    return {
        "id": model_id,
        "engine": "simulated",
        "simulation": {"decode_base_s": decode_base_s, "prefill_s_per_token": 0.0001},
    }
