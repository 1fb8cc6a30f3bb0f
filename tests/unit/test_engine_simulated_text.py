"""Deterministic text of the simulated engine: tokenizer, token stream, words, embeddings."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.engine.protocol import GenerationRequest, SamplingOptions
from app.engine.simulated_text import (
    WORDS,
    GeneratedText,
    chat_prompt,
    digest,
    draw_token,
    embedding,
    stream_key,
    tokenize,
    word,
)


def request(
    request_id: str = "r", prompt: tuple[int, ...] = (1, 2, 3), **sampling: Any
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=SamplingOptions(**sampling),
        max_tokens=8,
    )


def generated(token_ids: list[int], stop: tuple[str, ...] = ()) -> tuple[GeneratedText, bool]:
    text = GeneratedText(stop)
    stopped = False
    for token_id in token_ids:
        stopped = text.append(token_id)
        if stopped:
            break
    return text, stopped


# --- tokenizer ------------------------------------------------------------------------


def test_tokenizer_splits_tags_words_and_punctuation() -> None:
    ids = tokenize("<|user|>\nHello, yard!", 1000)
    assert ids == [tokenize(piece, 1000)[0] for piece in ("<|user|>", "Hello", ",", "yard", "!")]
    assert ids[1] == int.from_bytes(digest(b"Hello"), "little") % 1000
    assert all(0 <= i < 1000 for i in tokenize("a b c d e f g", 1000))
    assert tokenize("   ", 1000) == []


def test_chat_prompt_ends_with_the_generation_prompt() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat_prompt(messages) == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


# --- token stream ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (request("x", temperature=0.0, seed=1), request("y", temperature=0.0, seed=2), True),
        (request("x", seed=1), request("y", seed=1), True),
        (request("x", seed=1), request("x", seed=2), False),
        (request("x", temperature=1.0), request("y", temperature=1.0), False),
        (request("x", temperature=0.0), request("x", (1, 2, 4), temperature=0.0), False),
    ],
    ids=["greedy-ignores-seed", "seed", "other-seed", "request-id", "prompt"],
)
def test_stream_key_depends_on_what_the_sampling_mode_names(
    a: GenerationRequest, b: GenerationRequest, same: bool
) -> None:
    assert stream_key(a) == stream_key(a)
    assert (stream_key(a) == stream_key(b)) is same


def test_draw_token_is_a_function_of_key_and_position() -> None:
    key = stream_key(request())
    draws = [draw_token(key, position, 50) for position in range(200)]
    assert draws == [draw_token(key, position, 50) for position in range(200)]
    assert all(0 <= token_id < 50 and 0.0 <= eos < 1.0 for token_id, eos in draws)
    assert len(set(draws)) == len(draws)
    assert 0.3 < sum(eos for _, eos in draws) / len(draws) < 0.7


def test_words_come_from_the_fixed_list() -> None:
    assert [word(i) for i in range(len(WORDS))] == list(WORDS)
    assert word(len(WORDS) + 2) == WORDS[2]


# --- generated text, stop strings -----------------------------------------------------


def test_words_are_joined_with_spaces_and_held_back_only_with_stop_strings() -> None:
    text, stopped = generated([0, 1, 2])
    assert (text.text, stopped, text.holdback) == ("the a switch", False, 0)
    assert text.take(final=False) == "the a switch"
    assert text.take(final=False) is None
    assert text.take(final=True) == ""


def test_stop_string_across_words_cuts_the_text() -> None:
    text, stopped = generated([0, 1, 2, 3], stop=("a sw",))
    assert (text.text, stopped) == ("the ", True)


def test_earliest_stop_string_wins() -> None:
    text, stopped = generated([4, 5, 6, 7], stop=("ack", "in tr"))  # "train track ..."
    assert (text.text, stopped) == ("tra", True)


def test_tail_that_may_start_a_stop_string_is_held_back() -> None:
    text = GeneratedText(("zzzz",))
    assert text.holdback == 3
    assert not text.append(2)  # "switch"
    assert text.take(final=False) == "swi"
    assert not text.append(3)  # "switch yard"
    assert text.take(final=False) == "tch y"
    assert text.take(final=True) == "ard"
    assert text.take(final=True) == ""


def test_empty_stop_strings_are_ignored() -> None:
    text, stopped = generated([0, 1], stop=("",))
    assert (text.text, stopped) == ("the a", False)


# --- embeddings -----------------------------------------------------------------------


def test_embeddings_are_unit_vectors_closer_for_shared_words() -> None:
    def vector(text: str) -> list[float]:
        return embedding(tokenize(text, 1000), 64)

    base, near, far = vector("quick red train"), vector("quick red cargo"), vector("no maybe yes")
    for v in (base, near, far, embedding([], 64)):
        assert len(v) == 64
        assert math.sqrt(sum(x * x for x in v)) == pytest.approx(1.0)
    assert base == vector("quick red train")

    def dot(u: list[float], v: list[float]) -> float:
        return sum(x * y for x, y in zip(u, v, strict=True))

    assert dot(base, near) > dot(base, far)
