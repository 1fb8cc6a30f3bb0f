"""GET /openapi.json: the document covers every public endpoint, its references
resolve, and what the server writes validates against it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from app.api.errors import ApiError, internal_error
from app.api.openai_format import ResponseHeader, Usage, embedding_list, encode_embedding
from app.api.openapi import openapi_document
from app.api.responses_format import ItemStream, output_items, usage
from app.api.responses_format import ResponseHeader as RespHeader
from app.api.responses_protocol import ResponsesRequest
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
        "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
        "/v1/responses/{response_id}", "/v1/responses/{response_id}/input_items",
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
        (CHAT.response("hi", "length", Usage(1, 1), stop_reason="budget_exhausted"),
         "/v1/chat/completions", "application/json"),
        # a streamed legacy completion: no finish reason until the choice ends
        (COMP.chunk("hi"), "/v1/completions", "text/event-stream"),
        (json.loads(COMP.text_event("hi")[6:]), "/v1/completions", "text/event-stream"),
        (json.loads(CHAT.text_event("hi")[6:]), "/v1/chat/completions", "text/event-stream"),
        (COMP.chunk(None, "length", stop_reason="budget_exhausted", logprobs=LP),
         "/v1/completions", "text/event-stream"),
        (COMP.usage_chunk(Usage(3, 1, 2)), "/v1/completions", "text/event-stream"),
        # an error after the stream began is an event of the error shape
        (json.loads(internal_error("r").sse()[6:]), "/v1/chat/completions", "text/event-stream"),
        (json.loads(internal_error("r").sse()[6:]), "/v1/completions", "text/event-stream"),
        # embeddings: numbers, or (base64) the float32 bytes as a string
        (embedding_list([[0.5, -1.25], [3.0, 0.0]], "e", 4, "float"), "/v1/embeddings",
         "application/json"),
        (embedding_list([[0.5, -1.25], [3.0, 0.0]], "e", 4, "base64"), "/v1/embeddings",
         "application/json"),
    ],
)  # fmt: skip
def test_what_the_server_writes_validates(body: dict[str, Any], path: str, media: str) -> None:
    validate(body, path, "post", "200", media)


def test_a_base64_embedding_is_a_string_the_document_allows_and_an_array_is_not() -> None:
    """The base64 body (built by ``encode_embedding``) against the published schema:
    a string, and nothing else but numbers."""
    vector = [0.5, -1.25, 3.0]
    encoded = encode_embedding(vector, "base64")
    assert isinstance(encoded, str)
    body = embedding_list([vector], "e", 3, "base64")
    assert body["data"][0]["embedding"] == encoded
    validate(body, "/v1/embeddings", "post", "200", "application/json")
    body["data"][0]["embedding"] = {"not": "a vector"}
    with pytest.raises(jsonschema.ValidationError):
        validate(body, "/v1/embeddings", "post", "200", "application/json")


@pytest.mark.parametrize(
    ("path", "method", "statuses"),
    [
        ("/v1/chat/completions", "post", {"400", "404", "500", "502", "503"}),
        ("/v1/completions", "post", {"400", "404", "500", "502", "503"}),
        ("/v1/embeddings", "post", {"400", "404", "408", "409", "500", "502", "503"}),
        ("/v1/models", "get", {"401", "500", "503"}),
        ("/v1/sessions/{session_id}", "get", {"404", "500"}),
    ],
)
def test_server_errors_are_documented(path: str, method: str, statuses: set[str]) -> None:
    """A 500 (logged under the request id it names) and a 502 are answers too."""
    assert statuses <= set(openapi_document()["paths"][path][method]["responses"])
    body = internal_error("rid-1").body()
    validate(body, path, method, "500", "application/json")


def test_errors_validate() -> None:
    err = ApiError(400, "bad", param="n", code="invalid_value")
    body = json.loads(bytes(err.response().body))
    validate(body, "/v1/chat/completions", "post", "400", "application/json")


def test_the_messages_endpoint_is_described_in_anthropics_shapes() -> None:
    doc = openapi_document()
    op = doc["paths"]["/v1/messages"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = doc["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert {"max_tokens", "system", "tools", "tool_choice", "stop_sequences"} <= set(
        request["properties"]
    )
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    name = answer.rsplit("/", 1)[1]  # the anthropic SDK's type (its module, where names meet)
    assert name.startswith("Message") or name == "anthropic__types__message__Message"
    error = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert doc["components"]["schemas"][error.rsplit("/", 1)[1]]["properties"]["type"]
    events = op["responses"]["200"]["content"]["text/event-stream"]["schema"]["anyOf"]
    assert len(events) == 7  # six event types and the error


def _sse(chunks: list[str]) -> list[dict[str, Any]]:
    return [json.loads(c.split("data: ", 1)[1]) for c in chunks]


def test_what_the_responses_endpoint_writes_validates() -> None:
    """The response object (plain, incomplete, failed) and every stream event against
    the openai SDK's types the document names."""
    body = ResponsesRequest.model_validate({
        "model": "m", "input": "hi", "instructions": "x", "metadata": {"k": "v"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
    })  # fmt: skip
    h = RespHeader("resp_1", 1, "m", body)
    use = usage(5, 3, 2)
    path = "/v1/responses"
    for whole in (h.response("completed", output_items("1", "hi", CALL), use),
                  h.response("incomplete", output_items("1", "", ()), use,
                             reason="budget_exhausted"),
                  h.response("failed", [], use, error={"code": "server_error",
                                                       "message": "engine died"})):  # fmt: skip
        validate(whole, path, "post", "200", "application/json")
        validate(whole, "/v1/responses/{response_id}", "get", "200", "application/json")
    s = ItemStream("1")
    start = h.response("in_progress", [], None)
    chunks = [s.event("response.created", {"response": start}), *s.text("hi"),
              *s.call(CALL[0]), *s.finish(),
              s.event("response.completed", {"response": h.response("completed", s.items, use)})]
    for event in _sse(chunks):
        validate(event, path, "post", "200", "text/event-stream")
    deleted = {"id": "resp_1", "object": "response", "deleted": True}
    validate(deleted, "/v1/responses/{response_id}", "delete", "200", "application/json")
