"""Replica decisions handed from the router to the ingress of the same process, by
gateway request id (the router runs on Ray's router thread, the ingress on its own
loop). Bounded: decisions nobody takes are dropped oldest first."""

from __future__ import annotations

import threading
from collections import OrderedDict

from app.scheduler.loop import Decision

DECISIONS_KEPT = 10_000
_decisions: OrderedDict[str, Decision] = OrderedDict()
_lock = threading.Lock()


def keep_decision(request_id: str, decision: Decision) -> None:
    with _lock:
        _decisions[request_id] = decision
        while len(_decisions) > DECISIONS_KEPT:
            _decisions.popitem(last=False)


def take_decision(request_id: str) -> Decision | None:
    """The replica decision of a gateway request id (once; None if none was made here)."""
    with _lock:
        return _decisions.pop(request_id, None)
