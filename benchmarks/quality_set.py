"""A small graded question set: does a serving setting (a dtype) change the answers?

28 short factual and arithmetic questions, each with its accepted answers. A question
is asked as the only user message through the chat endpoint (the server applies the
model's chat template), greedy (``temperature`` 0), ``max_tokens`` 24, not streamed. An
answer is correct when one accepted answer occurs in it as whole words after
normalisation (lower case, punctuation to spaces, runs of spaces collapsed). The set is
sized for SmolLM2-135M-Instruct: easy enough that it answers most, so a setting that
changes its greedy answers shows up as a different score or different questions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

MAX_TOKENS = 24


@dataclass(frozen=True)
class Question:
    prompt: str
    accepted: tuple[str, ...]


QUESTIONS: tuple[Question, ...] = (
    Question("What is the capital of France?", ("paris",)),
    Question("What is the capital of Japan?", ("tokyo",)),
    Question("What is the capital of Italy?", ("rome",)),
    Question("What is the capital of Germany?", ("berlin",)),
    Question("What is the capital of Spain?", ("madrid",)),
    Question("What is the capital of the United Kingdom?", ("london",)),
    Question("What is 2 + 2?", ("4", "four")),
    Question("What is 3 + 5?", ("8", "eight")),
    Question("What is 10 - 3?", ("7", "seven")),
    Question("What is 5 times 2?", ("10", "ten")),
    Question("How many days are in a week?", ("7", "seven")),
    Question("How many legs does a spider have?", ("8", "eight")),
    Question("How many continents are there on Earth?", ("7", "seven")),
    Question("How many hours are in a day?", ("24", "twenty four")),
    Question("How many sides does a triangle have?", ("3", "three")),
    Question("What color is the sky on a clear day?", ("blue",)),
    Question("What color is a ripe banana?", ("yellow",)),
    Question("What is the chemical formula of water?", ("h2o", "h 2 o")),
    Question("What is the largest planet in our solar system?", ("jupiter",)),
    Question("Which planet is known as the Red Planet?", ("mars",)),
    Question("Who wrote the play Romeo and Juliet?", ("shakespeare",)),
    Question("Who painted the Mona Lisa?", ("leonardo", "da vinci")),
    Question("At what temperature in degrees Celsius does water freeze?", ("0", "zero")),
    Question("At what temperature in degrees Celsius does water boil?", ("100", "hundred")),
    Question("Which gas do plants take in from the air?", ("carbon dioxide", "co2")),
    Question("What is the largest ocean on Earth?", ("pacific",)),
    Question("What language is spoken in Brazil?", ("portuguese",)),
    Question("What is the opposite of hot?", ("cold",)),
)


def normalize(text: str) -> str:
    """Lower case, anything but letters and digits to a space, single spaces."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def correct(question: Question, answer: str) -> bool:
    """An accepted answer occurs in ``answer`` as whole words (normalised)."""
    padded = f" {normalize(answer)} "
    return any(f" {normalize(a)} " in padded for a in question.accepted)


def ask(base_url: str, model: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every question, one at a time, greedy; ``{prompt, answer, correct}`` each."""
    out = []
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        for q in QUESTIONS:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": q.prompt}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
            }
            resp = client.post("/v1/chat/completions", json=body)
            resp.raise_for_status()
            answer = resp.json()["choices"][0]["message"]["content"] or ""
            out.append({"prompt": q.prompt, "answer": answer, "correct": correct(q, answer)})
    return out


def score(results: list[dict[str, Any]]) -> float:
    return sum(r["correct"] for r in results) / len(results) if results else 0.0


def differing(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The questions graded differently in ``a`` and ``b``, or answered in other words."""
    return [
        {"prompt": x["prompt"], "a": x["answer"], "b": y["answer"],
         "a_correct": x["correct"], "b_correct": y["correct"]}
        for x, y in zip(a, b, strict=True)
        if x["correct"] != y["correct"] or x["answer"] != y["answer"]
    ]  # fmt: skip
