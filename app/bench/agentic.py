"""Knowledge Agent sessions (seed 000 CH4-1, CH4-6): one user question, a chain of calls.

A session is, in order (call ``step`` 0, 1, 2, ...):

0. ``planner``: chat, system prompt of the planner + the user question
   (``question_tokens`` tokens, unique per session), ``planner_output`` tokens out.
1. ``embed``: ``/v1/embeddings`` of the question and the plan (body
   ``{"model": embed_model, "input": text}``), the retrieval lookup.
2. ``generate_1``: chat: the question, the plan and a retrieved passage
   (``context_tokens`` synthetic tokens, fixed per session); draft an answer.
3. ``generate_2`` (and ``generate_3``): chat: the question and the previous call's
   output; analyse it (middle steps) or summarise it into the final answer (last step).

Each generation's prompt holds the previous output text, so call ``k + 1`` cannot be
built before call ``k`` ends: :meth:`SessionPlan.next` takes that text. The number of
generation calls is a uniform integer in ``min_steps..max_steps`` (default 2–3) drawn
per session by the seeded RNG, so a session makes ``calls`` = 4–5 backend calls and the
chance that at least one lands in a call's own p95 tail is ``1 - 0.95^calls``. Every
generation asks ``step_output`` tokens; bodies are as in :mod:`app.bench.workloads`
(``temperature`` 0.0 and ``ignore_eos`` by default). Everything is deterministic in
(seed, session index) given the previous outputs.
"""

from __future__ import annotations

import random
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from app.bench.prompts import PromptFactory
from app.bench.records import RequestSpec
from app.bench.workloads import generation_body

__all__ = ["AGENT_SYSTEM", "PLANNER_SYSTEM", "AgenticWorkload", "SessionPlan"]

PLANNER_SYSTEM = (
    "You are the planner of a knowledge agent. Break the user's question into {steps} "
    "short numbered steps; answer with the plan only."
)
AGENT_SYSTEM = "You are a research assistant. Answer from the material given."


@dataclass
class SessionPlan:
    """One session: ``first`` is call 0; ``next(step, previous_text)`` builds call
    ``step`` from the output text of call ``step - 1`` (None after the last call).

    The embedding returns no text, so for ``step`` 2 pass the plan, or an empty string
    and the plan given at step 1 is used.
    """

    index: int
    question: str
    context: str
    steps: int
    """Generation calls after the embedding."""
    first: RequestSpec
    workload: AgenticWorkload = field(repr=False)
    _plan: str = field(default="", repr=False)

    @property
    def calls(self) -> int:
        """Backend calls of the whole session: planner, embedding, generations."""
        return 2 + self.steps

    def next(self, step: int, previous_text: str) -> RequestSpec | None:
        if step < 1:
            raise ValueError("step 0 is the planner call, `first`")
        if step >= self.calls:
            return None
        w = self.workload
        if step == 1:
            self._plan = previous_text
            text = f"{self.question}\n{previous_text}"
            body = {"model": w.embed_model, "input": text}
            return RequestSpec("embeddings", body, w.factory.counter.count(text), 0, "embed")
        generation = step - 1
        if generation == 1:
            plan = previous_text or self._plan
            task = (
                f"Question: {self.question}\n\nPlan:\n{plan}\n\n"
                f"Retrieved passage:\n{self.context}\n\n"
                "Follow the plan and draft an answer to the question."
            )
        elif generation < self.steps:
            task = (
                f"Question: {self.question}\n\n"
                f"Analyse the following draft and improve it:\n{previous_text}"
            )
        else:
            task = (
                f"Question: {self.question}\n\n"
                f"Summarize the following into the final answer:\n{previous_text}"
            )
        return w.chat(AGENT_SYSTEM, task, w.step_output, f"generate_{generation}")


@dataclass
class AgenticWorkload:
    """Sessions of the Knowledge Agent; ``request(i)`` is ``session(i).first`` (a
    runner that chains calls uses :meth:`session`)."""

    name = "agentic"
    model: str
    embed_model: str
    factory: PromptFactory
    seed: int
    _: KW_ONLY
    question_tokens: int = 64
    context_tokens: int = 256
    planner_output: int = 64
    step_output: int = 256
    min_steps: int = 2
    max_steps: int = 3
    temperature: float = 0.0
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError("need 1 <= min_steps <= max_steps")

    def chat(self, system: str, user: str, max_tokens: int, kind: str) -> RequestSpec:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        body = generation_body(
            "chat", self.model, messages, max_tokens, self.temperature, self.ignore_eos
        )
        n_in = sum(self.factory.counter.count(m["content"]) for m in messages)
        return RequestSpec("chat", body, n_in, max_tokens, kind)

    def session(self, index: int) -> SessionPlan:
        rng = random.Random(f"{self.name}:{self.seed}:{index}")
        steps = rng.randint(self.min_steps, self.max_steps)
        question = self.factory.text(self.question_tokens, rng)
        context = self.factory.text(self.context_tokens, rng) if self.context_tokens else ""
        system = PLANNER_SYSTEM.format(steps=steps)
        first = self.chat(system, question, self.planner_output, "planner")
        return SessionPlan(index, question, context, steps, first, self)

    def request(self, index: int) -> RequestSpec:
        return self.session(index).first

    def describe(self) -> dict[str, Any]:
        lo, hi = self.min_steps + 2, self.max_steps + 2
        return {
            "workload": self.name,
            "dataset": "synthetic Knowledge Agent sessions (seed 000 CH4-1): random words",
            "endpoint": "chat + embeddings",
            "embed_model": self.embed_model,
            "calls_per_session": f"{lo}–{hi}: planner, embedding, "
            f"{self.min_steps}–{self.max_steps} chained generations (uniform integer)",
            "chain": "each generation's prompt holds the previous call's output text",
            "input_lengths": f"question {self.question_tokens}, retrieved passage "
            f"{self.context_tokens}, plus the previous output",
            "output_lengths": f"planner {self.planner_output}, each generation {self.step_output}",
            "tail_amplification": {n: round(1 - 0.95**n, 4) for n in range(lo, hi + 1)},
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
        }
