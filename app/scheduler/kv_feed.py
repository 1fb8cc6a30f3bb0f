# The router's subscription to its replicas' KV-cache events (precise mode).
#
# Rule: one ZMQ SUB socket per replica endpoint (``tcp://node-ip:port``, which each
# replica advertises in its routing stats as ``kv_events``), all read by one daemon
# thread; each message (topic, 8-byte sequence number, msgpack batch) is decoded
# (``app.engine.kv_events``) and queued with its replica id. The router drains the
# queue on its own event loop before every decision, so the index is never touched
# from two threads and is as fresh as the engines' last step. A gap in a replica's
# sequence numbers (messages dropped by the publisher, or sent before this subscriber
# connected: ZMQ's slow joiner) is counted in ``lost``; the blocks it hid are
# re-learned when the engine stores or hits them again, or never matched (see
# ``app.scheduler.kv_events``: orphans).
#
# A router that makes no decision for a while (an idle ingress replica beside a busy
# one) holds at most ``MAX_READY`` batches; older ones are dropped and counted in
# ``dropped``, with the same effect as a gap.
#
# Parameters: ``POLL_MS`` (how long the thread waits for a message before it looks at
# new subscriptions), ``MAX_READY``.
"""A daemon thread following the KV-event PUB sockets of a pool's replicas."""

from __future__ import annotations

import queue
import threading
from collections import deque

import msgspec
import zmq

from app.engine.kv_events import KvEvent, decode_batch

POLL_MS = 50
MAX_READY = 100_000


class KvEventFeed:
    def __init__(self) -> None:
        self._endpoints: dict[str, str] = {}  # replica -> endpoint followed
        self._commands: queue.SimpleQueue[tuple[str, str | None]] = queue.SimpleQueue()
        self._ready: deque[tuple[str, list[KvEvent]]] = deque(maxlen=MAX_READY)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.lost = 0  # sequence numbers never received
        self.undecodable = 0
        self.dropped = 0  # batches pushed out of a full queue before a drain

    def follow(self, replica: str, endpoint: str) -> None:
        """Subscribe to ``replica``'s events at ``endpoint`` (again if it moved)."""
        if self._endpoints.get(replica) == endpoint:
            return
        self._endpoints[replica] = endpoint
        self._commands.put((replica, endpoint))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
            self._thread.start()

    def unfollow(self, replica: str) -> None:
        if self._endpoints.pop(replica, None) is not None:
            self._commands.put((replica, None))

    def following(self, replica: str) -> str | None:
        return self._endpoints.get(replica)

    def followed(self) -> list[str]:
        return list(self._endpoints)

    def drain(self) -> list[tuple[str, list[KvEvent]]]:
        """Every batch received since the last drain, oldest first."""
        out = []
        while self._ready:
            out.append(self._ready.popleft())
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        poller = zmq.Poller()
        sockets: dict[str, zmq.Socket[bytes]] = {}
        replica_of: dict[zmq.Socket[bytes], str] = {}
        next_seq: dict[str, int] = {}
        try:
            while not self._stop.is_set():
                while not self._commands.empty():
                    replica, endpoint = self._commands.get()
                    old = sockets.pop(replica, None)
                    if old is not None:
                        poller.unregister(old)
                        replica_of.pop(old, None)
                        old.close(linger=0)
                        next_seq.pop(replica, None)
                    if endpoint is not None:
                        sock = context.socket(zmq.SUB)
                        sock.setsockopt(zmq.LINGER, 0)
                        sock.setsockopt(zmq.SUBSCRIBE, b"")
                        sock.connect(endpoint)
                        poller.register(sock, zmq.POLLIN)
                        sockets[replica], replica_of[sock] = sock, replica
                for sock, _ in poller.poll(POLL_MS):
                    replica = replica_of[sock]
                    while True:
                        try:
                            frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._receive(replica, frames, next_seq)
        finally:
            for sock in sockets.values():
                sock.close(linger=0)

    def _receive(self, replica: str, frames: list[bytes], next_seq: dict[str, int]) -> None:
        if len(frames) != 3:
            self.undecodable += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        expected = next_seq.get(replica)
        if expected is not None and seq > expected:
            self.lost += seq - expected
        next_seq[replica] = seq + 1
        try:
            batch = decode_batch(frames[2])
        except msgspec.DecodeError:
            self.undecodable += 1
            return
        if len(self._ready) == self._ready.maxlen:
            self.dropped += 1  # the deque drops its oldest batch
        self._ready.append((replica, batch.events))
