"""GET /openapi.json: the document covers every public endpoint, its references
resolve, and what the server writes validates against it."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from app.api.errors import ApiError
from app.api.openai_format import ResponseHeader, Usage
from app.api.openapi import openapi_document
from app.engine.protocol import TokenLogprob, ToolCallDelta


def validate(instance: Any, path: str, method: str, status: str, media: str) -> None:
    """Validate against the schema the document gives for that response."""
    doc = openapi_document()
    op = doc["paths"][path][method]
    schema = op["responses"][status]["content"][media]["schema"]
    jsonschema.validate(instance, {**schema, "components": doc["components"]})


def test_every_public_endpoint_is_described() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
        "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/cancel",
        "/health", "/ready", "/metrics",
    }  # fmt: skip
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert set(chat["responses"]) >= {"200", "400", "401", "429", "503"}
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = doc["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert {"tools", "response_format", "logprobs", "n"} <= set(request["properties"])


def test_request_bodies_validate_what_the_server_accepts() -> None:
    doc = openapi_document()
    schema = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]  # fmt: skip
    full = {**schema, "components": doc["components"]}
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
    jsonschema.validate(ok, full)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": "m", "messages": [], "bogus": 1}, full)


CHAT = ResponseHeader("chat", "chatcmpl-1", 1, "m")
COMP = ResponseHeader("completion", "cmpl-1", 1, "m")
LP = (TokenLogprob("a", -0.5, (("a", -0.5), ("b", -1.0))),)
CALL = (ToolCallDelta(0, "call_1", "f", '{"x": 1}'),)


@pytest.mark.parametrize(
    ("body", "path", "media"),
    [
        (CHAT.response("hi", "stop", Usage(3, 1), logprobs=LP), "/v1/chat/completions",
         "application/json"),
        (CHAT.response("", "tool_calls", Usage(3, 5), tool_calls=CALL), "/v1/chat/completions",
         "application/json"),
        (CHAT.chunk("hi", index=1, logprobs=LP), "/v1/chat/completions", "text/event-stream"),
        (CHAT.chunk(None, tool_calls=CALL), "/v1/chat/completions", "text/event-stream"),
        (CHAT.usage_chunk(Usage(3, 1, 2)), "/v1/chat/completions", "text/event-stream"),
        (COMP.response("hi", "length", Usage(1, 1), logprobs=LP), "/v1/completions",
         "application/json"),
    ],
)  # fmt: skip
def test_what_the_server_writes_validates(body: dict[str, Any], path: str, media: str) -> None:
    validate(body, path, "post", "200", media)


def test_errors_validate() -> None:
    err = ApiError(400, "bad", param="n", code="invalid_value")
    import json

    body = json.loads(bytes(err.response().body))
    validate(body, "/v1/chat/completions", "post", "400", "application/json")
