"""A deliberately broken OpenAI-compatible HTTP server for upstream tests (a plain module,
so tests and the conftest fixture share one ``SlowStreams``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

SLOW_CHUNKS = 400  # the slow stream: one chunk every 20 ms, 8 s in all


class SlowStreams:
    """What the ``slow`` mode saw: per request, the chunks it sent before the client
    went away (None while streaming or when it streamed everything)."""

    lock = threading.Lock()
    sent: ClassVar[list[int | None]] = []

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.sent = []


class _Broken(BaseHTTPRequestHandler):
    """``/<mode>/v1/...``: ``503`` answers 503; ``drop`` sends one chunk of a chunked
    SSE stream, then closes the connection; ``hang`` answers nothing until released;
    ``slow`` streams ``SLOW_CHUNKS`` one-token chunks 20 ms apart and records in
    ``SlowStreams`` how many it sent before the client closed the connection."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def _slow(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with SlowStreams.lock:
            index = len(SlowStreams.sent)
            SlowStreams.sent.append(None)
        event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        for i in range(SLOW_CHUNKS):
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            except OSError:  # the client closed the connection
                with SlowStreams.lock:
                    SlowStreams.sent[index] = i
                self.close_connection = True
                return
            time.sleep(0.02)
        self.close_connection = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        mode = self.path.split("/")[1]
        if mode == "503":
            body = json.dumps({"error": {"message": "busy", "code": 503}}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif mode == "drop":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            event = b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            self.close_connection = True
        elif mode == "hang":
            self.release.wait(30)
            self.close_connection = True
        elif mode == "slow":
            self._slow()

    def log_message(self, format: str, *args: Any) -> None:
        pass
