"""The context window rule both the ingress (before admission, with a local tokenizer)
and the replica (before the engine) apply: ``output_limit``."""

from __future__ import annotations

from app.engine.protocol import ContextLengthExceeded, InvalidRequest


def output_limit(prompt_len: int, max_tokens: int | None, limit: int, min_tokens: int = 0) -> int:
    """The completion length a request may have in a ``limit``-token context window:
    ``max_tokens``, or the rest of the window when it is None; raises
    ``ContextLengthExceeded`` when the request does not fit (``min_tokens`` included) and
    ``InvalidRequest`` when ``min_tokens`` exceeds ``max_tokens`` (the engine refuses
    both, which reached clients as a 500; found by benchmarks.fuzz_openapi)."""
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({min_tokens}) is more than max_tokens ({max_tokens}).",
            param="min_tokens",
        )
    if max_tokens is None:
        if prompt_len >= limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, "
                f"your prompt has {prompt_len} tokens. Please reduce the length."
            )
        if prompt_len + min_tokens > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested at least {prompt_len + min_tokens} tokens ({prompt_len} in the "
                f"prompt, min_tokens {min_tokens} for the completion). Please reduce the "
                "prompt or min_tokens."
            )
        return limit - prompt_len
    if prompt_len + max_tokens > limit:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the "
            f"prompt, {max_tokens} for the completion). Please reduce the prompt "
            "or the completion length."
        )
    return max_tokens
