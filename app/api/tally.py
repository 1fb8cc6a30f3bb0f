"""What one generation produced, and when: token counts, text, and the gateway's own
TTFT/ITL measurements."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.api.openai_format import Usage
from app.engine.protocol import GenerationDelta


@dataclass
class Tally:
    """What one generation produced, and when."""

    started: float
    first_at: float | None = None
    last_at: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    parts: list[str] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)

    def add(self, delta: GenerationDelta) -> None:
        now = time.perf_counter()
        if delta.prompt_tokens:  # the latest count wins: an upstream's exact usage
            self.prompt_tokens = delta.prompt_tokens  # replaces the first delta's estimate
            self.cached_tokens = delta.cached_prompt_tokens
        self.completion_tokens += delta.num_new_tokens
        if delta.text:
            if self.first_at is None:
                self.first_at = now
            elif self.last_at is not None:
                self.itls.append(now - self.last_at)
            self.last_at = now
            self.parts.append(delta.text)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
