"""Exit paths through the real stack (Ray Serve's proxy with the proxy guard, the
ingress, real engines): bad input never gets a 500, oversized and slow bodies get a
readable 413/408, and readiness follows the engine."""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import httpx
import pytest
from ray import serve

from tests.integration.conftest import Deploy, Gateway

HELLO = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS, EMBEDDINGS = "/chat/completions", "/completions", "/embeddings"
MESSAGES, COUNT = "/messages", "/messages/count_tokens"  # Anthropic's: the error's type
RESPONSES = "/responses"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _jwt_nested_header() -> str:
    header = '{"alg":"RS256","x":' + _nested(10_000) + "}"
    part = base64.urlsafe_b64encode(header.encode()).rstrip(b"=").decode()
    return f"{part}.e30.c2ln"


# (case, path, raw body or None for the model's default body, extra headers, status, code)
Row = tuple[str, str, bytes | None, dict[str, Any], int, str | None]


def rows(model: str) -> list[Row]:
    def chat(**extra: Any) -> bytes:
        return json.dumps({"model": model, "messages": HELLO, "max_tokens": 2, **extra}).encode()

    def raw_chat(field: str, raw: str) -> bytes:
        head = f'{{"model": "{model}", "max_tokens": 2, "messages": {json.dumps(HELLO)}, '
        return (head + f'"{field}": {raw}}}').encode()

    def completion(prompt: str, **extra: Any) -> bytes:
        body = f'{{"model": "{model}", "max_tokens": 2, "prompt": {prompt}'
        for k, v in extra.items():
            body += f', "{k}": {v}'
        return (body + "}").encode()

    def message(**extra: Any) -> bytes:
        body = {"model": model, "messages": HELLO, "max_tokens": 2, **extra}
        return json.dumps({k: v for k, v in body.items() if v is not None}).encode()

    def response(**extra: Any) -> bytes:
        body = {"model": model, "input": "hi", "max_output_tokens": 2, **extra}
        return json.dumps({k: v for k, v in body.items() if v is not None}).encode()

    bad = "invalid_request_error"
    call = {"type": "function_call", "name": "f", "arguments": "{}"}
    return [
        ("responses-deep-json", RESPONSES, f'{{"x": {_nested(10_000)}}}'.encode(), {}, 400,
         "invalid_json"),
        ("responses-surrogate", RESPONSES,
         f'{{"model": "{model}", "input": "\\ud800"}}'.encode(), {}, 400, "invalid_json"),
        ("responses-no-input", RESPONSES, response(input=None), {}, 400, "invalid_value"),
        ("responses-empty-input", RESPONSES, response(input=[]), {}, 400, "invalid_value"),
        ("responses-max-output-2^64", RESPONSES, response(max_output_tokens=2**64), {}, 400,
         "invalid_value"),
        ("responses-unknown-item", RESPONSES, response(input=[{"type": "video"}]), {}, 400,
         "unsupported_parameter"),
        ("responses-built-in-tool", RESPONSES, response(tools=[{"type": "web_search"}]), {},
         400, "unsupported_parameter"),
        ("responses-call-without-id", RESPONSES, response(input=[call]), {}, 400,
         "invalid_value"),
        ("responses-orphan-output", RESPONSES, response(input=[
            {"type": "function_call_output", "call_id": "x", "output": "y"}]), {}, 200, None),
        ("responses-unknown-previous", RESPONSES, response(previous_response_id="resp_nope"),
         {}, 404, "previous_response_not_found"),
        ("responses-long-metadata", RESPONSES, response(metadata={"k": "v" * 600}), {}, 400,
         "invalid_value"),
        ("responses-ok", RESPONSES, response(), {}, 200, None),
        ("messages-deep-json", MESSAGES, f'{{"x": {_nested(10_000)}}}'.encode(), {}, 400, bad),
        ("messages-surrogate", MESSAGES,
         f'{{"model": "{model}", "max_tokens": 2, "messages": [{{"role": "user", '
         f'"content": "\\ud800"}}]}}'.encode(), {}, 400, bad),
        ("messages-no-max-tokens", MESSAGES, message(max_tokens=None), {}, 400, bad),
        ("messages-max-tokens-2^64", MESSAGES, message(max_tokens=2**64), {}, 400, bad),
        ("messages-unknown-block", MESSAGES,
         message(messages=[{"role": "user", "content": [{"type": "video"}]}]), {}, 400, bad),
        ("messages-empty-content", MESSAGES,
         message(messages=[{"role": "user", "content": []}]), {}, 400, bad),
        ("messages-system-role", MESSAGES,
         message(messages=[{"role": "system", "content": "x"}]), {}, 400, bad),
        ("messages-stop-empty", MESSAGES, message(stop_sequences=[""]), {}, 400, bad),
        ("messages-tool-no-schema", MESSAGES, message(tools=[{"name": "f"}]), {}, 400, bad),
        ("messages-tool-bad-name", MESSAGES,
         message(tools=[{"name": "a b", "input_schema": {}}]), {}, 400, bad),
        ("messages-unknown-field", MESSAGES,
         message(messages=[{"role": "assistant", "content": [
             {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}}]}],
             extra=1), {}, 400, bad),
        ("messages-bad-utf8-x-api-key", MESSAGES, None, {"x-api-key": b"\xff\xfe"}, 401,
         "authentication_error"),
        ("messages-ok", MESSAGES, None, {}, 200, None),
        ("count-tokens-no-messages", COUNT, json.dumps({"model": model}).encode(), {}, 400, bad),
        ("count-tokens-unknown-model", COUNT,
         json.dumps({"model": "nope", "messages": HELLO}).encode(), {}, 404, "not_found_error"),
        ("deep-json", CHAT, f'{{"x": {_nested(10_000)}}}'.encode(), {}, 400, "invalid_json"),
        ("deep-messages", CHAT, raw_chat("extra", _nested(10_000)), {}, 400, "invalid_json"),
        ("deep-prompt", COMPLETIONS, completion(_nested(10_000)), {}, 400, "invalid_json"),
        ("surrogate-content", CHAT,
         f'{{"model": "{model}", "messages": [{{"role": "user", "content": "\\ud800"}}]}}'.encode(),
         {}, 400, "invalid_json"),
        ("surrogate-prompt", COMPLETIONS, completion('"a\\udfffb"'), {}, 400, "invalid_json"),
        ("digits-max-tokens", CHAT, raw_chat("seed", "9" * 5000), {}, 400, "invalid_json"),
        ("seed-2^64", CHAT, chat(seed=2**64), {}, 400, "invalid_value"),
        ("seed-10^30", CHAT, chat(seed=10**30), {}, 400, "invalid_value"),
        ("token-2^64", COMPLETIONS, completion(f"[1, {2**64}]"), {}, 400, "invalid_value"),
        ("token-negative", COMPLETIONS, completion("[-1]"), {}, 400, "invalid_value"),
        ("token-out-of-vocab", COMPLETIONS, completion(f"[1, {10**9}]"), {}, 400, "invalid_value"),
        ("stop-empty", CHAT, chat(stop=""), {}, 400, "invalid_value"),
        ("stop-empty-list", CHAT, chat(stop=[""]), {}, 400, "invalid_value"),
        ("bad-utf8-session", CHAT, None, {"x-session-id": b"\xc3\x28"}, 400, "invalid_header"),
        ("bad-utf8-mux", CHAT, None, {"serve_multiplexed_model_id": b"\xff"}, 400,
         "invalid_header"),
        ("bad-utf8-request-id", CHAT, None, {"x-request-id": b"\xff\xfe"}, 200, None),
        ("ray-timeout-header", CHAT, None, {"x-request-timeout-seconds": b"0.001"}, 200, None),
        ("bad-utf8-authorization", CHAT, None, {"authorization": b"Bearer \xff\xfe"}, 401,
         "invalid_api_key"),
        ("nested-jwt-header", CHAT, None,
         {"authorization": f"Bearer {_jwt_nested_header()}".encode()}, 401, "invalid_api_key"),
    ]


