"""The token ids the engine will see, counted at the gateway when the model's tokenizer
is local — off the event loop when the prompt is long."""

from __future__ import annotations

import asyncio
from typing import Any

from app.request import Prompt

OFF_LOOP_CHARS = 8192  # prompts longer than this are tokenized on a worker thread


async def prompt_ids(tokenizer: Any, prompt: Prompt) -> tuple[int, ...]:
    """The token ids the engine will see; long prompts are rendered and tokenized on a
    worker thread, off the event loop."""

    def ids() -> tuple[int, ...]:
        if prompt.messages is not None:
            return tuple(tokenizer.apply_chat_template(list(prompt.messages), prompt.tools))
        if prompt.token_ids is not None:
            return prompt.token_ids
        return tuple(tokenizer.tokenize(prompt.text or ""))

    if prompt.token_ids is not None or len(prompt.view) < OFF_LOOP_CHARS:
        return ids()
    return await asyncio.to_thread(ids)
