"""What the load generator sends and what it records.

Times of one run are seconds on one monotonic clock whose zero is the run start:
``intended`` is when the schedule meant the request to leave, ``sent`` when the
generator actually started it (``sent - intended`` is the generator's schedule lag).
Every latency of a record is measured from ``intended`` (no coordinated omission: a
server that stalls is charged for the requests it held back); in closed loop
``intended`` is the moment the user was ready to send, so the two coincide.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

Endpoint = Literal["chat", "completions", "embeddings"]
ErrorKind = Literal[
    "timeout", "http_429", "http_4xx", "http_5xx", "disconnect", "connect", "stream_error"
]
ERROR_KINDS: tuple[ErrorKind, ...] = (
    "timeout",
    "http_429",
    "http_4xx",
    "http_5xx",
    "disconnect",
    "connect",
    "stream_error",
)
PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. ``body`` is the OpenAI body without the streaming
    fields (the client adds ``stream`` and ``stream_options``)."""

    endpoint: Endpoint
    body: dict[str, Any]
    input_tokens: int
    """Nominal prompt length the workload aimed for (the server's count is recorded)."""
    output_tokens: int
    """Requested output length (``max_tokens``)."""
    kind: str = "fixed"
    """Workload class, e.g. ``short``/``chat``/``long_doc``/``long_gen`` of the mix."""
    tenant: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestRecord:
    """One request as the client saw it (see the module docstring for the clock)."""

    index: int
    kind: str
    endpoint: Endpoint
    intended: float
    sent: float = float("nan")
    chunks: list[float] = field(default_factory=list)
    """Arrival of every chunk that carried content, seconds after ``intended``."""
    end: float | None = None
    """When the response was complete (``[DONE]`` or the body), seconds after ``intended``."""
    status: int | None = None
    opened: bool = False
    """The server answered with a status line (a connection that opened, not necessarily
    a request that succeeded)."""
    error_kind: ErrorKind | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    input_tokens: int = 0
    max_tokens: int = 0
    tenant: str | None = None
    session: int | None = None
    step: int | None = None
    stage: int = 0
    warmup: bool = False
    text: str = field(default="", repr=False)
    """Generated text, kept in memory for chained session steps (not written out)."""

    @property
    def ok(self) -> bool:
        if self.error_kind is not None or self.end is None:
            return False
        return self.endpoint == "embeddings" or bool(self.chunks)

    @property
    def lag(self) -> float:
        return self.sent - self.intended

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] if self.ok and self.chunks else None

    @property
    def e2e(self) -> float | None:
        return self.end if self.ok else None

    def itls(self) -> list[float]:
        """Gaps between consecutive content chunks (vLLM's ITL)."""
        return [b - a for a, b in itertools.pairwise(self.chunks)] if self.ok else []

    @property
    def n_output(self) -> int:
        """Output tokens: the server's usage count, else the number of content chunks."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunks)

    @property
    def tpot(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None below two tokens (as vLLM)."""
        if self.ttft is None or self.end is None or self.n_output < 2:
            return None
        return (self.end - self.ttft) / (self.n_output - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "endpoint": self.endpoint,
            "stage": self.stage,
            "warmup": self.warmup,
            "session": self.session,
            "step": self.step,
            "tenant": self.tenant,
            "intended": round(self.intended, 6),
            "sent": round(self.sent, 6),
            "chunks": [round(c, 6) for c in self.chunks],
            "end": None if self.end is None else round(self.end, 6),
            "status": self.status,
            "opened": self.opened,
            "error_kind": self.error_kind,
            "error": self.error,
            "input_tokens": self.input_tokens,
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)
