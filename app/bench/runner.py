"""Arrival loops of the load generator.

* Open loop (``open_loop``): job ``k`` starts at ``stage start + offsets[k]`` whatever
  the server does; its latencies count from that intended time (no coordinated
  omission). A job that cannot start on time is late, and the lateness is recorded.
* Closed loop (``closed_loop``): ``users`` users; each starts its next job when the last
  one ended plus a think time (exponential with mean ``think_s``, seeded; 0 = none),
  until the stage's end. User starts are spread evenly over the warm-up window (a
  ramp-up, as k6 and Locust do), so users do not turn over in lockstep.
* A job is one request (``RequestJobs``) or one agentic session (``SessionJobs``: calls
  run one after another, each built from the previous output; a failed call ends the
  session). A job started in the warm-up window (its intended time before
  ``warmup_s``) is marked warm-up, all its records too, and left out of the aggregates.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.bench.client import Client
from app.bench.records import RequestRecord, RequestSpec


class RequestSource(Protocol):
    def request(self, index: int) -> RequestSpec: ...


class SessionPlanLike(Protocol):
    first: RequestSpec

    def next(self, step: int, previous_text: str) -> RequestSpec | None: ...


class SessionSource(Protocol):
    def session(self, index: int) -> SessionPlanLike: ...


@dataclass
class Recorder:
    """Every record of a run, and live counters for the progress display."""

    client: Client
    records: list[RequestRecord] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    done: int = 0
    failed: int = 0
    stage_label: str = ""
    windows: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every stage's measured window on the run clock: from the end of
    its warm-up to the end of its load."""
    recent_e2e: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _jobs: itertools.count[int] = field(default_factory=itertools.count)

    def clock(self) -> float:
        return self.client.clock()

    def next_job(self) -> int:
        return next(self._jobs)

    async def send(
        self,
        spec: RequestSpec,
        intended: float,
        stage: int,
        warmup: bool,
        session: int | None = None,
        step: int | None = None,
    ) -> RequestRecord:
        record = RequestRecord(
            index=next(self._ids),
            kind=spec.kind,
            endpoint=spec.endpoint,
            intended=intended,
            input_tokens=spec.input_tokens,
            max_tokens=spec.output_tokens,
            tenant=spec.tenant,
            session=session,
            step=step,
            stage=stage,
            warmup=warmup,
        )
        self.records.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.client.send(spec, record)
        finally:
            self.in_flight -= 1
            self.done += 1
        if record.ok and record.e2e is not None:
            self.recent_e2e.append(record.e2e)
        else:
            self.failed += 1
        return record


@dataclass
class RequestJobs:
    """One request per job."""

    source: RequestSource

    async def run(
        self, rec: Recorder, index: int, intended: float, stage: int, warmup: bool
    ) -> None:
        await rec.send(self.source.request(index), intended, stage, warmup)


@dataclass
class SessionJobs:
    """One agentic session per job: chained calls, each from the previous output."""

    source: SessionSource

    async def run(
        self, rec: Recorder, index: int, intended: float, stage: int, warmup: bool
    ) -> None:
        plan = self.source.session(index)
        spec: RequestSpec | None = plan.first
        step = 0
        while spec is not None:
            record = await rec.send(spec, intended, stage, warmup, session=index, step=step)
            if not record.ok:
                return
            step += 1
            spec = plan.next(step, record.text)
            intended = rec.clock()


class Jobs(Protocol):
    async def run(
        self, rec: Recorder, index: int, intended: float, stage: int, warmup: bool
    ) -> None: ...


async def open_loop(
    rec: Recorder, jobs: Jobs, offsets: Sequence[float], *, stage: int, warmup_s: float
) -> float:
    """Start one job at each offset (s after now); wait for all of them. Returns the
    stage's start on the run clock (offsets count from it)."""
    start = rec.clock()
    tasks: set[asyncio.Task[None]] = set()
    for offset in offsets:
        due = start + offset
        delay = due - rec.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(jobs.run(rec, rec.next_job(), due, stage, offset < warmup_s))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
    return start


async def closed_loop(
    rec: Recorder,
    jobs: Jobs,
    users: int,
    *,
    stage: int,
    warmup_s: float,
    duration_s: float,
    think_s: float = 0.0,
    seed: int = 0,
    max_jobs: int | None = None,
) -> None:
    """``users`` users send jobs back to back for ``warmup_s + duration_s`` seconds."""
    start = rec.clock()
    end = start + warmup_s + duration_s
    started = itertools.count()
    spread = warmup_s

    async def user(u: int) -> None:
        rng = random.Random(seed * 1_000_003 + u)
        due = start + spread * u / users
        while True:
            if max_jobs is not None and next(started) >= max_jobs:
                return
            delay = due - rec.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if due >= end:
                return
            await jobs.run(rec, rec.next_job(), due, stage, due - start < warmup_s)
            due = rec.clock() + (rng.expovariate(1.0 / think_s) if think_s > 0 else 0.0)

    await asyncio.gather(*(user(u) for u in range(users)))
