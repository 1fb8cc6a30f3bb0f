"""A four-step agent loop against Switchyard with the official ``openai`` SDK, as an
agent framework would run it: plan (the model must call the search tool) → search (a
local tool, retrieval by embeddings) → answer with the tool results → done. Every call
carries the same ``x-session-id``, so the ledger groups the session.

    make run                                   # in one terminal
    .venv/bin/python examples/agent_loop.py    # in another

Options: --base-url (default http://127.0.0.1:8000/v1), --model, --embed-model ('' for
keyword search), --question. The key comes from OPENAI_API_KEY: the SDK always sends
one, so create a real one first (README): export OPENAI_API_KEY=$(.venv/bin/switchyard
keys create --tenant local --name agent).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import uuid
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

DOCUMENTS = [
    "Paris is the capital of France and sits on the Seine.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower in Paris was finished in 1889.",
    "Trains from Paris to Lyon take about two hours.",
]
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the knowledge base; returns the best matching passages.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 80}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


@dataclass
class Step:
    name: str
    detail: str


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0)


def search(client: OpenAI, embed_model: str, query: str, k: int = 2) -> list[str]:
    """The tool: the ``k`` passages closest to ``query`` (embeddings, or word overlap)."""
    if embed_model:
        vectors = client.embeddings.create(model=embed_model, input=[query, *DOCUMENTS]).data
        q = vectors[0].embedding
        scores = [_cosine(q, v.embedding) for v in vectors[1:]]
    else:
        words = set(query.lower().split())
        scores = [float(len(words & set(d.lower().split()))) for d in DOCUMENTS]
    ranked = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    return [DOCUMENTS[i] for i in ranked[:k]]


def run(client: OpenAI, model: str, embed_model: str, question: str) -> tuple[str, list[Step]]:
    """The loop; returns the answer and what each step did."""
    session = {"x-session-id": f"agent-{uuid.uuid4().hex[:12]}"}
    steps: list[Step] = []
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Call the search tool with a short query made of the "
         "question's key words, then answer from what it returns."},
        {"role": "user", "content": question},
    ]
    # 1. plan: the model must call the search tool (its arguments always parse)
    plan = client.chat.completions.create(
        model=model, messages=messages, tools=[SEARCH_TOOL], tool_choice="required",  # type: ignore[arg-type]
        parallel_tool_calls=False, max_tokens=160, temperature=0, extra_headers=session,
    )  # fmt: skip
    calls = plan.choices[0].message.tool_calls or []
    planned = ", ".join(f"{c.function.name}({c.function.arguments})" for c in calls)
    steps.append(Step("plan", planned))
    messages.append(plan.choices[0].message.model_dump(exclude_none=True))
    # 2. act: run each call locally and send the results back as tool messages
    for call in calls:
        query = json.loads(call.function.arguments).get("query", question)
        passages = search(client, embed_model, query)
        steps.append(Step("search", f"{query!r} -> {len(passages)} passages"))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "\n".join(passages)})
    # 3. answer from the tool results (no more tools)
    answer = client.chat.completions.create(
        model=model, messages=messages, tools=[SEARCH_TOOL], tool_choice="none",  # type: ignore[arg-type]
        max_tokens=64, temperature=0, extra_headers=session,
    )  # fmt: skip
    text = answer.choices[0].message.content or ""
    steps.append(Step("answer", text))
    # 4. done: the session's calls are in the ledger under the same session id
    steps.append(Step("done", f"session {session['x-session-id']}, {len(steps) + 1} steps"))
    return text, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--embed-model", default="all-MiniLM-L6-v2")
    parser.add_argument("--question", default="What is the capital of France?")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "local"))
    _, steps = run(client, args.model, args.embed_model, args.question)
    for step in steps:
        print(f"{step.name:>7}: {step.detail}")


if __name__ == "__main__":
    main()
