"""benchmarks.fuzz_openapi: the document rewrites (model ids pinned, work capped, the
narrowed document of mode ``served``) on the real published /openapi.json, and the
response judging (5xx, error shape, streams, documented statuses) and report on
hand-made responses. No server, no schemathesis run."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from app.api.openapi import openapi_document
from app.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from benchmarks.fuzz_openapi import (
    REFUSED,
    Result,
    _cap,
    documented_statuses,
    error_code,
    error_shape_problem,
    is_server_error,
    judge,
    narrow,
    pin,
    problem_kind,
    report,
    request_body_schemas,
    sse_events,
    sse_problems,
    sse_schema,
    tally,
)

IDS = ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
CHAT = "POST /v1/chat/completions"
ERROR = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}


@pytest.fixture(scope="module")
def published() -> dict[str, Any]:
    return openapi_document()


@pytest.fixture(scope="module")
def pinned(published: dict[str, Any]) -> dict[str, Any]:
    return pin(published, IDS, max_tokens=8, max_n=4)


def _validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_the_request_bodies_are_found(published: dict[str, Any]) -> None:
    assert request_body_schemas(published) == {
        CHAT: "ChatCompletionRequest",
        "POST /v1/completions": "CompletionRequest",
        "POST /v1/embeddings": "EmbeddingRequest",
        "POST /v1/messages": "MessagesRequest",
        "POST /v1/messages/count_tokens": "CountTokensRequest",
        "POST /v1/responses": "ResponsesRequest",
    }


def test_pin_sets_the_served_ids_on_every_body(pinned: dict[str, Any]) -> None:
    for name in ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest"):
        model = pinned["components"]["schemas"][name]["properties"]["model"]
        assert model == {"type": "string", "enum": sorted(IDS)}


def test_pin_caps_the_work_a_request_asks_for(pinned: dict[str, Any]) -> None:
    chat = pinned["components"]["schemas"]["ChatCompletionRequest"]
    props = chat["properties"]
    assert "max_tokens" in chat["required"]
    assert props["max_tokens"]["type"] == "integer"  # no null branch: always bounded
    assert (props["max_tokens"]["minimum"], props["max_tokens"]["maximum"]) == (1, 8)
    assert "default" not in props["max_tokens"]
    mct = props["max_completion_tokens"]["anyOf"]
    assert {"type": "null"} in mct and next(b for b in mct if b.get("type") == "integer")[
        "maximum"
    ] == 8
    assert props["min_tokens"]["maximum"] == 8
    assert props["n"]["maximum"] == 4
    best_of = pinned["components"]["schemas"]["CompletionRequest"]["properties"]["best_of"]
    assert next(b for b in best_of["anyOf"] if b.get("type") == "integer")["maximum"] == 4
    check = _validator(pinned, "ChatCompletionRequest")
    body = {"model": IDS[0], "messages": [{"role": "user", "content": "hi"}]}
    assert not check.is_valid(body)  # max_tokens is required now
    assert check.is_valid({**body, "max_tokens": 8})
    assert not check.is_valid({**body, "max_tokens": 9})
    assert not check.is_valid({**body, "max_tokens": 8, "model": "gpt-4o"})


def test_pin_drops_the_security_requirements_and_leaves_the_original(
    published: dict[str, Any], pinned: dict[str, Any]
) -> None:
    assert all("security" not in op for item in pinned["paths"].values() for op in item.values())
    assert "security" in published["paths"]["/v1/chat/completions"]["post"]
    assert (
        "enum" not in published["components"]["schemas"]["EmbeddingRequest"]["properties"]["model"]
    )
    assert documented_statuses(pinned) == documented_statuses(published)


def test_pin_needs_ids(published: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        pin(published, [])


def test_cap_of_plain_and_nullable_integers() -> None:
    plain = {"type": "integer", "minimum": 1, "maximum": 128, "default": 1}
    assert _cap(plain, 4) == {"type": "integer", "minimum": 1, "maximum": 4, "default": 1}
    nullable = {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "null"}], "default": None}
    assert _cap(nullable, 4) == {
        "anyOf": [{"type": "integer", "minimum": 4, "maximum": 4}, {"type": "null"}],
        "default": None,
    }
    assert _cap(nullable, 4, nullable=False) == {"type": "integer", "minimum": 4, "maximum": 4}


def test_narrow_removes_what_the_served_models_refuse(pinned: dict[str, Any]) -> None:
    narrowed = narrow(pinned)
    schemas = narrowed["components"]["schemas"]
    for name, props in REFUSED.items():
        assert not set(props) & set(schemas[name]["properties"])
        assert set(props) <= set(pinned["components"]["schemas"][name]["properties"])
    message = schemas["ChatMessage"]["properties"]
    assert "tool" not in message["role"]["enum"]
    parts = next(b for b in message["content"]["anyOf"] if b.get("type") == "array")["items"]
    assert "MediaPart" not in json.dumps(parts)
    assert "MediaPart" in json.dumps(pinned["components"]["schemas"]["ChatMessage"])
    chat, completion, embedding = (
        _validator(narrowed, n)
        for n in ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest")
    )
    body = {"model": IDS[0], "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    assert chat.is_valid(body)
    assert not chat.is_valid({**body, "functions": [{"name": "f"}]})
    assert not chat.is_valid({**body, "stop": ""})
    assert not chat.is_valid({**body, "logit_bias": {"abc": 1}})
    assert chat.is_valid({**body, "logit_bias": {"42": -100}})
    image = {"type": "image_url", "image_url": {"url": "x"}}
    assert not chat.is_valid({**body, "messages": [{"role": "user", "content": [image]}]})
    prompt = {"model": IDS[0], "max_tokens": 4}
    assert not completion.is_valid({**prompt, "prompt": ["a", "b"]})
    assert not completion.is_valid({**prompt, "prompt": []})
    assert completion.is_valid({**prompt, "prompt": [1, 2, 3]})
    assert not embedding.is_valid({"model": IDS[1], "input": []})


def test_what_narrow_allows_the_server_accepts(pinned: dict[str, Any]) -> None:
    """Bodies valid in the narrowed document that the gateway's own models accept: the
    narrowing does not itself make requests the server refuses."""
    narrowed = narrow(pinned)
    bodies: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
        "ChatCompletionRequest": (ChatCompletionRequest, {"model": IDS[0], "max_tokens": 2,
            "messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "logit_bias": {"42": 1.5}, "stop": ["x"], "n": 2}),
        "CompletionRequest": (CompletionRequest, {"model": IDS[0], "max_tokens": 2,
                                                  "prompt": ["one prompt"]}),
        "EmbeddingRequest": (EmbeddingRequest, {"model": IDS[1], "input": ["a", "b"]}),
    }  # fmt: skip
    for name, (model, body) in bodies.items():
        assert _validator(narrowed, name).is_valid(body), name
        model.model_validate(body)


def test_error_shape() -> None:
    assert error_shape_problem(ERROR) is None
    assert error_shape_problem({"error": {"message": "m", "type": "t", "param": "p",
                                          "code": "c"}}) is None  # fmt: skip
    assert error_shape_problem({"detail": "x"}) == "error body is not {'error': {...}}"
    assert error_shape_problem({"error": {"message": "m", "type": "t"}}) == (
        "error body lacks param, code"
    )
    assert error_shape_problem({"error": {**ERROR["error"], "message": 3}}) == (
        "error.message is not a string"
    )
    assert error_shape_problem({"error": {**ERROR["error"], "code": 400}}) == (
        "error.code is neither a string nor null"
    )
    assert error_shape_problem([ERROR]) is not None


def test_sse_events() -> None:
    text = 'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n'
    assert sse_events(text) == (['{"a": 1}', '{"b": 2}'], True)
    assert sse_events('data: {"a": 1}\n\n') == (['{"a": 1}'], False)
    assert sse_events("") == ([], False)


def _chunk(content: str = "x") -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": IDS[0],
            "choices": [choice]}  # fmt: skip


def _events(*events: Any, done: bool = True) -> str:
    out = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
    return out + ("data: [DONE]\n\n" if done else "")


def test_sse_problems_against_the_published_event_schema(published: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(sse_schema(published, CHAT))

    def validate(event: Any) -> str | None:
        err = next(iter(validator.iter_errors(event)), None)
        return None if err is None else err.message

    assert sse_problems(_events(_chunk(), _chunk("y")), validate) == []
    assert sse_problems(_events(_chunk(), done=False), validate) == [
        "stream does not end with data: [DONE]"
    ]
    server = {"error": {"message": "boom", "type": "server_error", "param": None,
                        "code": "internal_error"}}  # fmt: skip
    (problem,) = sse_problems(_events(_chunk(), server), validate)
    assert problem.startswith("stream error event #1 (server_error") and is_server_error(problem)
    assert sse_problems(_events(_chunk(), ERROR), validate) == []  # a 4xx-class event is fine
    (problem,) = sse_problems(_events("not json"), validate)
    assert problem.startswith("stream event #0 is not JSON")
    (problem,) = sse_problems(_events({"id": 1}), validate)
    assert problem.startswith("stream event #0 violates the schema")


def test_judge() -> None:
    documented = {200, 400, 500}
    assert judge(200, "application/json", json.dumps({"ok": 1}), documented) == []
    assert judge(400, "application/json", json.dumps(ERROR), documented) == []
    problems = judge(500, "application/json; charset=utf-8", json.dumps(ERROR), documented)
    assert problems == ["500: server error"] and is_server_error(problems[0])
    assert judge(404, "application/json", json.dumps(ERROR), documented) == [
        "404 is not a documented status of the operation"
    ]
    assert judge(400, "text/html", "<html>Bad request</html>", documented) == [
        "400 with content type 'text/html', not the JSON error shape"
    ]
    assert judge(400, "application/json", "{", documented) == ["400: error body is not JSON"]
    assert judge(400, "application/json", '{"detail": []}', documented) == [
        "400: error body is not {'error': {...}}"
    ]
    stream = _events(_chunk())
    assert judge(200, "text/event-stream", stream, documented, lambda e: None) == []
    assert judge(200, "text/event-stream", stream[:-14], documented, lambda e: None) == [
        "stream does not end with data: [DONE]"
    ]
    assert not is_server_error("400: error body is not JSON")
    assert not is_server_error("schemathesis: Response violates schema: 'server_error' …")
    assert is_server_error("no response: ReadTimeout: timed out")


def _result(
    op: str, mode: str, status: int | None, problems: list[str], code: str | None = None
) -> dict[str, Any]:
    return {"operation": op, "mode": mode, "status": status, "elapsed_s": 0.1,
            "problems": problems, "request": {"method": "POST", "url": "u", "body": {}},
            "response": "", "request_id": "r1", "code": code}  # fmt: skip


def test_tally_and_report() -> None:
    results = [
        _result(CHAT, "served", 200, []),
        _result(CHAT, "served", 200, []),
        _result(CHAT, "served", 500, ["500: server error"]),
        _result(CHAT, "negative", 400, [], "invalid_value"),
        _result("GET /health", "positive", None, ["no response: ReadTimeout: x"]),
        _result(CHAT, "positive", 200, ["schemathesis: Response violates schema: `x`"]),
    ]
    summary = tally(results)
    assert summary["cases"] == 6
    assert summary["server_errors"] == 2
    assert summary["cases_with_problems"] == 3
    assert summary["by_operation"][CHAT]["served"] == {"200": 2, "500": 1}
    assert summary["by_operation"]["GET /health"]["positive"] == {"none": 1}
    assert summary["error_codes"] == {CHAT: {"500 None": 1, "400 invalid_value": 1}}
    assert summary["problem_kinds"] == {
        "500: server error": 1,
        "no response: ReadTimeout": 1,
        "schemathesis: Response violates schema": 1,
    }
    kind = problem_kind("stream event #3 violates the schema: x")
    assert kind == "stream event violates the schema"
    doc = {"argv": "--cases 3", "date": "2026-12-06", "base_url": "http://127.0.0.1:8000",
           "server": "make run", "models": IDS, "modes": ["served", "positive", "negative"],
           "cases_per_operation": 3, "seed": 31, "max_tokens": 8, "max_n": 4,
           "api_key": False, "wall_s": 12.0, "image": "x.png", "summary": summary,
           "results": results,
           "environment": {"versions": {"schemathesis": "4", "hypothesis": "6"}}}  # fmt: skip
    text = report(doc)
    assert "**2 case(s) with a 5xx**" in text
    assert f"| `{CHAT}` | served | 3 | 2 |" in text
    assert "request id `r1`" in text
    assert f"| `{CHAT}` | 500 None: 1, 400 invalid_value: 1 |" in text
    assert ".venv/bin/python -m benchmarks.fuzz_openapi --cases 3" in text
    summary_ok = tally([_result(CHAT, "served", 200, [])])
    assert "**0 5xx**" in report({**doc, "summary": summary_ok, "results": []})


def test_a_case_keeps_its_request_and_response_only_with_a_problem() -> None:
    body = json.dumps(ERROR | {"error": {**ERROR["error"], "code": "invalid_value"}})
    quiet = Result(CHAT, "served", 400, 0.01, [], {"body": {}}, body, "r").to_json()
    assert quiet["code"] == "invalid_value" and "request" not in quiet
    loud = Result(CHAT, "served", 500, 0.01, ["500: server error"], {"body": {}}, "x").to_json()
    assert loud["request"] == {"body": {}} and loud["response"] == "x" and loud["code"] is None
    assert error_code('{"error": {"code": 3}}') is None and error_code("<html>") is None
