"""The two-leg stream of a disaggregated pool on two simulated engines with the
hand-off on (app.disagg.stream): remote, local, every fallback, and cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from app.disagg.rule import PdChoice
from app.disagg.stream import PdStream
from app.dispatch.pools import UpstreamStream
from app.engine.protocol import (
    EngineOverloaded,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    KvHandoff,
    SamplingOptions,
)
from app.engine.simulated import SimulatedEngine, SimulationProfile

PROFILE = SimulationProfile(
    kv_connector=True,
    prefill_s_per_token=0.0001,
    decode_base_s=0.001,
    decode_s_per_seq=0.0,
    block_size=16,
    transfer_base_s=0.001,
)
REMOTE = PdChoice("remote", "long_uncached", 600)
LOCAL = PdChoice("local", "short", 20)


def request(rid: str = "r1", n: int = 600, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        prompt_token_ids=tuple(range(7, 7 + n)),
        sampling=SamplingOptions(temperature=0.0, ignore_eos=True),
        max_tokens=max_tokens,
    )


class Pair:
    """A prefill engine and a decode engine, with the legs a PdStream starts."""

    def __init__(self) -> None:
        self.p = SimulatedEngine(PROFILE)
        self.d = SimulatedEngine(PROFILE)
        self.prefill_calls = 0
        self.decode_calls: list[KvHandoff | None] = []
        self.prefill_task: asyncio.Task[KvHandoff] | None = None

    async def __aenter__(self) -> Pair:
        await self.p.start()
        await self.d.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.p.shutdown()
        await self.d.shutdown()

    def stream(self, choice: PdChoice, req: GenerationRequest, **kw: Any) -> PdStream:
        def start_prefill() -> asyncio.Task[KvHandoff]:
            self.prefill_calls += 1
            self.prefill_task = asyncio.ensure_future(self.p.prefill(req))
            return self.prefill_task

        def start_decode(handoff: KvHandoff | None) -> UpstreamStream:
            self.decode_calls.append(handoff)
            return UpstreamStream(self.d.generate(replace(req, handoff=handoff)))

        kw.setdefault("start_prefill", start_prefill)
        return PdStream(
            choice,
            kw.pop("start_prefill"),
            kw.pop("start_decode", start_decode),
            prefill_deadline_s=kw.pop("prefill_deadline_s", 5.0),
            transfer_deadline_s=kw.pop("transfer_deadline_s", 5.0),
            **kw,
        )


async def drain(stream: PdStream) -> list[GenerationDelta]:
    out = [await stream.__anext__()]
    while out[-1].finish_reason is None:
        out.append(await stream.__anext__())
    return out


def text(deltas: list[GenerationDelta]) -> str:
    return "".join(d.text for d in deltas)


async def unified(req: GenerationRequest) -> list[GenerationDelta]:
    engine = SimulatedEngine(PROFILE)
    await engine.start()
    try:
        return [d async for d in engine.generate(req)]
    finally:
        await engine.shutdown()


async def test_remote_prefills_there_and_decodes_here_with_the_same_tokens() -> None:
    req = request()
    async with Pair() as pair:
        s = pair.stream(REMOTE, req)
        got = await drain(s)
        p, d = pair.p.stats().extra, pair.d.stats().extra
    want = await unified(req)
    assert text(got) == text(want) and sum(x.num_new_tokens for x in got) == 8
    assert s.outcome.served == "remote" and s.outcome.fallback is None
    assert s.outcome.prefill_s is not None and s.outcome.handoff_s is not None
    assert p["prefills_total"] == 1 and d["prefills_total"] == 0
    assert d["kv_transfers_total"] == 1 and d["kv_transfer_tokens_total"] == 600
    assert d["kv_transfer_bytes_total"] == 600 * PROFILE.kv_bytes_per_token
    # Billed as what the prefill engine reused (nothing), not the decode engine's pull.
    assert got[0].prompt_tokens == 600 and got[0].cached_prompt_tokens == 0
    assert s.outcome.header() == "pd=remote; pd_reason=long_uncached"


async def test_local_never_calls_the_prefill_role() -> None:
    async with Pair() as pair:
        s = pair.stream(LOCAL, request(n=20))
        got = await drain(s)
        assert pair.prefill_calls == 0 and pair.decode_calls == [None]
        assert pair.d.stats().extra["kv_transfers_total"] == 0
    assert got[-1].finish_reason == "length"
    assert s.outcome.header() == "pd=local; pd_reason=short"


async def hang() -> KvHandoff:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def overloaded() -> KvHandoff:
    raise EngineOverloaded("256 waiting")


async def invalid() -> KvHandoff:
    raise InvalidRequest("bad logit_bias", "logit_bias")


@pytest.mark.parametrize(
    ("prefill", "fallback"),
    [(hang, "prefill_timeout"), (overloaded, "prefill_error")],
)
async def test_a_failed_prefill_leg_is_served_locally_once(prefill: Any, fallback: str) -> None:
    req = request()
    started: list[asyncio.Task[KvHandoff]] = []

    def start() -> asyncio.Task[KvHandoff]:
        started.append(asyncio.ensure_future(prefill()))
        return started[-1]

    async with Pair() as pair:
        s = pair.stream(REMOTE, req, start_prefill=start, prefill_deadline_s=0.2)
        got = await drain(s)
        assert pair.decode_calls == [None]  # one local attempt, without a hand-off
        assert pair.d.stats().finished_total == 1
    assert started[0].cancelled() or started[0].exception() is not None
    assert text(got) == text(await unified(req))
    assert s.outcome.served == "local" and s.outcome.fallback == fallback
    assert s.outcome.header() == f"pd=local; pd_reason=fallback_{fallback}"


async def test_a_request_the_prefill_refuses_as_invalid_is_not_retried_locally() -> None:
    async with Pair() as pair:
        s = pair.stream(REMOTE, request(), start_prefill=lambda: asyncio.ensure_future(invalid()))
        with pytest.raises(InvalidRequest):
            await s.__anext__()
        assert pair.decode_calls == []


async def test_a_decode_leg_failing_before_its_first_token_falls_back_once() -> None:
    async with Pair() as pair:
        calls: list[KvHandoff | None] = []

        def start_decode(handoff: KvHandoff | None) -> UpstreamStream:
            calls.append(handoff)
            if handoff is not None:  # the pull fails

                async def broken() -> AsyncIterator[GenerationDelta]:
                    raise ConnectionError("NIXL handshake failed")
                    yield  # pragma: no cover

                return UpstreamStream(broken())
            return UpstreamStream(pair.d.generate(request()))

        s = pair.stream(REMOTE, request(), start_decode=start_decode)
        got = await drain(s)
    assert [c is not None for c in calls] == [True, False]
    assert s.outcome.fallback == "transfer_error" and got[-1].finish_reason == "length"


@pytest.mark.parametrize("leg", ["prefill", "transfer"])
async def test_the_hand_off_fits_in_half_the_attempts_budget_whatever_its_deadlines(
    leg: str,
) -> None:
    """A hand-off that hangs, with deadlines far beyond the dispatch budget: the remote
    legs are cut at half the budget, so the local attempt keeps the other half."""
    timers: list[float] = []

    async def sleep(seconds: float) -> None:
        timers.append(seconds)
        await asyncio.sleep(seconds)

    async with Pair() as pair:
        kw: dict[str, Any] = {}
        if leg == "prefill":
            kw["start_prefill"] = lambda: asyncio.ensure_future(hang())
        else:

            def start_decode(handoff: KvHandoff | None) -> UpstreamStream:
                pair.decode_calls.append(handoff)
                if handoff is None:
                    return UpstreamStream(pair.d.generate(request()))

                async def stuck() -> AsyncIterator[GenerationDelta]:
                    await asyncio.sleep(3600)
                    yield  # pragma: no cover

                return UpstreamStream(stuck())

            kw["start_decode"] = start_decode
        s = pair.stream(REMOTE, request(), prefill_deadline_s=3600, transfer_deadline_s=3600,
                        budget_s=0.4, sleep=sleep, clock=lambda: 0.0, **kw)  # fmt: skip
        got = await drain(s)
    assert timers == ([0.2] if leg == "prefill" else [0.2, 0.2])
    assert s.outcome.fallback == f"{leg}_timeout" and got[-1].finish_reason == "length"


async def test_cancel_during_prefill_aborts_it_and_starts_no_decode() -> None:
    async with Pair() as pair:
        s = pair.stream(REMOTE, request(n=1500))
        first = asyncio.ensure_future(s.__anext__())
        for _ in range(50):
            if pair.p.stats().running:
                break
            await asyncio.sleep(0.001)
        assert pair.p.stats().running == 1
        s.cancel()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(0.01)
        assert pair.prefill_task is not None and pair.prefill_task.cancelled()
        assert pair.p.stats().running == 0 and pair.p.stats().aborted_total == 1
        assert pair.decode_calls == []


async def test_cancel_during_decode_frees_the_decode_engine() -> None:
    async with Pair() as pair:
        s = pair.stream(REMOTE, request(max_tokens=500))
        await s.__anext__()
        assert pair.d.stats().running == 1
        s.cancel()
        await asyncio.sleep(0.01)
        assert pair.d.stats().running == 0 and pair.d.stats().aborted_total == 1
        assert pair.p.stats().running == 0  # the prefill leg had already finished


async def broken_pull() -> AsyncIterator[GenerationDelta]:
    raise ConnectionError("NIXL transfer failed")
    yield  # pragma: no cover


@pytest.mark.parametrize(
    ("choice", "prefill", "pull_fails", "verdicts"),
    [
        (REMOTE, None, False, [True]),  # the hand-off worked
        (REMOTE, overloaded, False, [False]),
        (REMOTE, hang, False, [False]),  # past the prefill deadline
        (REMOTE, None, True, [False]),  # the KV never arrived
        (REMOTE, invalid, False, []),  # the client's fault judges no replica
        (LOCAL, None, False, []),  # no prefill leg
    ],
)
async def test_each_hand_off_is_judged_once_for_the_prefill_replica(
    choice: PdChoice, prefill: Any, pull_fails: bool, verdicts: list[bool]
) -> None:
    got: list[bool] = []
    async with Pair() as pair:
        kw: dict[str, Any] = {"judged": got.append, "prefill_deadline_s": 0.2}
        if prefill is not None:
            kw["start_prefill"] = lambda: asyncio.ensure_future(prefill())
        if pull_fails:

            def start_decode(handoff: KvHandoff | None) -> UpstreamStream:
                if handoff is not None:
                    return UpstreamStream(broken_pull())
                return UpstreamStream(pair.d.generate(request()))

            kw["start_decode"] = start_decode
        s = pair.stream(choice, request(), **kw)
        with contextlib.suppress(InvalidRequest):  # the client's fault is raised
            await drain(s)
    assert got == verdicts
