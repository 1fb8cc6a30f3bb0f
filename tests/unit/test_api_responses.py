"""The Responses slice through the real pipeline without Ray (the harness of
test_api_generation: SQLite, scripted pools): the response and its event stream, the
stored chain (``previous_response_id`` re-renders it into the prompt; another tenant's
id is 404), GET / input_items / DELETE, and exactly one ledger record (endpoint
``responses``) on every exit path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.engine.protocol import EngineOverloaded
from app.state.protocol import StoreUnavailable
from tests.unit.test_api_generation import GUARDED, Script, call, make, settled

PATH = "/v1/responses"


def create(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", "max_output_tokens": 8, "stream": stream, **extra}


def _names(body: bytes) -> list[str]:
    return [line[7:] for line in body.decode().splitlines() if line.startswith("event: ")]


def _prompt(h: Any) -> list[dict[str, Any]]:
    """The chat messages the engine got for the latest request."""
    return [dict(m) for m in h.pools.streams[-1].request.prompt.messages]


async def test_a_response_answers_in_openais_shape_with_one_ledger_record(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(3, finish="stop")})
    r = await call(h, create(instructions="Be brief.", metadata={"k": "v"}), path=PATH)
    assert r.status == 200
    body = json.loads(r.body)
    assert (body["id"], body["object"], body["status"], body["model"]) == (
        "resp_rid0001", "response", "completed", "m")  # fmt: skip
    assert body["output"] == [{
        "id": "msg_rid0001", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "t1 t2 t3 ", "annotations": [],
                     "logprobs": []}]}]  # fmt: skip
    assert body["usage"] == {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 8,
    }  # fmt: skip
    echoed = (body["instructions"], body["metadata"], body["store"])
    assert echoed == ("Be brief.", {"k": "v"}, True)
    assert _prompt(h) == [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "hi"}]  # fmt: skip
    (record,) = await settled(h)
    assert (record.endpoint, record.status, record.completion_tokens) == ("responses", "ok", 3)
    assert record.session_id == "resp_rid0001"  # a stored chain is one session


async def test_a_length_stop_is_an_incomplete_response(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    body = json.loads((await call(h, create(), path=PATH)).body)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_a_budget_cut_is_incomplete_with_its_own_reason(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3)}, daily_tokens=40)  # under prompt + 64
    r = await call(h, create(max_output_tokens=64), path=PATH)
    body = json.loads(r.body)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens",
                                          "stop_reason": "budget_exhausted"}
    (record,) = await settled(h)
    assert (record.status, record.completion_tokens) == ("ok", 3)


async def test_the_chain_continues_from_the_store(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(2, finish="stop")})
    await call(h, create(instructions="Be brief."), path=PATH, rid="r1")
    second = create(input=[{"role": "user", "content": [{"type": "input_text", "text": "more"}]}],
                    previous_response_id="resp_r1")  # fmt: skip
    r = await call(h, second, path=PATH, rid="r2")
    assert r.status == 200 and json.loads(r.body)["previous_response_id"] == "resp_r1"
    # the instructions are not carried over; the earlier turn and its answer are
    assert _prompt(h) == [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "t1 t2 "},
                          {"role": "user", "content": "more"}]  # fmt: skip
    records = {x.request_id: x for x in await settled(h)}
    assert {x.session_id for x in records.values()} == {"resp_r1"}
    # the whole chain counts against the request limits (here 4 messages)
    third = await call(h, create(previous_response_id="resp_r2"), path=PATH, rid="r3")
    assert third.status == 400
    assert json.loads(third.body)["error"]["param"] == "input"
    # an id the tenant has not stored is 404, and no record
    missing = await call(h, create(previous_response_id="resp_nope"), path=PATH, rid="r4")
    assert missing.status == 404
    assert json.loads(missing.body)["error"] == {
        "message": "Previous response with id 'resp_nope' not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}  # fmt: skip
    assert len(await settled(h)) == 2


async def test_a_function_call_round_trip_renders_as_chat_tool_messages(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(2, finish="stop")})
    city = {"city": {"type": "string"}}
    tool = {"type": "function", "name": "weather",
            "parameters": {"type": "object", "properties": city}}  # fmt: skip
    items = [
        {"role": "user", "content": "weather in Oslo?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Oslo"}', "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
    ]  # fmt: skip
    r = await call(h, create(input=items, tools=[tool], tool_choice="auto"), path=PATH)
    assert r.status == 200
    assert _prompt(h)[1:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "rain", "tool_call_id": "call_1"},
    ]  # fmt: skip
    assert json.loads(r.body)["tools"] == [tool]


async def test_a_streamed_response_is_the_responses_event_sequence(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3, finish="stop")})
    r = await call(h, create(stream=True), path=PATH)
    assert r.status == 200
    assert _names(r.body) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 3,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in r.events] == list(range(len(r.events)))
    text = "".join(e["delta"] for e in r.events if e["type"] == "response.output_text.delta")
    assert text == "t1 t2 t3 "
    done = r.events[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == 3
    assert done["output"][0]["content"][0]["text"] == "t1 t2 t3 "
    # what was streamed is what was stored
    got = await call(h, {}, path=f"{PATH}/resp_rid0001", method="GET")
    assert json.loads(got.body) == done
    (record,) = await settled(h)
    assert (record.endpoint, record.status) == ("responses", "ok")


async def test_stored_responses_are_read_listed_and_deleted(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(2, finish="stop")})
    items = [{"role": "developer", "content": "Terse."}, {"role": "user", "content": "hi"}]
    await call(h, create(input=items), path=PATH)
    listed = json.loads((await call(h, {}, path=f"{PATH}/resp_rid0001/input_items",
                                    method="GET")).body)  # fmt: skip
    assert [i["id"] for i in listed["data"]] == ["resp_rid0001_in1", "resp_rid0001_in0"]
    assert listed["data"][1]["content"] == [{"type": "input_text", "text": "Terse."}]
    assert (listed["first_id"], listed["has_more"]) == ("resp_rid0001_in1", False)
    page = json.loads((await call(h, {}, path=f"{PATH}/resp_rid0001/input_items?order=asc"
                                  "&limit=1", method="GET")).body)  # fmt: skip
    assert ([i["id"] for i in page["data"]], page["has_more"]) == (["resp_rid0001_in0"], True)
    gone = await call(h, {}, path=f"{PATH}/resp_rid0001", method="DELETE")
    assert json.loads(gone.body) == {"id": "resp_rid0001", "object": "response", "deleted": True}
    for method in ("GET", "DELETE"):
        again = await call(h, {}, path=f"{PATH}/resp_rid0001", method=method)
        assert again.status == 404
        assert json.loads(again.body)["error"]["code"] == "response_not_found"


async def test_store_false_keeps_nothing_and_an_oversized_response_says_so(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(2, finish="stop")}, max_stored=1024)
    r = await call(h, create(store=False), path=PATH, rid="r1")
    assert json.loads(r.body)["store"] is False
    big = await call(h, create(instructions="x" * 600, input="y" * 300), path=PATH, rid="r2")
    assert json.loads(big.body)["store"] is False  # served, not stored: over max_bytes
    for rid in ("r1", "r2"):
        assert (await call(h, {}, path=f"{PATH}/resp_{rid}", method="GET")).status == 404
    records = await settled(h)
    assert [x.status for x in records] == ["ok", "ok"]
    assert records[0].session_id is None  # an unstored response starts no session


async def test_a_store_outage_fails_the_chain_read_and_leaves_the_answer_unstored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of a chain fails before admission (503, nothing admitted, no record);
    a write that fails leaves the answer served and billed, with ``store: false``."""
    h = await make(tmp_path, {"a": Script(2, finish="stop")})
    await call(h, create(), path=PATH, rid="r1")

    async def down(*args: Any) -> None:
        raise StoreUnavailable("down")

    monkeypatch.setattr(h.gatekeeper.store, "get_response", down)
    monkeypatch.setattr(h.gatekeeper.store, "put_response", down)
    chained = await call(h, create(previous_response_id="resp_r1"), path=PATH, rid="r2")
    assert chained.status == 503
    served = await call(h, create(), path=PATH, rid="r3")
    assert served.status == 200 and json.loads(served.body)["store"] is False
    assert [(x.request_id, x.status) for x in await settled(h)] == [("r1", "ok"), ("r3", "ok")]


