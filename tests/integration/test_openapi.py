"""GET /openapi.json through Ray Serve: real responses of every public endpoint
validate against the schema the server itself publishes for them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema

from tests.integration.conftest import Gateway


def _schema(doc: dict[str, Any], path: str, method: str, status: int, media: str) -> Any:
    schema = doc["paths"][path][method]["responses"][str(status)]["content"][media]["schema"]
    return {**schema, "components": doc["components"]}


def test_real_responses_validate_against_the_published_schema(sim_gateway: Gateway) -> None:
    gw = sim_gateway
    doc = httpx.get(f"{gw.root}/openapi.json", timeout=30).json()
    auth = {"Authorization": f"Bearer {gw.api_key}"}
    chat = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}  # fmt: skip
    cases: list[tuple[str, str, dict[str, Any] | None]] = [
        ("post", "/v1/chat/completions", chat),
        ("post", "/v1/chat/completions", {**chat, "model": "no-such-model"}),  # 404
        ("post", "/v1/chat/completions", {**chat, "audio": {"voice": "x"}}),  # 400
        ("post", "/v1/completions", {"model": "sim-chat", "prompt": "hi", "max_tokens": 3}),
        ("post", "/v1/embeddings", {"model": "sim-embed", "input": ["a", "b"]}),
        ("get", "/v1/models", None),
        ("get", "/v1/sessions/{session_id}", None),  # 404: no such session yet
    ]
    statuses = []
    with httpx.Client(timeout=60, headers=auth) as client:
        for method, path, body in cases:
            url = f"{gw.v1}{path[3:]}".replace("{session_id}", "openapi-run")
            r = client.request(method.upper(), url, json=body)
            statuses.append(r.status_code)
            jsonschema.validate(r.json(), _schema(doc, path, method, r.status_code,
                                                  "application/json"))  # fmt: skip
        stream = client.post(f"{gw.v1}/chat/completions",
                             json={**chat, "stream": True,
                                   "stream_options": {"include_usage": True}})  # fmt: skip
        chunks = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        session = {"x-session-id": "openapi-run"}
        client.post(f"{gw.v1}/chat/completions", json=chat, headers=session)
        for method, path in (("get", "/v1/sessions/{session_id}"),
                             ("post", "/v1/sessions/{session_id}/cancel")):  # fmt: skip
            r = client.request(method.upper(), f"{gw.v1}/sessions/openapi-run{path[25:]}")
            statuses.append(r.status_code)
            jsonschema.validate(r.json(), _schema(doc, path, method, r.status_code,
                                                  "application/json"))  # fmt: skip
        refused = client.post(f"{gw.v1}/chat/completions", json=chat, headers=session)
        jsonschema.validate(refused.json(), _schema(doc, "/v1/chat/completions", "post", 409,
                                                    "application/json"))  # fmt: skip
    assert statuses == [200, 404, 400, 200, 200, 200, 404, 200, 200]
    assert refused.status_code == 409
    chunk_schema = _schema(doc, "/v1/chat/completions", "post", 200, "text/event-stream")
    assert len(chunks) >= 3
    for chunk in chunks:
        jsonschema.validate(chunk, chunk_schema)


def test_real_responses_api_answers_validate(sim_gateway: Gateway) -> None:
    """The Responses endpoint's real answers: the object, every stream event, the
    stored-response routes and a 404, against the openai SDK types the document names."""
    gw = sim_gateway
    doc = httpx.get(f"{gw.root}/openapi.json", timeout=30).json()
    body = {"model": "sim-chat", "input": "hi", "max_output_tokens": 4, "metadata": {"k": "v"}}
    one = "/v1/responses/{response_id}"
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {gw.api_key}"}) as c:
        r = c.post(f"{gw.v1}/responses", json=body)
        jsonschema.validate(r.json(), _schema(doc, "/v1/responses", "post", 200,
                                              "application/json"))  # fmt: skip
        rid = r.json()["id"]
        stream = c.post(f"{gw.v1}/responses", json={**body, "stream": True})
        events = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        event_schema = _schema(doc, "/v1/responses", "post", 200, "text/event-stream")
        for event in events:
            jsonschema.validate(event, event_schema)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        for method, path, status in (("get", one, 200), ("get", one + "/input_items", 200),
                                     ("delete", one, 200), ("get", one, 404)):  # fmt: skip
            got = c.request(method.upper(), f"{gw.root}{path}".replace("{response_id}", rid))
            assert got.status_code == status
            jsonschema.validate(got.json(), _schema(doc, path, method, status,
                                                    "application/json"))  # fmt: skip
