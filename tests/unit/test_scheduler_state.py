"""The books a replica router keeps (app.scheduler.state): prompt tokens pending prefill
by replica, moved, ended once, dropped with their replica; and the load book's
bookings released by Ray's completion through the router."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.request import Caller, InferenceRequest, Prompt
from app.scheduler.ray_router import SwitchyardRouter, routed_request
from app.scheduler.state import PrefillBook

R = ["r0", "r1", "r2"]


@pytest.mark.parametrize(
    ("steps", "pending"),
    [
        ([("start", "a", "r0", 100)], [100, 0, 0]),
        ([("start", "a", "r0", 100), ("start", "b", "r0", 50)], [150, 0, 0]),
        ([("start", "a", "r0", 100), ("done", "a")], [0, 0, 0]),
        ([("start", "a", "r0", 100), ("done", "a"), ("done", "a")], [0, 0, 0]),  # once
        ([("start", "a", "r0", 100), ("done", "zz")], [100, 0, 0]),  # unknown key
        ([("start", "a", "r0", 100), ("start", "a", "r2", 100)], [0, 0, 100]),  # moved
        ([("start", "a", "r0", 0)], [0, 0, 0]),  # all cached: nothing to compute
        ([("start", "a", "r1", 30), ("start", "b", "r2", 5), ("drop", "r1")], [0, 0, 5]),
        ([("start", "a", "r1", 30), ("drop", "r1"), ("done", "a")], [0, 0, 0]),
    ],
)
def test_pending_prefill(steps: list[tuple[Any, ...]], pending: list[int]) -> None:
    book = PrefillBook()
    for op, *args in steps:
        getattr(book, op)(*args)
    assert book.pending(R) == pending


def test_the_router_ends_a_pending_prefill_when_ray_reports_the_request_done() -> None:
    router = SwitchyardRouter.__new__(SwitchyardRouter)  # Ray's own state is not needed
    router._deployment_id = SimpleNamespace(name="LLMServer-state")  # type: ignore[assignment]
    router.initialize_state()
    request = InferenceRequest(id="g-1", endpoint="chat", model="m", caller=Caller("acme"),
                               prompt=Prompt(text="x" * 40))  # fmt: skip
    routed = router._requests["ray-1"] = routed_request(request, router._config)
    router.scheduler.set_replicas(["r0", "r1"])
    router.scheduler.routed("ray-1", routed, "r1")
    assert router.scheduler.ctx.prefill.pending(["r0", "r1"]) == [0, 40]
    router.on_request_completed(SimpleNamespace(unique_id="r1"), "ray-1")  # type: ignore[arg-type]
    assert router.scheduler.ctx.prefill.pending(["r0", "r1"]) == [0, 0]
    assert router.scheduler.ctx.book.in_flight("r1") == 0