ROWS: list[tuple[str, dict[str, Script], dict[str, Any], str | None, int, Any]] = [
    # name, pools, body, leave, status, records
    ("engine-full", {"a": Script(fail_before=EngineOverloaded("full"))}, create(),
     None, 503, [("rejected_by_engine", 503)]),
    ("engine-dies-mid-stream", {"a": Script(5, fail_after=2)}, create(stream=True),
     None, 200, [("error", 500)]),
    ("client-leaves-mid-stream", {"a": Script(50, gap_s=0.01)}, create(stream=True),
     "mid_stream", 200, [("client_closed", 499)]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "scripts", "body", "leave", "status", "records"),
                         ROWS, ids=[r[0] for r in ROWS])  # fmt: skip
async def test_every_exit_path_ends_in_one_record_and_stores_nothing(
    tmp_path: Path, name: str, scripts: dict[str, Script], body: dict[str, Any],
    leave: str | None, status: int, records: list[tuple[str, int]],
) -> None:  # fmt: skip
    h = await make(tmp_path, scripts)
    r = await call(h, body, leave=leave, path=PATH)
    assert r.status == status
    if name == "engine-dies-mid-stream":
        failed = r.events[-1]
        assert failed["type"] == "response.failed"
        assert failed["response"]["status"] == "failed" and failed["response"]["error"]["message"]
    got = [(x.status, x.http_status) for x in await settled(h)]
    assert got == records
    assert (await call(h, {}, path=f"{PATH}/resp_rid0001", method="GET")).status == 404


