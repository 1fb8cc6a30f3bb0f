"""Deterministic text for the SIMULATED engine (:mod:`app.engine.simulated`).

Part of the simulation: no model, no weights, nothing here resembles a real tokenizer.

* Tokenizer: special tags (``<|user|>``), words and punctuation are one token each; a
  token id is BLAKE2b(piece) mod vocab_size.
* Generation: the n-th generated token id is BLAKE2b(stream key, n) mod vocab_size and is
  shown as a word of the fixed :data:`WORDS` list; the same digest gives the simulated
  EOS draw. The stream key is a function of the prompt and, by sampling mode, nothing
  else (temperature 0: greedy, seed ignored as in vLLM), the seed, or the request id.
  temperature/top_p do not otherwise change anything. :class:`GeneratedText` joins the
  words with spaces, cuts the text at the earliest stop string and holds back the tail
  that could still become one.
* Embeddings: the normalised sum of per-token pseudo-random vectors (SHAKE-256 of the
  token id), so texts sharing words point in similar directions.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.protocol import GenerationRequest

__all__ = [
    "WORDS",
    "GeneratedText",
    "chat_prompt",
    "digest",
    "draw_token",
    "embedding",
    "stream_key",
    "tokenize",
    "word",
]

# fmt: off
WORDS = (
    "the", "a", "switch", "yard", "train", "track", "signal", "engine", "cargo",
    "route", "station", "north", "south", "east", "west", "quick", "slow", "red",
    "green", "blue", "light", "heavy", "steel", "rail", "line", "cache", "token",
    "batch", "prefix", "block", "queue", "step", "model", "serve", "reply", "simulated",
    "river", "bridge", "tunnel", "valley", "hill", "morning", "evening", "and", "of",
    "to", "in", "on", "with", "for", "is", "was", "runs", "waits", "moves", "stops",
    "carries", "leaves", "arrives", "yes", "no", "maybe", "one", "two",
)
# fmt: on
_TOKEN_RE = re.compile(r"<\|\w+\|>|\w+|[^\w\s]")


def digest(payload: bytes) -> bytes:
    """The 16-byte BLAKE2b digest every simulated id and draw is taken from."""
    return hashlib.blake2b(payload, digest_size=16).digest()


def tokenize(text: str, vocab_size: int) -> list[int]:
    """Simulated tokenizer: special tags, words and punctuation, each a token."""
    return [
        int.from_bytes(digest(piece.encode()), "little") % vocab_size
        for piece in _TOKEN_RE.findall(text)
    ]


def chat_prompt(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> str:
    """The simulated chat template, ending with the generation prompt: tools as JSON
    in a tools block first, then each message's content and tool calls."""
    rendered = f"<|tools|>\n{json.dumps(list(tools))}\n" if tools else ""
    for m in messages:
        calls = f"\n{json.dumps(m['tool_calls'])}" if m.get("tool_calls") else ""
        rendered += f"<|{m['role']}|>\n{m.get('content') or ''}{calls}\n"
    return rendered + "<|assistant|>\n"


def stream_key(request: GenerationRequest) -> bytes:
    """What the generated tokens are a function of (see the module docstring)."""
    prompt = struct.pack(f"<{len(request.prompt_token_ids)}q", *request.prompt_token_ids)
    sampling = request.sampling
    if sampling.temperature == 0:
        salt = b"greedy"
    elif sampling.seed is not None:
        salt = b"seed:" + str(sampling.seed).encode()
    else:
        salt = b"request:" + request.request_id.encode()
    return digest(digest(prompt) + salt)


def draw_token(key: bytes, position: int, vocab_size: int) -> tuple[int, float]:
    """The token id at ``position`` of the stream ``key`` and its EOS draw in [0, 1)."""
    raw = digest(key + struct.pack("<q", position))
    token_id = int.from_bytes(raw[:8], "little") % vocab_size
    eos_draw = int.from_bytes(raw[8:], "little") / 2.0**64
    return token_id, eos_draw


def word(token_id: int) -> str:
    """How a generated token id reads: one word of :data:`WORDS`."""
    return WORDS[token_id % len(WORDS)]


def embedding(token_ids: Sequence[int], dim: int) -> list[float]:
    """A unit vector of ``dim`` floats: the normalised sum of per-token vectors."""
    acc = [0.0] * dim
    for token_id in token_ids or [-1]:
        raw = hashlib.shake_256(struct.pack("<q", token_id)).digest(2 * dim)
        for i, (value,) in enumerate(struct.iter_unpack("<h", raw)):
            acc[i] += value / 32768.0
    norm = math.sqrt(sum(v * v for v in acc)) or 1.0
    return [v / norm for v in acc]


@dataclass(eq=False)
class GeneratedText:
    """The text of one generation and how much of it was sent.

    The last ``len(longest stop string) - 1`` characters are held back while generation
    goes on, so a stop string spanning two words is never sent in part.
    """

    stop: tuple[str, ...] = ()
    text: str = ""
    sent_chars: int = 0
    matched: str | None = None  # the stop string that ended the text
    holdback: int = field(init=False)

    def __post_init__(self) -> None:
        self.holdback = max((len(s) for s in self.stop), default=1) - 1

    def append(self, token_id: int) -> bool:
        """Add the word of ``token_id``; True when a stop string ended the text there."""
        searched_from = max(0, len(self.text) - self.holdback)
        piece = word(token_id)
        self.text += " " + piece if self.text else piece
        hits = [(i, s) for s in self.stop if s and (i := self.text.find(s, searched_from)) >= 0]
        if hits:
            at, self.matched = min(hits)
            self.text = self.text[:at]
        return bool(hits)

    def take(self, final: bool) -> str | None:
        """Newly sendable text (all of it when ``final``); None if nothing to send."""
        visible = len(self.text) if final else max(self.sent_chars, len(self.text) - self.holdback)
        if visible <= self.sent_chars and not final:
            return None
        chunk = self.text[self.sent_chars : visible]
        self.sent_chars = visible
        return chunk
