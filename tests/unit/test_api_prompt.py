"""The prompt at the gateway: text, token ids (off the loop when long), estimates."""

from __future__ import annotations

import pytest

from app.api.prompt import OFF_LOOP_CHARS, prompt_ids
from app.engine.tokenizer import SimulatedPromptTokenizer
from app.request import Prompt
from tests.loop import turns_during

CHAT = Prompt(messages=({"role": "user", "content": "a b"}, {"role": "user", "content": "c"}))


@pytest.mark.parametrize(
    ("prompt", "text", "estimate", "bound"),
    [
        (CHAT, "a b\nc", 9, 53),
        (Prompt(text="hello"), "hello", 1, 21),
        (Prompt(token_ids=(1, 2, 3)), "", 3, 3),
        (Prompt(inputs=("ab", "cd")), "ab\ncd", 1, 21),
    ],
    ids=["messages", "text", "ids", "inputs"],
)
def test_text_and_estimates(prompt: Prompt, text: str, estimate: int, bound: int) -> None:
    assert prompt.view == text
    assert prompt.estimate_tokens() == estimate
    assert prompt.upper_bound_tokens() == bound


def test_counted_ids_serve_only_the_model_that_counted_them() -> None:
    counted = CHAT.counted("m", (7, 8))
    assert counted.ids_for("m") == (7, 8)
    assert counted.ids_for("other") is None  # a fallback to another model renders again
    assert counted.estimate_tokens() == CHAT.estimate_tokens()  # still the text's estimate
    client = Prompt(token_ids=(1, 2))
    assert client.ids_for("any") == (1, 2)  # the client's own ids
    assert client.counted("m", (9,)) == client
    assert CHAT.ids_for("m") is None


async def test_ids_are_the_engines_and_long_prompts_leave_the_loop() -> None:
    tok = SimulatedPromptTokenizer(1000)
    assert CHAT.messages is not None
    assert await prompt_ids(tok, CHAT) == tuple(tok.apply_chat_template(list(CHAT.messages)))
    assert await prompt_ids(tok, Prompt(token_ids=(5, 6))) == (5, 6)
    long = Prompt(text="word " * (OFF_LOOP_CHARS * 20))
    ids, during = await turns_during(prompt_ids(tok, long))
    assert ids == tuple(tok.tokenize(long.text or ""))
    assert during > 1  # the loop kept turning while the long prompt was tokenized
