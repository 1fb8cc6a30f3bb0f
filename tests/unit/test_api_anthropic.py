"""The Anthropic Messages slice through the real pipeline without Ray (the harness of
test_api_generation: SQLite, scripted pools): the message and its event stream in
Anthropic's shape, its errors in Anthropic's shape, and exactly one ledger record
(endpoint ``messages``) on every exit path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.engine.protocol import EngineOverloaded
from tests.unit.test_api_generation import Script, call, make, settled

PATH = "/v1/messages"


def messages(stream: bool = False, **extra: Any) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return {**body, "stream": stream, **extra}


def _names(body: bytes) -> list[str]:
    return [line[7:] for line in body.decode().splitlines() if line.startswith("event: ")]


async def test_a_message_answers_in_anthropics_shape_with_one_ledger_record(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    r = await call(h, messages(), path=PATH)
    assert r.status == 200
    body = json.loads(r.body)
    assert body == {
        "id": "msg_rid0001", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "t1 t2 t3 "}],
        "stop_reason": "max_tokens", "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }  # fmt: skip
    (record,) = await settled(h)
    assert (record.endpoint, record.status, record.completion_tokens) == ("messages", "ok", 3)


async def test_a_streamed_message_is_anthropics_event_sequence(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    r = await call(h, messages(stream=True), path=PATH)
    assert r.status == 200
    assert _names(r.body) == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    start, *_, delta, stop = r.events
    assert start["message"]["usage"]["input_tokens"] == 5
    assert start["message"]["content"] == [] and start["message"]["stop_reason"] is None
    text = "".join(e["delta"]["text"] for e in r.events if e["type"] == "content_block_delta")
    assert text == "t1 t2 t3 "
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3
    assert stop == {"type": "message_stop"}
    (record,) = await settled(h)
    assert (record.endpoint, record.status) == ("messages", "ok")


ROWS: list[tuple[str, dict[str, Script], dict[str, Any], str | None, int, str, Any]] = [
    # name, pools, body, leave, status, error type (or the record's status), records
    ("engine-full", {"a": Script(fail_before=EngineOverloaded("full"))}, messages(),
     None, 503, "overloaded_error", [("rejected_by_engine", 503)]),
    ("engine-dies-mid-stream", {"a": Script(5, fail_after=2)}, messages(stream=True),
     None, 200, "api_error", [("error", 500)]),
    ("client-leaves-mid-stream", {"a": Script(50, gap_s=0.01)}, messages(stream=True),
     "mid_stream", 200, "", [("client_closed", 499)]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "scripts", "body", "leave", "status", "error", "records"),
                         ROWS, ids=[r[0] for r in ROWS])  # fmt: skip
async def test_every_exit_path_ends_in_one_record(
    tmp_path: Path, name: str, scripts: dict[str, Script], body: dict[str, Any],
    leave: str | None, status: int, error: str, records: list[tuple[str, int]],
) -> None:  # fmt: skip
    h = await make(tmp_path, scripts)
    r = await call(h, body, leave=leave, path=PATH)
    assert r.status == status
    if error and body["stream"]:
        assert _names(r.body)[-1] == "error"
        assert r.events[-1]["type"] == "error" and r.events[-1]["error"]["type"] == error
    elif error:
        assert json.loads(r.body)["error"]["type"] == error
    got = [(x.status, x.http_status) for x in await settled(h)]
    assert got == records


BAD: list[tuple[str, dict[str, Any], str]] = [
    # name, body, what the message must name
    ("no-max-tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
     "max_tokens"),
    ("unknown-field", messages(frequency_penalty=1), "frequency_penalty"),
    ("image-block", messages(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]),
     "read text only"),
    ("server-tool", messages(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
     "server tool"),
    ("tool-choice-of-no-tool", messages(tools=[{"name": "f", "input_schema": {}}],
                                        tool_choice={"type": "tool", "name": "g"}), "'g'"),
    ("thinking", messages(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
    ("temperature-over-1", messages(temperature=1.5), "temperature"),
    ("empty-content", messages(messages=[{"role": "user", "content": []}]),
     "at least one content block"),
    ("assistant-prefill", messages(messages=[{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "Sure,"}]),
     "prefill"),
    ("tool-use-in-a-user-turn", messages(messages=[{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]), "assistant"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "named"), BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_a_400_in_anthropics_shape_and_no_record(
    tmp_path: Path, name: str, body: dict[str, Any], named: str
) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    r = await call(h, body, path=PATH)
    assert r.status == 400
    out = json.loads(r.body)
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert named in out["error"]["message"]
    assert await settled(h) == []


async def test_count_tokens_counts_the_rendered_prompt_and_bills_nothing(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    count = "/v1/messages/count_tokens"
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    tool = {"name": "weather", "input_schema": {"type": "object", "properties": {}}}
    r1 = await call(h, plain, path=count)
    r2 = await call(h, {**plain, "system": "Answer in one word, always."}, path=count)
    r3 = await call(h, {**plain, "tools": [tool]}, path=count)
    n1, n2, n3 = (json.loads(r.body)["input_tokens"] for r in (r1, r2, r3))
    assert 0 < n1 < n2 and n1 < n3  # the system prompt and the tools are counted
    missing = await call(h, {**plain, "model": "nope"}, path=count)
    assert missing.status == 404
    assert json.loads(missing.body)["error"]["type"] == "not_found_error"
    assert await settled(h) == []
