"""Knowledge Agent sessions: planner -> embedding -> 2-3 chained generations, each
prompt built from the previous output; call counts, kinds, determinism."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from app.bench.agentic import AgenticWorkload, SessionPlan
from app.bench.prompts import PromptFactory, SimulatedCounter
from app.bench.records import RequestSpec

FACTORY = PromptFactory(SimulatedCounter(), seed=0)
COUNT = SimulatedCounter().count


def _agent(seed: int = 0, **kw: Any) -> AgenticWorkload:
    return AgenticWorkload("gen", "emb", FACTORY, seed, **kw)


def _run(plan: SessionPlan) -> list[tuple[RequestSpec, str]]:
    """Drive a session as the runner does: each call's text is the next call's input
    (the embedding returns no text)."""
    calls: list[tuple[RequestSpec, str]] = []
    spec: RequestSpec | None = plan.first
    step = 0
    while spec is not None:
        text = "" if spec.endpoint == "embeddings" else f"OUTPUT-{step} of {spec.kind}"
        calls.append((spec, text))
        step += 1
        spec = plan.next(step, text)
    return calls


def test_session_shape_and_kinds() -> None:
    w = _agent(question_tokens=40, context_tokens=30, planner_output=16, step_output=50)
    steps: Counter[int] = Counter()
    for index in range(100):
        plan = w.session(index)
        calls = _run(plan)
        steps[plan.steps] += 1
        assert plan.calls == len(calls) == 2 + plan.steps and plan.calls in (4, 5)
        kinds = [spec.kind for spec, _ in calls]
        assert kinds == ["planner", "embed"] + [f"generate_{k}" for k in range(1, plan.steps + 1)]
        planner, embed = calls[0][0], calls[1][0]
        assert (planner.endpoint, planner.output_tokens, planner.body["max_tokens"]) == (
            "chat", 16, 16,
        )  # fmt: skip
        assert planner.body["messages"][1]["content"] == plan.question
        assert COUNT(plan.question) == 40 and COUNT(plan.context) == 30
        assert embed.endpoint == "embeddings" and embed.output_tokens == 0
        assert embed.body == {"model": "emb", "input": f"{plan.question}\n{calls[0][1]}"}
        for spec, _ in calls[2:]:
            assert (spec.endpoint, spec.output_tokens, spec.body["model"]) == ("chat", 50, "gen")
            assert spec.body["temperature"] == 0.0 and spec.body["ignore_eos"] is True
            assert spec.input_tokens == sum(COUNT(m["content"]) for m in spec.body["messages"])
    assert set(steps) == {2, 3} and all(n > 30 for n in steps.values())


def test_each_generation_consumes_the_previous_output() -> None:
    plan = _agent().session(4)
    calls = _run(plan)
    gen1 = calls[2][0].body["messages"][1]["content"]
    assert calls[0][1] in gen1 and plan.context in gen1  # the plan and the retrieved text
    for (prev_spec, prev_text), (spec, _) in itertools.pairwise(calls[2:]):
        user = spec.body["messages"][1]["content"]
        assert prev_text in user and plan.question in user
        assert prev_text.startswith("OUTPUT-") and prev_spec.kind != spec.kind
    assert "Summarize" in calls[-1][0].body["messages"][1]["content"]


def test_step_two_takes_the_plan_given_directly_too() -> None:
    plan = _agent().session(0)
    direct = plan.next(2, "THE PLAN")
    assert direct is not None and "THE PLAN" in direct.body["messages"][1]["content"]


@pytest.mark.parametrize("step", [0, -1])
def test_step_zero_is_first(step: int) -> None:
    with pytest.raises(ValueError, match="first"):
        _agent().session(0).next(step, "")


def test_after_the_last_call_there_is_none() -> None:
    plan = _agent().session(1)
    assert plan.next(plan.calls, "x") is None and plan.next(plan.calls + 3, "x") is None


@pytest.mark.parametrize(("lo", "hi", "calls"), [(2, 2, {4}), (3, 3, {5}), (1, 3, {3, 4, 5})])
def test_step_count_range(lo: int, hi: int, calls: set[int]) -> None:
    w = _agent(min_steps=lo, max_steps=hi)
    assert {w.session(i).calls for i in range(60)} == calls
    desc = w.describe()
    assert desc["tail_amplification"] == {n: round(1 - 0.95**n, 4) for n in sorted(calls)}


def test_sessions_are_deterministic() -> None:
    a, b, c = _agent(1), _agent(1), _agent(2)

    def trace(w: AgenticWorkload, i: int) -> list[object]:
        return [(s.kind, s.body) for s, _ in _run(w.session(i))]

    assert [trace(a, i) for i in range(10)] == [trace(b, i) for i in reversed(range(10))][::-1]
    assert [trace(a, i) for i in range(10)] != [trace(c, i) for i in range(10)]
    assert a.request(3) == a.session(3).first
    assert len({a.session(i).question for i in range(50)}) == 50


def test_bad_step_range_and_describe() -> None:
    with pytest.raises(ValueError, match="min_steps"):
        _agent(min_steps=3, max_steps=2)
    desc = _agent().describe()
    assert desc["workload"] == "agentic" and desc["embed_model"] == "emb"
    assert desc["calls_per_session"].startswith("4–5")
    assert {"dataset", "input_lengths", "output_lengths", "seed"} <= set(desc)
