"""How fast requests may arrive at random (Poisson) at one replica before their wait
in its queue breaks a latency SLO (``switchyard plan``'s capacity under open arrivals).

A closed loop at concurrency c measures a replica's capacity with no queue: a new
request starts the moment one ends. Real arrivals are random; at the same average rate
some wait for one of the c slots, and that wait adds to their TTFT (and E2E). Rule: the
replica is c servers (its concurrency) each taking the measured service time ``S`` (the
point's median E2E); requests arrive as a Poisson process at rate λ (M/M/c). Erlang C:
with a = λS and c > a,

    P(wait > 0) = C(c, a) = (a^c / c! · c / (c − a)) / (Σ_{k<c} a^k / k! + a^c / c! · c / (c − a))
    P(wait > t) = C(c, a) · exp(−(c / S − λ) · t)

The wait budget is what the SLO leaves above the point's own p95 (TTFT limit − TTFT p95,
else E2E limit − E2E p95). ``max_rate`` is the largest λ with P(wait > budget) ≤ tail
(bisection). Exponential service times wait longer than the near-constant ones of a
fixed workload, so the rate is on the safe side.

Parameters: tail = 0.05 (the p95), 60 bisection steps.
"""

from __future__ import annotations

import math

TAIL = 0.05


def erlang_c(servers: int, load: float) -> float:
    """P(an arrival waits) in M/M/c with ``servers`` = c and offered ``load`` = a < c."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    top = load**servers / math.factorial(servers) * servers / (servers - load)
    bottom = sum(load**k / math.factorial(k) for k in range(servers)) + top
    return top / bottom


def wait_tail(rate: float, servers: int, service_s: float, budget_s: float) -> float:
    """P(wait > budget) at arrival ``rate`` (1 at or above saturation)."""
    load = rate * service_s
    if load >= servers:
        return 1.0
    return erlang_c(servers, load) * math.exp(-(servers / service_s - rate) * budget_s)


def max_rate(servers: int, service_s: float, budget_s: float, tail: float = TAIL) -> float:
    """The largest arrival rate whose P(wait > budget) is at most ``tail``; 0 when the
    budget is not positive."""
    if budget_s <= 0 or service_s <= 0 or servers < 1:
        return 0.0
    low, high = 0.0, servers / service_s
    for _ in range(60):
        mid = (low + high) / 2
        if wait_tail(mid, servers, service_s, budget_s) <= tail:
            low = mid
        else:
            high = mid
    return low
