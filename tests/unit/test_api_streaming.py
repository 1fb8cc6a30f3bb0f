"""SettledStream: its close hook runs whether or not the body generator ever ran."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from app.api.streaming import SettledStream


async def _drive(response: SettledStream, *, leave_at_start: bool) -> list[str]:
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"} if leave_at_start else {"type": "http.request"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if leave_at_start:
            raise OSError("client gone")

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    with contextlib.suppress(OSError, ClientDisconnect):
        await response(scope, receive, send)
    return sent


@pytest.mark.parametrize("leave_at_start", [True, False], ids=["client-left", "streamed"])
async def test_close_hook_runs_once_either_way(leave_at_start: bool) -> None:
    started: list[bool] = []
    closed: list[str] = []

    async def body() -> AsyncIterator[str]:
        started.append(True)
        yield "data: x\n\n"

    response = SettledStream(body(), on_close=lambda: closed.append("closed"))
    sent = await _drive(response, leave_at_start=leave_at_start)
    assert closed == ["closed"]
    assert started == ([] if leave_at_start else [True])
    assert sent[0] == "http.response.start"
