# Outlier ejection: a per-replica circuit breaker, one per router (Envoy's outlier
# detection, on the legs this process judged).
#
# Rule. A caller that judges a leg's outcome reports it by the gateway request id the
# router routed (the P/D stream reports its prefill legs: a failure or a missed deadline
# of the prefill or of the KV hand-off is a failure; a decode leg's first delta after the
# hand-off is a success). A replica whose last ``consecutive_failures`` reported legs
# all failed is ejected for ``cooldown_s``: the scheduler leaves it out of the candidates
# while another replica remains (with none left, the caller decides; the P/D rule then
# serves the request whole on the decode side). After the cooldown the replica is a
# candidate again but keeps its failure count, so one more failure ejects it again at
# once; one success resets the count. A deployment nobody reports on is never ejected.
# Where a request went is remembered for the last ``ROUTES_KEPT`` routed requests.
#
# Parameters: consecutive_failures (default 3), cooldown_s (default 30), ROUTES_KEPT.
"""``Ejections``: which replicas of one deployment are left out for failing."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

ROUTES_KEPT = 10_000


class Ejections:
    """The failure counts and ejections of one deployment's replicas (module comment).
    Routing writes from Ray's router thread and reports come from the ingress loop: every
    method takes the lock."""

    def __init__(
        self,
        consecutive_failures: int = 3,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consecutive_failures = consecutive_failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._routes: OrderedDict[str, str] = OrderedDict()  # request id -> replica
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}  # ejected replica -> end of its cooldown
        self.ejected_total = 0

    def routed(self, request_id: str, replica: str) -> None:
        with self._lock:
            self._routes[request_id] = replica
            self._routes.move_to_end(request_id)
            while len(self._routes) > ROUTES_KEPT:
                self._routes.popitem(last=False)

    def report(self, request_id: str, ok: bool) -> str | None:
        """The outcome of the leg routed as ``request_id``; the replica it ran on, or
        None when this router did not route it (or forgot it)."""
        with self._lock:
            replica = self._routes.pop(request_id, None)
            if replica is None:
                return None
            if ok:
                self._failures.pop(replica, None)
                self._until.pop(replica, None)
                return replica
            n = self._failures.get(replica, 0) + 1
            self._failures[replica] = n
            if n >= self.consecutive_failures:
                self._until[replica] = self._clock() + self.cooldown_s
                self.ejected_total += 1
            return replica

    def ejected(self, replica: str) -> bool:
        with self._lock:
            return self._ejected(replica, self._clock())

    def _ejected(self, replica: str, now: float) -> bool:
        until = self._until.get(replica)
        if until is None:
            return False
        if now >= until:
            del self._until[replica]  # a candidate again; the count stays
            return False
        return True

    def available(self, replicas: Sequence[str]) -> list[str]:
        """``replicas`` less the ejected ones, in order."""
        with self._lock:
            now = self._clock()
            return [r for r in replicas if not self._ejected(r, now)]

    def drop(self, replica: str) -> None:
        """The replica left the deployment."""
        with self._lock:
            self._failures.pop(replica, None)
            self._until.pop(replica, None)
            for rid in [k for k, r in self._routes.items() if r == replica]:
                del self._routes[rid]
