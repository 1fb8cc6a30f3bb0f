# Fair queuing across tenants for one saturated pool: the Virtual Token Counter (VTC)
# of Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024).
#
# Rule. Each tenant t has a counter c_t: the weighted service it has received divided
# by its share s_t. Serving p prompt tokens and q output tokens for t adds
# (w_in·p + w_out·q) / s_t to c_t. While the pool is saturated, requests wait in one
# FIFO per tenant, and the next to go is the head of the backlogged tenant with the
# smallest counter; ties go to the head that arrived first. When a tenant with
# nothing waiting gets a request, its counter is lifted so idle time banks no
# credit:
#   - with others backlogged, to max(c_t, min c over them);
#   - with no one backlogged, to max(c_t, c of the tenant served last).
# (This is the paper's Algorithm 2. Its proof bounds the gap in weighted service
# between two backlogged tenants by a constant: the largest request's weighted
# tokens, in each tenant's own units.) Counters charge service as it is received. At
# dispatch the request's prompt is charged (w_in·p). Output is charged as it streams
# (w_out per token), so a long answer does not pay in advance for tokens it may never
# produce.
#
# Parameters: input_weight w_in (1.0) and output_weight w_out (2.0), the paper's
# values (an output token costs a decode step, a prompt token a share of one
# prefill); share s_t per tenant (1.0; a plan's share is its weight in the pool).
"""``Vtc``: per-tenant FIFOs served in order of the virtual token counter."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

INPUT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0


@dataclass
class _Tenant(Generic[T]):
    share: float
    counter: float = 0.0
    queue: deque[tuple[int, T]] = field(default_factory=deque)


class Vtc(Generic[T]):
    """The waiting requests of one pool and every tenant's counter. Not thread-safe:
    one event loop owns it."""

    def __init__(
        self, input_weight: float = INPUT_WEIGHT, output_weight: float = OUTPUT_WEIGHT
    ) -> None:
        if input_weight < 0 or output_weight <= 0:
            raise ValueError("VTC weights: input ≥ 0, output > 0")
        self.input_weight, self.output_weight = input_weight, output_weight
        self._tenants: dict[str, _Tenant[T]] = {}
        self._arrivals = itertools.count()
        self._last_served: str | None = None

    def push(self, tenant: str, item: T, share: float = 1.0) -> None:
        """``item`` waits at the back of ``tenant``'s queue (``share``: the tenant's
        weight in the pool, updated on every push)."""
        if share <= 0:
            raise ValueError(f"tenant {tenant!r}: share must be > 0")
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(share)
        t.share = share
        if not t.queue:
            t.counter = max(t.counter, self._lift_to(tenant))
        t.queue.append((next(self._arrivals), item))

    def _lift_to(self, tenant: str) -> float:
        others = [t.counter for name, t in self._tenants.items() if t.queue and name != tenant]
        if others:
            return min(others)
        last = self._tenants.get(self._last_served or "")
        return last.counter if last is not None else 0.0

    def pop(self, eligible: Callable[[str], bool] | None = None) -> tuple[str, T] | None:
        """The next request by the rule, removed from its queue; None when none waits.
        ``eligible``: only tenants it accepts are considered. Charges nothing
        (``charge`` does, as service is received)."""
        best: tuple[float, int, str] | None = None
        for name, t in self._tenants.items():
            if t.queue and (eligible is None or eligible(name)):
                key = (t.counter, t.queue[0][0], name)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        name = best[2]
        _, item = self._tenants[name].queue.popleft()
        self._last_served = name
        return name, item

    def pop_newest(self, tenant: str | None = None) -> tuple[str, T] | None:
        """The latest arrival of any tenant (of ``tenant`` only, when given), removed
        (shedding takes the newest); None when none waits."""
        newest: tuple[int, str] | None = None
        for name, t in self._tenants.items():
            if tenant is not None and name != tenant:
                continue
            if t.queue and (newest is None or t.queue[-1][0] > newest[0]):
                newest = (t.queue[-1][0], name)
        if newest is None:
            return None
        return newest[1], self._tenants[newest[1]].queue.pop()[1]

    def backlogged_shares(self) -> dict[str, float]:
        """The share of each tenant with requests waiting."""
        return {name: t.share for name, t in self._tenants.items() if t.queue}

    def remove(self, tenant: str, item: T) -> bool:
        """Take a waiting ``item`` out (its client left, or it was shed); False when it
        is not waiting."""
        t = self._tenants.get(tenant)
        if t is None:
            return False
        for entry in t.queue:
            if entry[1] is item:
                t.queue.remove(entry)
                return True
        return False

    def charge(self, tenant: str, prompt_tokens: int = 0, output_tokens: int = 0) -> float:
        """``tenant`` received this service: its counter grows by the weighted tokens
        over its share. Returns the weighted tokens."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(1.0)
        cost = self.input_weight * prompt_tokens + self.output_weight * output_tokens
        t.counter += cost / t.share
        return cost

    def counter(self, tenant: str) -> float:
        t = self._tenants.get(tenant)
        return t.counter if t is not None else 0.0

    def waiting(self, tenant: str | None = None) -> int:
        """Requests waiting: of ``tenant``, or of every tenant."""
        if tenant is not None:
            t = self._tenants.get(tenant)
            return len(t.queue) if t is not None else 0
        return sum(len(t.queue) for t in self._tenants.values())
