"""Outlier ejection (app.scheduler.ejection): consecutive failures eject a replica for
the cooldown, one more failure after it ejects again, a success clears it; and the
scheduler leaves ejected replicas out while another remains."""

from __future__ import annotations

import pytest

from app.scheduler import ejection
from app.scheduler.config import ReplicaRouting
from app.scheduler.ejection import Ejections
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def judged(e: Ejections, replica: str, outcomes: str, start: int = 0) -> None:
    """Route one leg per character to ``replica`` and report it: ``x`` failed, ``o`` ok."""
    for i, mark in enumerate(outcomes, start):
        e.routed(f"{replica}-{i}", replica)
        assert e.report(f"{replica}-{i}", mark == "o") == replica


@pytest.mark.parametrize(
    ("outcomes", "ejected"),
    [
        ("", False),
        ("xx", False),
        ("xxx", True),
        ("xxox", False),  # a success in between resets the count
        ("xxxo", False),  # a success (a leg already in flight) clears the ejection
        ("oooxxx", True),
    ],
)
def test_consecutive_failures_eject(outcomes: str, ejected: bool) -> None:
    e = Ejections(consecutive_failures=3, cooldown_s=30, clock=Clock())
    judged(e, "p0", outcomes)
    assert e.ejected("p0") is ejected
    assert e.available(["p0", "p1"]) == (["p1"] if ejected else ["p0", "p1"])


def test_after_the_cooldown_one_more_failure_ejects_again_and_one_success_clears() -> None:
    clock = Clock()
    e = Ejections(consecutive_failures=3, cooldown_s=30, clock=clock)
    judged(e, "p0", "xxx")
    clock.now = 29.9
    assert e.ejected("p0")
    clock.now = 30.0
    assert not e.ejected("p0")  # a candidate again
    judged(e, "p0", "x", start=10)
    assert e.ejected("p0")  # at once: the count was kept
    assert e.ejected_total == 2
    clock.now = 61.0
    judged(e, "p0", "o", start=20)
    judged(e, "p0", "xx", start=30)
    assert not e.ejected("p0")  # the success reset the count: two failures are not three


def test_a_leg_this_router_did_not_route_reports_nothing() -> None:
    e = Ejections(consecutive_failures=1, cooldown_s=30, clock=Clock())
    assert e.report("unknown", False) is None
    e.routed("a", "p0")
    assert e.report("a", True) == "p0"
    assert e.report("a", False) is None  # judged once
    assert not e.ejected("p0")


def test_a_replica_that_left_is_forgotten_and_routes_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    e = Ejections(consecutive_failures=1, cooldown_s=30, clock=Clock())
    judged(e, "p0", "x")
    e.routed("pending", "p0")
    e.drop("p0")
    assert not e.ejected("p0") and e.report("pending", False) is None
    monkeypatch.setattr(ejection, "ROUTES_KEPT", 2)
    for rid in ("a", "b", "c"):
        e.routed(rid, "p1")
    assert e.report("a", False) is None  # the oldest was dropped
    assert e.report("c", True) == "p1"


def test_the_scheduler_leaves_an_ejected_replica_out_while_another_remains() -> None:
    routing = ReplicaRouting.model_validate({"ejection": {"consecutive_failures": 2}})
    s = Scheduler(routing)
    s.set_replicas(["p0", "p1"])
    for i in range(2):  # two legs went to p0 and failed
        leg = RoutedRequest(f"leg{i}")
        s.routed(f"ray-{i}", leg, "p0")
        s.ejections.report(leg.key, False)
    picks = {s.decide(RoutedRequest(f"k{i}"), ["p0", "p1"]).replica for i in range(40)}
    assert picks == {"p1"}
    d = s.decide(RoutedRequest("alone"), ["p0"])  # nothing else: the ejected one
    assert d.replica == "p0"
    s.set_replicas(["p1"])  # p0 left: its ejection is forgotten with it
    assert not s.ejections.ejected("p0")


def test_ejection_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ReplicaRouting.model_validate({"ejection": {"consecutive_failures": 0}})
    with pytest.raises(ValueError, match="Extra inputs"):
        ReplicaRouting.model_validate({"ejection": {"failures": 3}})
