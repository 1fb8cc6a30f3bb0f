"""The prompt at the gateway: text, token ids (off the loop when long), estimates."""

from __future__ import annotations

from typing import Any

import pytest

from app.api.prompt import (
    OFF_LOOP_CHARS,
    estimate_tokens,
    prompt_ids,
    prompt_text,
    upper_bound_tokens,
)
from app.engine.tokenizer import SimulatedPromptTokenizer
from tests.loop import turns_during

CHAT = {"messages": ({"role": "user", "content": "a b"}, {"role": "user", "content": "c"})}


@pytest.mark.parametrize(
    ("prompt", "text", "estimate", "bound"),
    [
        (CHAT, "a b\nc", 9, 53),
        ({"prompt_text": "hello"}, "hello", 1, 21),
        ({"prompt_token_ids": (1, 2, 3)}, "", 3, 3),
    ],
    ids=["messages", "text", "ids"],
)
def test_text_and_estimates(prompt: dict[str, Any], text: str, estimate: int, bound: int) -> None:
    assert prompt_text(prompt) == text
    assert estimate_tokens(prompt, text) == estimate
    assert upper_bound_tokens(prompt, text) == bound


async def test_ids_are_the_engines_and_long_prompts_leave_the_loop() -> None:
    tok = SimulatedPromptTokenizer(1000)
    assert await prompt_ids(tok, CHAT) == tuple(tok.apply_chat_template(CHAT["messages"]))
    assert await prompt_ids(tok, {"prompt_token_ids": (5, 6)}) == (5, 6)
    long = {"prompt_text": "word " * (OFF_LOOP_CHARS * 20)}
    ids, during = await turns_during(prompt_ids(tok, long))
    assert ids == tuple(tok.tokenize(long["prompt_text"]))
    assert during > 1  # the loop kept turning while the long prompt was tokenized
