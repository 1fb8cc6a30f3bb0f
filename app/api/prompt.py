"""A request's prompt at the gateway: its text (for routing and limits), the token ids
the engine will see (counted off the event loop when long), and the estimates used
where no tokenizer is local."""

from __future__ import annotations

import asyncio
from typing import Any

OFF_LOOP_CHARS = 8192  # prompts longer than this are tokenized on a worker thread


async def prompt_ids(tokenizer: Any, prompt: dict[str, Any]) -> tuple[int, ...]:
    """The token ids the engine will see; long prompts are rendered and tokenized on a
    worker thread, off the event loop."""

    def ids() -> tuple[int, ...]:
        if "messages" in prompt:
            return tuple(tokenizer.apply_chat_template(prompt["messages"]))
        if "prompt_token_ids" in prompt:
            return tuple(prompt["prompt_token_ids"])
        return tuple(tokenizer.tokenize(prompt["prompt_text"]))

    if "prompt_token_ids" in prompt or len(prompt_text(prompt)) < OFF_LOOP_CHARS:
        return ids()
    return await asyncio.to_thread(ids)


def prompt_text(prompt: dict[str, Any]) -> str:
    if "messages" in prompt:
        return "\n".join(m["content"] for m in prompt["messages"])
    return str(prompt.get("prompt_text") or "")


def estimate_tokens(prompt: dict[str, Any], text: str) -> int:
    """A rough prompt length for routing (policy context checks): ~3 bytes a token."""
    if "prompt_token_ids" in prompt and prompt["prompt_token_ids"] is not None:
        return len(prompt["prompt_token_ids"])
    return len(text.encode()) // 3 + 4 * len(prompt.get("messages", ()))


def upper_bound_tokens(prompt: dict[str, Any], text: str) -> int:
    """No byte-level tokenizer makes more tokens than bytes (plus template tokens)."""
    if "prompt_token_ids" in prompt and prompt["prompt_token_ids"] is not None:
        return len(prompt["prompt_token_ids"])
    return len(text.encode()) + 16 * len(prompt.get("messages", ())) + 16
