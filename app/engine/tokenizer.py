"""Prompt tokenizers: the same token ids the engine will see, computed wherever they
are needed (the gateway counts prompt tokens for budgets before dispatch and hands
the ids on, so the count it reserves is the count the engine processes).

``HFPromptTokenizer`` wraps a Hugging Face tokenizer (the vLLM engine wraps its own
with it); ``SimulatedPromptTokenizer`` is the simulated engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from app.engine.simulated_text import chat_prompt, tokenize


class PromptTokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def embedding_input(self, text: str) -> list[int]:
        """The ids an embedding model sees for ``text`` (with its special tokens)."""
        ...


class HFPromptTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    @classmethod
    def from_path(cls, path: Path) -> HFPromptTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The model's own template renders the tools (a template without tool support
        leaves them out, as vLLM's server does)."""
        rendered = self._tok.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
        return self.tokenize(rendered)

    def embedding_input(self, text: str) -> list[int]:
        return list(self._tok.encode(text))


class SimulatedPromptTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size

    def tokenize(self, text: str) -> list[int]:
        return tokenize(text, self._vocab_size)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return self.tokenize(chat_prompt(messages, tools))

    def embedding_input(self, text: str) -> list[int]:
        return self.tokenize(text)