BAD: list[tuple[str, dict[str, Any], str]] = [
    # name, body, what the message must name
    ("no-input", {"model": "m"}, "input"),
    ("empty-input", create(input=[]), "at least one item"),
    ("unknown-field", create(frequency_penalty=1), "frequency_penalty"),
    ("built-in-tool", create(tools=[{"type": "web_search"}]), "built-in tool"),
    ("image-part", create(input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://x/y.png"}]}]), "read text only"),
    ("reasoning-item", create(input=[{"type": "reasoning", "summary": []}]), "reasoning"),
    ("item-reference", create(input=[{"type": "item_reference", "id": "x"}]),
     "previous_response_id"),
    ("background", create(background=True), "background"),
    ("truncation-auto", create(truncation="auto"), "truncat"),
    ("include", create(include=["message.output_text.logprobs"]), "logprobs"),
    ("reasoning-effort", create(reasoning={"effort": "high"}), "reasoning"),
    ("tool-choice-of-no-tool", create(tools=[{"type": "function", "name": "f"}],
                                      tool_choice={"type": "function", "name": "g"}), "'g'"),
    ("json-schema-without-schema", create(text={"format": {"type": "json_schema", "name": "x"}}),
     "schema"),
    ("too-many-messages", create(input=[{"role": "user", "content": "a"}] * 5), "At most 4"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "named"), BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_a_400_naming_it_and_no_record(
    tmp_path: Path, name: str, body: dict[str, Any], named: str
) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    r = await call(h, body, path=PATH)
    assert r.status == 400
    error = json.loads(r.body)["error"]
    assert named in error["message"] and error["type"] == "invalid_request_error"
    assert await settled(h) == []


async def test_x_session_id_wins_over_the_chains_session(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(2, finish="stop")})
    headers = [*GUARDED, (b"x-session-id", b"agent-7")]
    await call(h, create(), path=PATH, headers=headers)
    (record,) = await settled(h)
    assert record.session_id == "agent-7"
