"""app.fairness.vtc: the order the Virtual Token Counter serves, by hand-computed cases."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.fairness.vtc import Vtc

# A case is a script: ("push", tenant[, share]), ("pop", expected tenant or None),
# ("charge", tenant, prompt tokens, output tokens), ("counter", tenant, expected).
CASES: list[tuple[str, list[tuple[Any, ...]]]] = [
    ("the smallest counter goes next", [
        ("push", "A"), ("push", "A"), ("push", "B"),
        ("pop", "A"),  # 0 = 0: A's head arrived first
        ("charge", "A", 0, 5), ("counter", "A", 10.0),  # output weight 2
        ("pop", "B"), ("charge", "B", 2, 0), ("counter", "B", 2.0),
        ("pop", "A"), ("pop", None),
    ]),
    ("ties go to the head that arrived first", [
        ("push", "B"), ("push", "A"), ("pop", "B"), ("pop", "A"),
    ]),
    ("a tenant back from idle is lifted to the smallest backlogged counter", [
        ("push", "A"), ("charge", "A", 0, 50), ("counter", "A", 100.0),
        ("push", "B"), ("counter", "B", 100.0),  # not 0: idle time banks no credit
        ("pop", "A"),  # 100 = 100: A's head arrived first
        ("pop", "B"),
    ]),
    ("with no one backlogged, lifted to the tenant served last", [
        ("push", "A"), ("pop", "A"), ("charge", "A", 0, 10),
        ("push", "B"), ("counter", "B", 20.0),
    ]),
    ("a counter above the others is kept", [
        ("charge", "B", 50, 0), ("push", "A"), ("push", "B"), ("counter", "B", 50.0),
        ("pop", "A"), ("pop", "B"),
    ]),
    ("a waiting tenant is not lifted by its own next request", [
        ("push", "A"), ("push", "B"), ("charge", "B", 30, 0),
        ("push", "B"), ("counter", "B", 30.0), ("pop", "A"), ("pop", "B"), ("pop", "B"),
    ]),
    ("a larger share grows the counter more slowly", [
        ("push", "A", 2.0), ("push", "B", 1.0),
        ("charge", "A", 0, 10), ("charge", "B", 0, 10),
        ("counter", "A", 10.0), ("counter", "B", 20.0),
        ("push", "A", 2.0), ("pop", "A"), ("pop", "A"), ("pop", "B"),
    ]),
]  # fmt: skip


@pytest.mark.parametrize("script", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_vtc_order(script: list[tuple[Any, ...]]) -> None:
    vtc: Vtc[int] = Vtc()
    n = 0
    for op, *args in script:
        if op == "push":
            n += 1
            vtc.push(args[0], n, *args[1:])
        elif op == "pop":
            got = vtc.pop()
            assert (got[0] if got is not None else None) == args[0]
        elif op == "charge":
            vtc.charge(*args)
        else:
            assert vtc.counter(args[0]) == pytest.approx(args[1])


@pytest.mark.parametrize(
    ("weights", "prompt", "output", "expected"),
    [((1.0, 2.0), 10, 5, 20.0), ((0.5, 1.0), 10, 5, 10.0), ((0.0, 1.0), 1000, 3, 3.0)],
)
def test_weights(weights: tuple[float, float], prompt: int, output: int, expected: float) -> None:
    vtc: Vtc[int] = Vtc(*weights)
    assert vtc.charge("A", prompt, output) == expected  # the weighted tokens
    assert vtc.counter("A") == expected


def test_a_request_that_leaves_while_waiting_is_removed_once() -> None:
    vtc: Vtc[object] = Vtc()
    mine, other = object(), object()
    vtc.push("A", mine)
    vtc.push("A", other)
    assert vtc.remove("A", mine) and not vtc.remove("A", mine)
    assert not vtc.remove("Z", mine)
    assert (vtc.waiting("A"), vtc.waiting()) == (1, 1)
    assert vtc.pop() == ("A", other)


def test_the_newest_waiter_of_any_tenant_is_the_one_shed() -> None:
    vtc: Vtc[str] = Vtc()
    assert vtc.pop_newest() is None
    vtc.push("A", "a1")
    vtc.push("B", "b1", share=3.0)
    vtc.push("A", "a2")
    assert vtc.backlogged_shares() == {"A": 1.0, "B": 3.0}
    assert vtc.pop_newest("B") == ("B", "b1")
    assert vtc.pop_newest("B") is None
    assert vtc.pop_newest() == ("A", "a2")
    assert vtc.backlogged_shares() == {"A": 1.0}
    assert vtc.pop_newest() == ("A", "a1")


@pytest.mark.parametrize("bad", [(-1.0, 2.0), (1.0, 0.0)])
def test_weights_are_checked(bad: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        Vtc(*bad)


def test_a_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match="share"):
        Vtc[int]().push("A", 1, share=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_two_backlogged_tenants_stay_within_one_request_of_each_other(seed: int) -> None:
    """Served one at a time, each charged its whole request when it goes: the gap
    between the two tenants' weighted service never exceeds the largest request's
    weighted tokens (VTC's bound, shares 1)."""
    rng = random.Random(seed)
    vtc: Vtc[tuple[int, int]] = Vtc()
    sizes = {t: [(rng.randint(1, 400), rng.randint(1, 200)) for _ in range(200)] for t in "AB"}
    for t, reqs in sizes.items():
        for r in reqs:
            vtc.push(t, r)
    largest = max(p + 2 * q for reqs in sizes.values() for p, q in reqs)
    served = {"A": 0.0, "B": 0.0}
    while vtc.waiting("A") and vtc.waiting("B"):
        got = vtc.pop()
        assert got is not None
        tenant, (p, q) = got
        vtc.charge(tenant, p, q)
        served[tenant] += p + 2 * q
        assert abs(served["A"] - served["B"]) <= largest
