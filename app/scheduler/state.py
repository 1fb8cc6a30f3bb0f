"""What the replica scheduler works on: the request as routing sees it, the replicas
as candidates, and the load booked on each replica by this router.

Load rule: a request is booked on its replica when the scheduler picks it (not when a
stats report arrives 10 s later) and released when Ray reports it completed; a booking
is ``1`` in-flight request plus its prompt tokens, and a replica's load is
``in_flight + booked_tokens / tokens_per_request``. Each calling process (ingress
replica) keeps its own book: it sees only the requests it sent.

Prefill rule: a request's prompt tokens to compute (beyond the blocks its replica is
believed to hold) are pending on that replica from the pick until its first token comes
back to the ingress (``PrefillBook.done``) or it ends, whichever is first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoutedRequest:
    """One request, as the replica scheduler sees it."""

    key: str  # the gateway's request id: the tie-break hashes it, never the replica order
    hashes: tuple[int, ...] = ()  # chained block hashes of the prompt (salted)
    prompt_tokens: int = 0
    session: str | None = None  # tenant-scoped session key, when sessions route
    adapter: str | None = None  # the LoRA adapter (base:name) the request runs


@dataclass(frozen=True, slots=True)
class Candidates:
    """One decision's candidate replicas and their booked load, aligned by position
    (scorers return one score per position: lists, not per-replica objects, keep a
    decision's cost per candidate to a few list steps)."""

    ids: list[str]
    in_flight: list[int]  # requests this router has in flight there
    load: list[float]  # ``LoadBook.load``


@dataclass
class LoadBook:
    """Bookings by Ray's internal request id (stable across a request's retries)."""

    tokens_per_request: int = 512
    _by_request: dict[str, tuple[str, int]] = field(default_factory=dict)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _tokens: dict[str, int] = field(default_factory=dict)

    def book(self, request_id: str, replica: str, tokens: int) -> None:
        """Book (or move) a request onto ``replica``."""
        self.release(request_id)
        self._by_request[request_id] = (replica, tokens)
        self._in_flight[replica] = self._in_flight.get(replica, 0) + 1
        self._tokens[replica] = self._tokens.get(replica, 0) + tokens

    def booked_on(self, request_id: str) -> str | None:
        got = self._by_request.get(request_id)
        return got[0] if got is not None else None

    def release(self, request_id: str) -> None:
        got = self._by_request.pop(request_id, None)
        if got is None:
            return
        replica, tokens = got
        self._in_flight[replica] = max(0, self._in_flight.get(replica, 0) - 1)
        self._tokens[replica] = max(0, self._tokens.get(replica, 0) - tokens)

    def drop(self, replica: str) -> None:
        """A replica left: forget its bookings."""
        for rid in [r for r, (rep, _) in self._by_request.items() if rep == replica]:
            del self._by_request[rid]
        self._in_flight.pop(replica, None)
        self._tokens.pop(replica, None)

    def in_flight(self, replica: str) -> int:
        return self._in_flight.get(replica, 0)

    def load(self, replica: str) -> float:
        return self.in_flight(replica) + self._tokens.get(replica, 0) / self.tokens_per_request

    def candidates(self, replicas: Sequence[str]) -> Candidates:
        ids = list(replicas)
        n = [self._in_flight.get(r, 0) for r in ids]
        tokens, per = self._tokens, self.tokens_per_request
        return Candidates(ids, n, [a + tokens.get(r, 0) / per for a, r in zip(n, ids, strict=True)])


@dataclass
class PrefillBook:
    """Prompt tokens awaiting their first token, by the gateway's request id (the id
    the ingress knows when the first token comes; module docstring)."""

    _by_key: dict[str, tuple[str, int]] = field(default_factory=dict)
    _pending: dict[str, int] = field(default_factory=dict)

    def start(self, key: str, replica: str, tokens: int) -> None:
        """Pending on ``replica`` (moved there, when it was pending elsewhere)."""
        self.done(key)
        self._by_key[key] = (replica, tokens)
        self._pending[replica] = self._pending.get(replica, 0) + tokens

    def done(self, key: str) -> None:
        """Its first token came, or it ended (once; unknown keys are ignored)."""
        got = self._by_key.pop(key, None)
        if got is None:
            return
        replica, tokens = got
        left = self._pending.get(replica, 0) - tokens
        if left > 0:
            self._pending[replica] = left
        else:
            self._pending.pop(replica, None)

    def drop(self, replica: str) -> None:
        # a snapshot first: the ingress thread may end a prefill meanwhile
        for key, (rep, _) in list(self._by_key.items()):
            if rep == replica:
                self._by_key.pop(key, None)
        self._pending.pop(replica, None)

    def pending(self, replicas: Sequence[str]) -> list[int]:
        return [self._pending.get(r, 0) for r in replicas]
