"""Traces through Ray Serve: an OTLP/HTTP receiver runs in this process, the gateway is
configured to export to it, and one streaming request through the official SDK, sent
with a caller's ``traceparent`` and a session, must arrive as one span tree in the
caller's trace: the ingress layers, the replica with the engine's queue, prefill and
decode, and the settlement."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from ray import serve

from tests.integration.conftest import SIM_FAST, Deploy, Gateway

APP = "traced"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
ROOT = "POST /v1/chat/completions"


class Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP traces (protobuf): every span received, with its service name."""

    spans: ClassVar[list[tuple[str, Any]]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for rs in export.resource_spans:
                service = next(
                    (a.value.string_value for a in rs.resource.attributes
                     if a.key == "service.name"), "",
                )  # fmt: skip
                for ss in rs.scope_spans:
                    self.spans.extend((service, s) for s in ss.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def traced(deploy: Deploy, receiver: str) -> Iterator[Gateway]:
    tracing = {"otlp_endpoint": receiver, "export_delay_ms": 100, "service_name": "sy-test"}
    model = {"id": "traced-chat", "engine": "simulated", "simulation": SIM_FAST}
    yield deploy(APP, {"models": [model], "gateway": {"tracing": tracing}})
    serve.delete(APP)


def _trace(trace_id: str, deadline_s: float = 30.0) -> dict[str, Any]:
    """The spans of ``trace_id`` by name, once the settle span has arrived."""
    end = time.monotonic() + deadline_s
    while True:
        with Receiver.lock:
            got = {s.name: (svc, s) for svc, s in Receiver.spans if s.trace_id.hex() == trace_id}
        if "settle" in got or time.monotonic() > end:
            return got
        time.sleep(0.2)


def test_one_streaming_request_is_one_span_tree_in_the_callers_trace(traced: Gateway) -> None:
    client = openai.OpenAI(base_url=traced.v1, api_key=traced.api_key, max_retries=0)
    stream = client.chat.completions.create(
        model="traced-chat",
        messages=[{"role": "user", "content": "trace me " * 40}],
        max_tokens=8,
        stream=True,
        extra_headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01", "x-session-id": "run-7"},
    )
    assert sum(1 for c in stream if c.choices and c.choices[0].delta.content) >= 1
    got = _trace(TRACE)
    assert set(got) == {ROOT, "auth", "route", "admit", "replica", "queue", "prefill", "decode",
                        "settle"}, sorted(got)  # fmt: skip
    assert {svc for svc, _ in got.values()} == {"sy-test"}
    root = got[ROOT][1]
    assert root.parent_span_id.hex() == CALLER_SPAN
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["switchyard.session_id"].string_value == "run-7"
    assert attrs["gen_ai.usage.output_tokens"].int_value == 8
    assert attrs["http.response.status_code"].int_value == 200
    replica = got["replica"][1]
    for name in ("auth", "route", "admit", "replica", "settle"):
        assert got[name][1].parent_span_id == root.span_id, name
    for name in ("queue", "prefill", "decode"):
        span = got[name][1]
        assert span.parent_span_id == replica.span_id, name
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
    # The layers follow one another, and the settlement comes after the last token.
    order = [got[n][1] for n in ("auth", "route", "admit", "replica", "settle")]
    starts = [s.start_time_unix_nano for s in order]
    assert starts == sorted(starts)
    assert got["settle"][1].end_time_unix_nano <= root.end_time_unix_nano


def test_a_request_without_traceparent_starts_a_trace_of_its_own(traced: Gateway) -> None:
    before = len(Receiver.spans)
    client = openai.OpenAI(base_url=traced.v1, api_key=traced.api_key, max_retries=0)
    client.chat.completions.create(
        model="traced-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    end = time.monotonic() + 30
    while time.monotonic() < end:
        with Receiver.lock:
            roots = [s for _, s in Receiver.spans[before:] if s.name == ROOT]
        if roots:
            break
        time.sleep(0.2)
    assert len(roots) == 1 and roots[0].trace_id.hex() != TRACE
    assert roots[0].parent_span_id == b""  # a root of its own
