"""The pipeline (app/api/pipeline.py) on the scripted harness of test_api_generation:
cancels that reach a request while it is in dispatch (the client leaving, its
session's cancel) stop the running attempt where it runs and end the request once;
each stage's time is derived from the outcome's marks (one histogram, a bounded
``stage`` label)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.observability import catalog
from app.observability.metrics import STAGE_ENDS, stage_seconds
from app.request import Outcome
from app.state.protocol import SessionKey
from tests.unit.test_api_generation import TENANT, Harness, Script, call, chat, make, settled

SESSION = [(b"x-switchyard-proxy", b"1"), (b"content-type", b"application/json"),
           (b"x-session-id", b"s1")]  # fmt: skip


async def _dispatching(h: Harness) -> None:
    while not h.pools.streams:
        await asyncio.sleep(0.01)


async def test_a_session_cancel_in_dispatch_cancels_the_attempt_and_ends_it_once(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(3, first_s=30.0)})
    running = asyncio.create_task(call(h, chat(True), headers=SESSION))
    await _dispatching(h)
    assert h.flow.calls.cancel_session(SessionKey(TENANT, "s1")) == 1
    result = await asyncio.wait_for(running, 5)
    assert result.status == 409
    assert json.loads(result.body)["error"]["code"] == "session_cancelled"
    assert h.pools.streams[0].cancelled  # the engine's work stopped
    (record,) = await settled(h)
    assert (record.status, record.http_status, record.completion_tokens) == ("cancelled", 409, 0)


async def test_a_client_gone_in_dispatch_cancels_the_attempt(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3, first_s=30.0)})
    running = asyncio.create_task(call(h, chat(True)))
    await _dispatching(h)
    running.cancel()  # what Ray Serve does when the client disconnects
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert h.pools.streams[0].cancelled
    (record,) = await settled(h)
    assert (record.status, record.http_status) == ("client_closed", 499)


def _stage_counts(h: Harness) -> dict[tuple[str, str], float]:
    text = h.flow.metrics.render().decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "switchyard_stage_seconds"]  # fmt: skip
    return {
        (s.labels["endpoint"], s.labels["stage"]): s.value
        for s in family.samples
        if s.name.endswith("_count")
    }


@pytest.mark.parametrize(
    ("body", "stages"),
    [
        (chat(True), catalog.STAGES),  # every stage, respond included
        (chat(False), catalog.STAGES),
        ({**chat(True), "model": "nope"}, ("authenticate", "parse")),  # 404 in route
        ({"model": "m", "messages": "x"}, ("authenticate",)),  # 400 in parse
    ],
    ids=["stream", "json", "unknown-model", "bad-body"],
)
async def test_the_stages_a_request_passed_are_observed(
    tmp_path: Path, body: dict[str, object], stages: tuple[str, ...]
) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    await call(h, body)
    await settled(h)
    assert _stage_counts(h) == {("chat", s): 1.0 for s in stages}


@pytest.mark.parametrize(
    ("marks", "expected"),
    [
        ({}, []),
        ({"identified": 1.0}, [("authenticate", 1.0)]),
        (
            dict(zip(STAGE_ENDS, (1.0, 1.5, 2.0, 4.0, 7.0, 12.0), strict=True)),
            list(zip(catalog.STAGES, (1.0, 0.5, 0.5, 2.0, 3.0, 5.0), strict=True)),
        ),
        # a request refused in admission: its admit stage and what follows are left out
        ({"identified": 1.0, "parsed": 2.0, "routed": 3.0, "ended": 9.0},
         [("authenticate", 1.0), ("parse", 1.0), ("route", 1.0)]),
    ],
)  # fmt: skip
def test_stage_seconds_come_from_the_marks(
    marks: dict[str, float], expected: list[tuple[str, float]]
) -> None:
    o = Outcome("chat", started=0.0)
    o.marks.update(marks)
    assert stage_seconds(o) == expected
