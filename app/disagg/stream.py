# The two-leg stream of a disaggregated pool.
#
# Rule. With the choice ``remote`` (app.disagg.rule) the prefill leg runs first on a
# prefill replica and returns a KV hand-off; the decode leg then runs on a decode
# replica with it and streams every token. The hand-off is bounded twice:
#   * the prefill leg must return within ``prefill_deadline_s``;
#   * the decode leg's first delta must come within ``transfer_deadline_s`` after the
#     hand-off (the KV pull happens before it).
# When the prefill leg fails (any error but the client's own: an invalid request or a
# context overflow is raised, since serving it locally fails the same way), passes its
# deadline, or the decode leg with the hand-off fails or passes its deadline before its
# first delta, the leg is cancelled (which aborts its engine request) and the request is
# served whole by a decode replica: once. That local attempt is an ordinary decode leg
# without a hand-off. Nothing here bills: the ingress admitted the request once and
# settles it once from the deltas it streams, whichever legs ran. ``cancel`` (the client
# left) cancels whichever leg is running; a prefill leg's cancel aborts its engine
# request, a decode leg's cancel aborts its engine request.
#
# Both deadlines are also clipped to the attempt's first-token budget (what the ingress's
# dispatch has left, ``budget_s``): the two remote legs together use at most
# ``REMOTE_SHARE`` of it, so a local fallback always keeps the rest. Without the clip a
# hand-off that hangs could use the whole budget and the request would fail (503)
# where serving it locally would have answered.
#
# Each hand-off is judged once, for the prefill replica's circuit breaker (``judged``):
# a failed or late prefill leg, or a failed or late decode leg after it (the KV comes
# from the prefill engine), is a failure; the decode leg's first delta a success. A
# client's own fault or a cancel judges nothing.
#
# Parameters: prefill_deadline_s, transfer_deadline_s, budget_s, REMOTE_SHARE = 0.5.
"""``PdStream``: one request through a prefill leg and a decode leg, with a bounded
hand-off and a local fallback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from app.disagg.outcome import PdOutcome
from app.disagg.rule import PdChoice
from app.engine.protocol import ContextLengthExceeded, GenerationDelta, InvalidRequest, KvHandoff

REMOTE_SHARE = 0.5

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class DecodeStream(Protocol):
    def __anext__(self) -> Any: ...

    def cancel(self) -> None: ...


class PrefillCall(Protocol):
    """A started prefill leg (a Ray ``DeploymentResponse``, or a task in tests)."""

    def __await__(self) -> Any: ...

    def cancel(self) -> Any: ...


def client_fault(exc: BaseException) -> bool:
    """Errors a local attempt would repeat: the request itself is at fault."""
    cause = getattr(exc, "cause", None)
    return any(isinstance(e, InvalidRequest | ContextLengthExceeded) for e in (exc, cause))


class PdStream:
    """A ``PoolStream`` over a prefill leg and a decode leg (module comment)."""

    def __init__(
        self,
        choice: PdChoice,
        start_prefill: Callable[[], PrefillCall],
        start_decode: Callable[[KvHandoff | None], DecodeStream],
        *,
        prefill_deadline_s: float,
        transfer_deadline_s: float,
        budget_s: float | None = None,
        judged: Callable[[bool], None] | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self.choice = choice
        self._start_prefill = start_prefill
        self._start_decode = start_decode
        self._prefill_deadline_s = prefill_deadline_s
        self._transfer_deadline_s = transfer_deadline_s
        self._remote_s = None if budget_s is None else budget_s * REMOTE_SHARE
        self._judged = judged or (lambda ok: None)
        self._sleep = sleep
        self._clock = clock
        self._prefill: PrefillCall | None = None
        self._decode: DecodeStream | None = None
        self._cancelled = False
        self._started = False
        self.outcome = PdOutcome(choice, choice.mode)

    async def __anext__(self) -> GenerationDelta:
        if self._started:
            assert self._decode is not None
            delta: GenerationDelta = await self._decode.__anext__()
            return delta
        self._started = True
        return await self._first()

    def cancel(self) -> None:
        self._cancelled = True
        if self._prefill is not None:
            self._prefill.cancel()
        if self._decode is not None:
            self._decode.cancel()

    async def _first(self) -> GenerationDelta:
        if self.choice.mode == "local":
            return await self._local(None)
        started = self._clock()
        try:
            self._prefill = self._start_prefill()
            deadline = self._clipped(self._prefill_deadline_s, 0.0)
            handoff = await self._within(_awaited(self._prefill), deadline)
        except asyncio.CancelledError:
            self.cancel()
            raise
        except BaseException as exc:
            if client_fault(exc):
                raise
            self._stop_prefill()
            self._judged(False)
            return await self._local("prefill_timeout" if _timed_out(exc) else "prefill_error")
        self._prefill = None
        prefill_s = self._clock() - started
        self.outcome = replace(self.outcome, prefill_s=prefill_s)
        handed = self._clock()
        self._decode = self._start_decode(handoff)
        try:
            deadline = self._clipped(self._transfer_deadline_s, prefill_s)
            delta = await self._within(self._decode.__anext__(), deadline)
        except asyncio.CancelledError:
            self.cancel()
            raise
        except BaseException as exc:
            if client_fault(exc):
                raise
            self._decode.cancel()
            self._decode = None
            self._judged(False)
            return await self._local("transfer_timeout" if _timed_out(exc) else "transfer_error")
        self._judged(True)
        self.outcome = replace(self.outcome, handoff_s=self._clock() - handed)
        return _billed_as_prefilled(delta, handoff)

    async def _local(self, fallback: str | None) -> GenerationDelta:
        """The request served whole by a decode replica (the one attempt)."""
        if self._cancelled:
            raise asyncio.CancelledError
        if fallback is not None:
            self.outcome = replace(self.outcome, served="local", fallback=fallback)
        self._decode = self._start_decode(None)
        first: GenerationDelta = await self._decode.__anext__()
        return first

    def _clipped(self, deadline_s: float, used_s: float) -> float:
        """``deadline_s``, or less: what the remote share of the budget has left after
        ``used_s`` (module comment)."""
        if self._remote_s is None:
            return deadline_s
        return max(0.0, min(deadline_s, self._remote_s - used_s))

    def _stop_prefill(self) -> None:
        if self._prefill is not None:
            self._prefill.cancel()
            self._prefill = None

    async def _within(self, work: Awaitable[Any], seconds: float) -> Any:
        """``work``'s result, or ``TimeoutError`` after ``seconds`` of this stream's
        clock (the injected ``sleep``: virtual time in experiments)."""
        task = asyncio.ensure_future(work)
        timer = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            timer.cancel()
        if not task.done():
            task.cancel()
            raise TimeoutError(f"no answer within {seconds:g} s")
        return task.result()


async def _awaited(call: PrefillCall) -> KvHandoff:
    handoff: KvHandoff = await call
    return handoff


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


def _billed_as_prefilled(delta: GenerationDelta, handoff: KvHandoff) -> GenerationDelta:
    """The decode engine counts the pulled prompt as its own cache hit; the prompt was
    computed on the prefill engine, which reused only ``handoff.cached_prompt_tokens``:
    that is what the request is billed as cached. The prefill leg's engine time rides on
    the decode leg's first delta, so the two legs add up."""
    if handoff.gpu_seconds is not None:
        delta = replace(
            delta,
            gpu_seconds=(delta.gpu_seconds or 0.0) + handoff.gpu_seconds,
            gpu_cost_usd=(delta.gpu_cost_usd or 0.0) + (handoff.gpu_cost_usd or 0.0),
        )
    if not delta.prompt_tokens:
        return delta
    return replace(
        delta, cached_prompt_tokens=min(handoff.cached_prompt_tokens, delta.prompt_tokens)
    )
