"""``ZmqKvPublisher``: the simulated engine's KV-cache events on a ZMQ PUB socket, in
vLLM's framing (topic, 8-byte big-endian sequence number, msgpack batch;
``app.engine.kv_events``), so a router follows a simulated replica exactly as it follows
a vLLM one. Sending never blocks the engine: past the high-water mark a batch is
dropped and counted (a subscriber sees the gap in the sequence numbers)."""

from __future__ import annotations

import time

import zmq

from app.engine.kv_events import KvEvent, KvEventBatch, encode_batch

HWM = 100_000  # batches queued per subscriber before new ones are dropped


class ZmqKvPublisher:
    def __init__(self, port: int, topic: str = "") -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, HWM)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(f"tcp://*:{port}")
        self._topic = topic.encode()
        self.seq = 0
        self.dropped = 0

    def publish(self, events: list[KvEvent]) -> None:
        payload = encode_batch(KvEventBatch(ts=time.time(), events=events))
        try:
            self._socket.send_multipart(
                (self._topic, self.seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
            )
        except zmq.Again:
            self.dropped += 1
        self.seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)