@pytest.mark.parametrize("gateway", ["sim_gateway", "tiny_gateway"])
def test_bad_input_never_gets_a_500(request: pytest.FixtureRequest, gateway: str) -> None:
    gw: Gateway = request.getfixturevalue(gateway)
    model = "sim-chat" if gateway == "sim_gateway" else "tiny-llama"
    default = json.dumps({"model": model, "messages": HELLO, "max_tokens": 2}).encode()
    misses = []
    for case, path, body, extra, status, code in rows(model):
        headers: dict[str, Any] = {"content-type": "application/json", **extra}
        response = httpx.post(gw.v1 + path, content=body or default, headers=headers, timeout=60)
        got = response.json()  # always JSON, even for a header Ray itself reads
        shape = "type" if path.startswith(MESSAGES) else "code"  # Anthropic's, OpenAI's
        error = got.get("error")  # a response object carries "error": null
        got_code = error[shape] if error else None
        if (response.status_code, got_code) != (status, code):
            misses.append((case, response.status_code, got_code))
    assert misses == []


def test_bad_utf8_header_on_health_is_json(sim_gateway: Gateway) -> None:
    response = httpx.get(sim_gateway.root + "/health", headers={"x-session-id": b"\xff"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-session-id"


def test_embeddings_inputs_are_capped(sim_gateway: Gateway) -> None:
    ok = httpx.post(
        sim_gateway.v1 + EMBEDDINGS,
        json={"model": "sim-embed", "input": ["hi"] * 2048},
        timeout=120,
    )
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2048
    over = httpx.post(
        sim_gateway.v1 + EMBEDDINGS, json={"model": "sim-embed", "input": ["hi"] * 2049}
    )
    assert over.status_code == 400
    assert (over.json()["error"]["param"], over.json()["error"]["code"]) == (
        "input",
        "too_many_inputs",
    )


def _urllib_post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        assert json.loads(exc.read())["error"]["code"] == "request_too_large"
        return int(exc.code)


@pytest.mark.parametrize(
    ("size", "tries"), [(100 * 1024, 10), (9 * 1024 * 1024, 5)], ids=["over-app", "over-proxy"]
)
def test_oversized_bodies_get_a_413_urllib_can_read(
    sim_gateway: Gateway, size: int, tries: int
) -> None:
    """The sim app allows 64 KiB, the proxy guard 8 MiB: both limits answer only after
    the upload, so a client that writes before it reads sees the 413, never a reset."""
    body = b'{"model": "sim-chat", "messages": [], "pad": "' + b"x" * size + b'"}'
    statuses = [_urllib_post(sim_gateway.v1 + CHAT, body) for _ in range(tries)]
    assert statuses == [413] * tries


def _trickle(url: str, declared: int) -> socket.socket:
    host, port = url.split("//")[1].split("/")[0].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    path = "/" + url.split("//")[1].split("/", 1)[1]
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n{{"
    )
    sock.sendall(head.encode())
    return sock


def test_slow_bodies_get_408_and_do_not_hold_up_others(deploy: Deploy) -> None:
    """More trickling uploads than the ingress admits at once (40 > 8): they wait in the
    proxy, never in the ingress, so normal requests are answered meanwhile, and each
    ends with a 408 in the API's shape at the integration cluster's 5 s body deadline
    (SWITCHYARD_BODY_TIMEOUT_S)."""
    gw = deploy(
        "slowbody",
        {
            "models": [{"id": "slow-chat", "engine": "simulated"}],
            "ingress_max_ongoing_requests": 8,
            "gateway": {"anonymous_tenant": "slow-t"},
        },
    )
    slow = [_trickle(gw.v1 + CHAT, 1000) for _ in range(40)]
    started = time.monotonic()
    try:
        client = httpx.Client(timeout=30)
        for _ in range(5):
            body = {"model": "slow-chat", "messages": HELLO, "max_tokens": 2}
            ok = client.post(gw.v1 + CHAT, json=body)
            assert ok.status_code == 200
        answers = []
        for sock in slow:
            sock.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            answers.append(data)
        assert time.monotonic() - started < 25
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
        body_408 = answers[0].split(b"\r\n\r\n", 1)[1]
        assert json.loads(body_408)["error"]["code"] == "request_timeout"
    finally:
        for sock in slow:
            sock.close()
        serve.delete("slowbody")


def test_a_connection_that_never_finishes_its_headers_is_closed(sim_gateway: Gateway) -> None:
    """The integration cluster's proxy closes it after SWITCHYARD_HEADER_TIMEOUT_S (3 s)."""
    host, port = sim_gateway.root.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /sim/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the proxy, nothing answered
        assert time.monotonic() - started < 20
    ok = httpx.get(sim_gateway.root + "/health", timeout=10)
    assert ok.status_code == 200
