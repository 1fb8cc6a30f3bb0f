"""Trace replay: a JSONL file, one request a line, on the trace's own clock.

Each line is a :class:`TraceLine`: exactly one of ``input_tokens`` (a synthesised prompt
of that length, from :class:`~app.bench.prompts.PromptFactory`), ``prompt`` or
``messages`` (sent verbatim), plus ``output_tokens``; optional ``endpoint`` (default:
the workload's), ``tenant`` and ``kind`` (default ``trace``). Bodies are as in
:mod:`app.bench.workloads` (``max_tokens`` = ``output_tokens``, ``temperature`` 0.0 and
``ignore_eos`` by default). ``timestamp`` is seconds from the trace start, given on every
line or none, never decreasing; a timed trace replays on its own timestamps
(:meth:`TraceWorkload.offsets`). Request ``i`` is line ``i mod len``. A bad line, or a
file with no requests, raises :class:`TraceError` naming the file and line number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.bench.prompts import PromptFactory
from app.bench.records import RequestSpec
from app.bench.workloads import GenEndpoint, Prompt, WorkloadBase
from app.schema import Strict

__all__ = ["TraceError", "TraceLine", "TraceMessage", "TraceWorkload"]


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line."""


class TraceMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str


class TraceLine(Strict):
    """One JSONL line: exactly one of ``input_tokens`` (a synthesised prompt of that
    length), ``prompt`` or ``messages``; ``timestamp`` is seconds from the trace start
    (all lines or none, non-decreasing); ``endpoint`` defaults to the workload's."""

    timestamp: float | None = Field(default=None, ge=0)
    input_tokens: int | None = Field(default=None, ge=1)
    prompt: str | None = None
    messages: list[TraceMessage] | None = Field(default=None, min_length=1)
    output_tokens: int = Field(ge=1)
    endpoint: GenEndpoint | None = None
    tenant: str | None = None
    kind: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TraceLine:
        given = [f for f in ("input_tokens", "prompt", "messages") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of input_tokens, prompt, messages; got {given}")
        return self


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors())


class TraceWorkload(WorkloadBase):
    """Replays trace lines in order. Request ``i`` is line ``i mod len``: a closed loop
    may ask for more requests than the trace holds (a repeated ``input_tokens`` line gets
    new text, ``prompt``/``messages`` lines repeat verbatim). Kind and tenant come from
    the line (kind default ``trace``). ``offsets(time_scale)`` is the open-loop schedule:
    each timestamp times ``time_scale`` (0.5 replays twice as fast)."""

    name = "trace"

    def __init__(
        self,
        lines: Sequence[TraceLine],
        model: str,
        factory: PromptFactory,
        seed: int = 0,
        *,
        source: str = "trace",
        line_numbers: Sequence[int] | None = None,
        endpoint: GenEndpoint = "chat",
        temperature: float = 0.0,
        ignore_eos: bool = True,
    ) -> None:
        self.model, self.factory, self.seed, self.endpoint = model, factory, seed, endpoint
        self.temperature, self.ignore_eos = temperature, ignore_eos
        self.lines, self.source = list(lines), source
        numbers = list(line_numbers or range(1, len(self.lines) + 1))
        if not self.lines:
            raise TraceError(f"{source}: no requests")
        timed = self.lines[0].timestamp is not None
        last = 0.0
        for number, line in zip(numbers, self.lines, strict=True):
            where = f"{source} line {number}"
            if (line.endpoint or endpoint) == "completions" and line.messages is not None:
                raise TraceError(f"{where}: messages need the chat endpoint")
            if (line.timestamp is not None) != timed:
                raise TraceError(f"{where}: timestamps must be given on every line or none")
            if line.timestamp is not None:
                if line.timestamp < last:
                    raise TraceError(f"{where}: timestamp {line.timestamp} goes back in time")
                last = line.timestamp

    @classmethod
    def from_jsonl(
        cls, path: str | Path, model: str, factory: PromptFactory, seed: int = 0, **options: Any
    ) -> TraceWorkload:
        lines, numbers = [], []
        for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
            if not raw.strip():
                continue
            try:
                lines.append(TraceLine.model_validate_json(raw))
            except ValidationError as exc:
                raise TraceError(f"{path} line {number}: {_errors(exc)}") from None
            numbers.append(number)
        return cls(lines, model, factory, seed, source=str(path), line_numbers=numbers, **options)

    def __len__(self) -> int:
        return len(self.lines)

    def offsets(self, time_scale: float = 1.0) -> list[float] | None:
        """Intended send times (s from the run start), or None for an untimed trace."""
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        stamps = [line.timestamp for line in self.lines]
        return None if stamps[0] is None else [(t or 0.0) * time_scale for t in stamps]

    def _prompt(self, index: int) -> tuple[Prompt, int]:
        line, count = self.lines[index % len(self.lines)], self.factory.counter.count
        if line.input_tokens is not None:
            return self.factory.text(line.input_tokens, self._rng(index)), line.input_tokens
        if line.prompt is not None:
            return line.prompt, count(line.prompt)
        messages = [m.model_dump() for m in line.messages or []]
        return messages, sum(count(m["content"]) for m in messages)

    def request(self, index: int) -> RequestSpec:
        if index < 0:
            raise IndexError(f"request index {index} < 0")
        line = self.lines[index % len(self.lines)]
        endpoint = line.endpoint or self.endpoint
        prompt, n_in = self._prompt(index)
        body = self._body(prompt, line.output_tokens, endpoint)
        return RequestSpec(
            endpoint, body, n_in, line.output_tokens, line.kind or "trace", line.tenant
        )

    def describe(self) -> dict[str, Any]:
        inputs = [self._prompt(i)[1] if ln.input_tokens is None else ln.input_tokens
                  for i, ln in enumerate(self.lines)]  # fmt: skip
        outputs = [line.output_tokens for line in self.lines]
        offsets = self.offsets()
        return self._meta(
            f"trace {self.source}",
            requests=len(self.lines),
            input_lengths=_spread(inputs),
            output_lengths=_spread(outputs),
            kinds=dict(Counter(line.kind or "trace" for line in self.lines)),
            duration_s=None if offsets is None else offsets[-1],
        )


def _spread(values: Sequence[int]) -> str:
    return f"from trace: {min(values)}–{max(values)} (mean {sum(values) / len(values):.1f})"
