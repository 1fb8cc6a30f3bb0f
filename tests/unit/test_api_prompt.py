"""The prompt at the gateway: text, token ids (off the loop when long), estimates."""

from __future__ import annotations

import asyncio
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
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    ids = await prompt_ids(tok, long)
    during = ticks - before
    done.set()
    await task
    assert ids == tuple(tok.tokenize(long["prompt_text"]))
    assert during > 1  # the loop kept turning while the long prompt was tokenized
