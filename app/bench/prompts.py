"""Deterministic prompt text of a target token length, for the load generator.

Rules:
* A prompt is ``prefix + "[<8 hex digits>]" + " word" * k``: the caller's ``prefix``
  verbatim, then an id of 32 random bits and words drawn at random from the fixed English
  list :data:`WORDS`, all from the caller's RNG. Two prompts thus differ from their
  first token after the prefix (but for a chance of 2^-32 per pair, and then the words
  differ), so prefix caches only hit where a workload shares a prefix on purpose.
* Only words that cost exactly one token after a space are used, checked once per
  counter when the :class:`PromptFactory` is built (``count("Text " + w)`` is one more
  than ``count("Text")``). N such words are then about N tokens, so a prompt is counted
  once, trimmed or padded by the difference, and counted again; at most
  :data:`MAX_ROUNDS` counts of the whole text, never word by word.
* Exactness: the token count of the returned text (prefix included) equals
  ``n_tokens`` for :class:`SimulatedCounter` (every word and punctuation mark is one
  token). For :class:`HFCounter` it is exact whenever the tokenizer splits on spaces
  before merging (byte-level BPE, SentencePiece/Metaspace, WordPiece; checked on the
  SmolLM2 and MiniLM tokenizers the project prepares); otherwise the closest count
  found within ``±TOLERANCE`` tokens is accepted and a larger miss raises ``ValueError``.
* Counts are of the raw text (``add_special_tokens=False``): no chat template, no BOS.
  Workloads leave room for the template separately (see ``workloads``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from app.engine.simulated_text import tokenize

__all__ = [
    "MAX_ROUNDS",
    "TOLERANCE",
    "WORDS",
    "HFCounter",
    "PromptFactory",
    "SimulatedCounter",
    "TokenCounter",
    "single_token_words",
]

MAX_ROUNDS = 4
"""Most whole-text counts of one prompt (the first, then one per correction)."""
TOLERANCE = 2
"""Largest accepted miss, in tokens, when a tokenizer merges across words."""

_WORD_TEXT = """
the of and to in is was for on that with as by at from it be this are or an not have
has had but which one all were they can more other there their some time its would
about when out what up so into year two also new first people any these only may
over most made after many then them city system world such well three work where
state between under part while during before both each those number day life years
house group water form head place long point case end line family name
power river light music small large great high little right old road land war
country school team game story field market book report series company plan
history model order office service center study level area process song
question answer window garden morning evening summer winter north south east west
bridge station signal engine harbor forest valley island mountain ocean desert stone
paper table chair letter picture voice heart mind idea reason result change value
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""The fixed English word list; a factory uses those that are one token for its counter."""


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class SimulatedCounter:
    """The simulated engine's tokenizer: each word, punctuation mark or tag is a token."""

    def count(self, text: str) -> int:
        return len(tokenize(text, 1 << 31))


class HFCounter:
    """A Hugging Face tokenizer; counts ``encode(text, add_special_tokens=False)``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    @classmethod
    def from_path(cls, path: str | Path) -> HFCounter:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def count(self, text: str) -> int:
        # verbose=False: long prompts must not warn about the model's max length
        return len(self._tok.encode(text, add_special_tokens=False, verbose=False))


def single_token_words(counter: TokenCounter, words: tuple[str, ...] = WORDS) -> tuple[str, ...]:
    """The ``words`` that add exactly one token after a space (in list order)."""
    base = counter.count("Text")
    return tuple(w for w in words if counter.count(f"Text {w}") - base == 1)


class PromptFactory:
    """Builds prompt texts of an exact token count (see the module docstring).

    ``seed`` only keys :meth:`shared` (texts that must be the same on every call, such as
    a tenant's system prompt); :meth:`text` draws from the RNG the caller passes.
    """

    def __init__(self, counter: TokenCounter, seed: int = 0) -> None:
        self.counter = counter
        self.seed = seed
        self.words = single_token_words(counter)
        if len(self.words) < 8:
            raise ValueError(
                f"only {len(self.words)} words of the list are single tokens for this "
                "tokenizer; prompts need at least 8"
            )

    def head(self, rng: random.Random, prefix: str = "") -> str:
        """The prefix and a unique id drawn from ``rng``."""
        return f"{prefix}[{rng.getrandbits(32):08x}]"

    def min_tokens(self, prefix: str = "") -> int:
        """The shortest prompt :meth:`text` can build after ``prefix`` (for an HF
        tokenizer the id's cost varies with its digits by a token or two)."""
        return self.counter.count(self.head(random.Random(0), prefix))

    def text(self, n_tokens: int, rng: random.Random, prefix: str = "") -> str:
        """Text starting with ``prefix`` whose token count, prefix included, is ``n_tokens``."""
        head = self.head(rng, prefix)
        have = self.counter.count(head)
        if n_tokens < have:
            raise ValueError(f"{n_tokens} tokens is shorter than the prefix and id ({have} tokens)")
        body = rng.choices(self.words, k=n_tokens - have)
        best: tuple[int, str] | None = None
        for _ in range(MAX_ROUNDS):
            text = head + "".join(" " + w for w in body)
            miss = n_tokens - self.counter.count(text)
            if best is None or abs(miss) < abs(best[0]):
                best = (miss, text)
            if miss == 0:
                return text
            if miss > 0:
                body += rng.choices(self.words, k=miss)
            elif -miss <= len(body):
                del body[miss:]
            else:
                break
        assert best is not None
        if abs(best[0]) <= TOLERANCE:
            return best[1]
        raise ValueError(f"could not build a {n_tokens}-token prompt (missed by {best[0]})")

    def shared(self, n_tokens: int, key: str, prefix: str = "") -> str:
        """The same text for the same (factory seed, ``key``, length) on every call."""
        return self.text(n_tokens, random.Random(f"shared:{self.seed}:{key}"), prefix)
