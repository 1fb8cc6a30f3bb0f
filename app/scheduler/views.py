"""What the replica routers of this process know, read by the ingress of the same
process: a deployment's best prefix match for a prompt and its in-flight bookings (the
per-request prefill/decode rule, ``app.disagg.rule``); and what the ingress tells them
back: a leg's verdict (``report``) and a request's first token (``first_token``).

Ray builds one router per deployment handle, on its router thread; each registers its
scheduler here by deployment name. Reads run on the ingress loop while the router may be
changing its index: a read that meets a change in progress is retried, and after
``READ_TRIES`` gives up with nothing known (no match, no bookings). A deployment whose
router has not been built yet (no request went through this process's handle) is
unknown."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest

READ_TRIES = 3
T = TypeVar("T")

_schedulers: dict[str, Scheduler] = {}
_lock = threading.Lock()


def register(deployment: str, scheduler: Scheduler) -> None:
    with _lock:
        _schedulers[deployment] = scheduler


def scheduler_of(deployment: str) -> Scheduler | None:
    with _lock:
        return _schedulers.get(deployment)


def _read(read: Callable[[], T], nothing: T) -> T:
    for _ in range(READ_TRIES):
        try:
            return read()
        except RuntimeError:  # "changed size during iteration": the router is writing
            continue
    return nothing


def best_prefix_tokens(deployment: str, request: RoutedRequest) -> int:
    """Prompt tokens the best replica of ``deployment`` is believed to hold (0 when
    unknown)."""
    s = scheduler_of(deployment)
    if s is None or not request.hashes:
        return 0
    block = s.config.prefix.block_size

    def read() -> int:
        matched = s.ctx.index.match_all(request.hashes, s.replicas())
        return max(matched.values(), default=0) * block

    return _read(read, 0)


def in_flight(deployment: str, ejected: bool = True) -> list[int] | None:
    """Requests this process has in flight on each replica of ``deployment`` (None when
    its router is unknown here); ``ejected=False`` leaves out the ejected replicas (an
    empty list: every replica is ejected)."""
    s = scheduler_of(deployment)
    if s is None:
        return None
    book = s.ctx.book

    def read() -> list[int]:
        replicas = s.replicas() if ejected else s.ejections.available(s.replicas())
        return [book.in_flight(r) for r in replicas]

    nothing: list[int] = []
    return _read(read, nothing)


def report(deployment: str, request_id: str, ok: bool) -> str | None:
    """A caller's verdict on the leg of ``request_id`` that ``deployment``'s router
    routed (``app.scheduler.ejection``); the replica it ran on, if known here."""
    s = scheduler_of(deployment)
    return None if s is None else s.ejections.report(request_id, ok)


def first_token(deployment: str, request_id: str) -> None:
    """The request ``request_id`` that ``deployment``'s router routed had its first
    token: its prompt no longer counts as pending prefill there
    (``app.scheduler.plugins.prefill``)."""
    s = scheduler_of(deployment)
    if s is not None:
        s.first_token(request_id)
