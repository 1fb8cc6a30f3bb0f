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
    ]
    statuses = []
    with httpx.Client(timeout=60, headers=auth) as client:
        for method, path, body in cases:
            r = client.request(method.upper(), f"{gw.v1}{path[3:]}", json=body)
            statuses.append(r.status_code)
            jsonschema.validate(r.json(), _schema(doc, path, method, r.status_code,
                                                  "application/json"))  # fmt: skip
        stream = client.post(f"{gw.v1}/chat/completions",
                             json={**chat, "stream": True,
                                   "stream_options": {"include_usage": True}})  # fmt: skip
        chunks = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
    assert statuses == [200, 404, 400, 200, 200, 200]
    chunk_schema = _schema(doc, "/v1/chat/completions", "post", 200, "text/event-stream")
    assert len(chunks) >= 3
    for chunk in chunks:
        jsonschema.validate(chunk, chunk_schema)
