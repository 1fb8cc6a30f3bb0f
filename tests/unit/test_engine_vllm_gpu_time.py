"""vLLM's metered scheduler (app.engine.vllm_gpu_time) over a stand-in for vLLM's
scheduler with the same four calls, and the front end's reading of its charges
(``Charge`` in app.engine.vllm_engine). The real engine: tests/integration/
test_vllm_engine.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from app.engine import vllm_gpu_time
from app.engine.vllm_engine import Charge
from app.engine.vllm_gpu_time import GPU_SECONDS_KEY, strip


@dataclass
class Req:
    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int = 0


@dataclass
class SchedOut:
    num_scheduled_tokens: dict[str, int]

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


@dataclass
class Out:
    request_id: str
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class Outs:
    outputs: list[Out] = field(default_factory=list)


class FakeScheduler:
    """vLLM's scheduler as the mixin sees it: ``schedule`` advances the requests'
    computed tokens, ``update_from_output`` makes one output per request (the finishing
    ones with a reason), ``finish_requests`` aborts."""

    def __init__(self, plan: list[dict[str, int]], finishing: list[set[str]]) -> None:
        self.requests: dict[str, Req] = {}
        self._plan, self._finishing = plan, finishing

    def schedule(self) -> SchedOut:
        step = self._plan.pop(0)
        for rid, n in step.items():
            self.requests[rid].num_computed_tokens += n
        return SchedOut(step)

    def get_grammar_bitmask(self, scheduler_output: SchedOut) -> None:
        return None

    def update_from_output(self, scheduler_output: SchedOut, model_runner_output: Any) -> Any:
        done = self._finishing.pop(0)
        outs = [
            Out(rid, "stop" if rid in done else None, {"conn": 1} if rid in done else None)
            for rid in scheduler_output.num_scheduled_tokens
        ]
        return {0: Outs(outs)}

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Req]:
        return [self.requests.pop(rid) for rid in request_ids]


def metered(plan: list[dict[str, int]], finishing: list[set[str]], **prompts: int) -> Any:
    scheduler = vllm_gpu_time._metered(FakeScheduler)(plan, finishing)
    for rid, n in prompts.items():
        scheduler.requests[rid] = Req(rid, n)
    return scheduler


def step(scheduler: Any) -> list[Out]:
    out = scheduler.schedule()
    scheduler.get_grammar_bitmask(out)
    return list(scheduler.update_from_output(out, None)[0].outputs)


def test_every_output_carries_the_charge_so_far_and_a_finish_closes_it() -> None:
    # a: 8-token prompt in one step, then 2 decode steps; b: 4-token prompt, 1 decode
    plan = [{"a": 8, "b": 4}, {"a": 1, "b": 1}, {"a": 1}]
    s = metered(plan, [set(), {"b"}, {"a"}], a=8, b=4)
    outs = [step(s) for _ in range(3)]
    charges = [[o.kv_transfer_params[GPU_SECONDS_KEY] for o in batch] for batch in outs]
    assert all(later >= earlier for earlier, later in zip(charges[0], charges[1], strict=True))
    first_a, first_b = charges[0]
    assert first_a > first_b  # 8 prompt tokens against 4 in the same step (c_p = c_d = 1)
    assert first_a / first_b == pytest.approx(2.0)
    assert s._book.open_s == 0.0  # both finished: nothing left open
    assert s._book.attributed_s == pytest.approx(s._book.busy_s)
    assert charges[2][0] + charges[1][1] == pytest.approx(s._book.busy_s)
    # a connector's own parameters stay beside the charge
    assert outs[1][1].kv_transfer_params["conn"] == 1


def test_an_abort_inside_the_engine_leaves_its_charge_unattributed() -> None:
    s = metered([{"a": 4, "b": 4}], [set()], a=4, b=8)
    step(s)
    s.finish_requests(["b"], "aborted")
    assert s._book.unattributed_s > 0 and s._book.charged("b") == 0.0
    assert s._book.charged("a") + s._book.unattributed_s == pytest.approx(s._book.busy_s)


def test_prompt_and_decode_tokens_are_told_apart_across_chunks() -> None:
    # a 10-token prompt in chunks of 6 and 4 (the second chunk's last token is the
    # prompt's), then one decode step: 10 prompt tokens, 1 decode token
    s = metered([{"a": 6}, {"a": 4}, {"a": 1}], [set(), set(), {"a"}], a=10)
    seen: list[Any] = []
    original = s._book.step
    s._book.step = lambda seconds, work, c_p, c_d: (seen.append(dict(work)), original(
        seconds, work, c_p, c_d))  # fmt: skip
    for _ in range(3):
        step(s)
    assert [w["a"] for w in seen] == [
        vllm_gpu_time.Work(6, 0), vllm_gpu_time.Work(4, 0), vllm_gpu_time.Work(0, 1)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("params", "rest", "seconds"),
    [
        (None, None, None),
        ({}, {}, None),
        ({"conn": 1}, {"conn": 1}, None),
        ({GPU_SECONDS_KEY: 0.25}, None, 0.25),
        ({GPU_SECONDS_KEY: 0.25, "conn": 1}, {"conn": 1}, 0.25),
    ],
)
def test_strip_takes_the_charge_out_of_a_connectors_parameters(
    params: dict[str, Any] | None, rest: dict[str, Any] | None, seconds: float | None
) -> None:
    assert strip(params) == (rest, seconds)


def test_a_delta_gets_the_charge_new_since_the_previous_delta() -> None:
    charge = Charge()
    assert charge.take() is None  # nothing reported (another scheduler)
    charge.read({GPU_SECONDS_KEY: 0.1})
    charge.read({GPU_SECONDS_KEY: 0.3})  # an output that made no delta
    assert charge.take() == pytest.approx(0.3)
    assert charge.take() == pytest.approx(0.0)
    assert charge.read({GPU_SECONDS_KEY: 0.5, "conn": 2}) == {"conn": 2}
    assert charge.take() == pytest.approx(0.2)
