"""Routing by request class: a public model's ``classes:`` sends each request to the
pool whose serving profile fits it (seed 003 §2.3: pipelines A, B and C).

    models:
      chat:
        pool: smol-chat                      # the default, and the fallback
        classes:
          pools: {interactive: smol-chat, long_context: smol-long, throughput: smol-batch}
          long_prompt_tokens: 1024
          interactive_max_tokens: 256

The rule, first match wins:
1. ``throughput``: the client marked the request as batch work — ``service_tier:
   "flex"`` (the OpenAI API's slower, cheaper tier) or the ``x-switchyard-class:
   throughput`` header.
2. ``long_context``: the prompt holds at least ``long_prompt_tokens`` tokens (the
   gateway's estimate before counting; the long-context pool's prefix-affine replica
   router then finds where it is cached). Its context window is that pool's own.
3. ``interactive``: a streamed request asking for at most ``interactive_max_tokens``.
4. otherwise no class: the model's own pool.
A class whose pool the model does not name goes to the model's own pool; the route
header says ``class=…`` either way, and ``step=class`` only when the class chose.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schema import StrictFrozen

RequestClass = Literal["throughput", "interactive", "long_context"]
CLASS_HEADER = "x-switchyard-class"
BATCH_TIERS = frozenset({"flex"})


class ClassRouting(StrictFrozen):
    """A public model's pools per request class, and the rule's thresholds."""

    pools: dict[RequestClass, str] = Field(min_length=1)
    long_prompt_tokens: int = Field(default=1024, ge=1)
    interactive_max_tokens: int = Field(default=256, ge=1)


def classify(
    rule: ClassRouting,
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    stream: bool,
    batch: bool,
) -> RequestClass | None:
    """The request's class under ``rule`` (module docstring); None: no class."""
    if batch:
        return "throughput"
    if prompt_tokens >= rule.long_prompt_tokens:
        return "long_context"
    if stream and max_tokens is not None and max_tokens <= rule.interactive_max_tokens:
        return "interactive"
    return None
