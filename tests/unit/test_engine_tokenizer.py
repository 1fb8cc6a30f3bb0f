"""Prompt tokenizers (app/engine/tokenizer.py): the ids the gateway counts are the ids the
engine processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.engine.simulated import SimulatedEngine, SimulationProfile
from app.engine.simulated_text import chat_prompt, tokenize
from app.engine.tokenizer import HFPromptTokenizer, SimulatedPromptTokenizer

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "<|user|> tags, numbers 12 345 and émojis 🙂",
    "  leading and trailing spaces  \n\n",
]

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    [{"role": "user", "content": ""}],
]


# ---- simulated ------------------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [2, 1000, 49152])
@pytest.mark.parametrize("text", TEXTS)
def test_simulated_tokenize_matches_the_engine(vocab_size: int, text: str) -> None:
    profile = SimulationProfile(vocab_size=vocab_size)
    engine = SimulatedEngine(profile)
    tok = SimulatedPromptTokenizer(vocab_size)
    ids = tok.tokenize(text)
    assert ids == engine.tokenize(text) == tokenize(text, vocab_size)
    assert tok.embedding_input(text) == ids
    assert all(0 <= i < vocab_size for i in ids)


@pytest.mark.parametrize("messages", CHATS)
def test_simulated_chat_template_matches_the_engine(messages: list[dict[str, str]]) -> None:
    profile = SimulationProfile()
    engine = SimulatedEngine(profile)
    tok = SimulatedPromptTokenizer(profile.vocab_size)
    ids = tok.apply_chat_template(messages)
    assert ids == engine.apply_chat_template(messages)
    assert ids == tok.tokenize(chat_prompt(messages))
    generation_prompt = tok.tokenize("<|assistant|>\n")
    assert ids[-len(generation_prompt) :] == generation_prompt


def test_simulated_tokenize_depends_on_vocab_size() -> None:
    text = "a b c d e f g h"
    assert SimulatedPromptTokenizer(1000).tokenize(text) != SimulatedPromptTokenizer(997).tokenize(
        text
    )


# ---- Hugging Face ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFPromptTokenizer:
    return HFPromptTokenizer.from_path(tiny_model_dir)


@pytest.fixture(scope="module")
def raw_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def bos_eos_tokenizer(tiny_model_dir: Path) -> Any:
    """The tiny tokenizer with a post-processor that wraps every text in <s> … </s>."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    bos, eos = tok.bos_token_id, tok.eos_token_id
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return tok


@pytest.mark.parametrize("messages", CHATS)
def test_hf_chat_template_ends_with_the_generation_prompt(
    hf: HFPromptTokenizer, raw_tokenizer: Any, messages: list[dict[str, str]]
) -> None:
    ids = hf.apply_chat_template(messages)
    rendered = raw_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("<s>assistant\n")
    assert ids == raw_tokenizer.encode(rendered, add_special_tokens=False)
    generation_prompt = raw_tokenizer.encode("<s>assistant\n", add_special_tokens=False)
    assert generation_prompt[0] == raw_tokenizer.bos_token_id
    assert ids[-len(generation_prompt) :] == generation_prompt
    # the template's <s> markers are the only BOS ids: none is added in front
    assert ids.count(raw_tokenizer.bos_token_id) == len(messages) + 1
    assert raw_tokenizer.decode(ids) == rendered


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
@pytest.mark.parametrize("wrapped", [False, True])
def test_hf_tokenize_has_no_special_tokens(
    raw_tokenizer: Any, bos_eos_tokenizer: Any, text: str, wrapped: bool
) -> None:
    tok = bos_eos_tokenizer if wrapped else raw_tokenizer
    ids = HFPromptTokenizer(tok).tokenize(text)
    assert ids
    assert not set(ids) & set(tok.all_special_ids)
    assert ids == tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
@pytest.mark.parametrize("wrapped", [False, True])
def test_hf_embedding_input_adds_the_tokenizers_special_tokens(
    raw_tokenizer: Any, bos_eos_tokenizer: Any, text: str, wrapped: bool
) -> None:
    tok = bos_eos_tokenizer if wrapped else raw_tokenizer
    hf = HFPromptTokenizer(tok)
    ids = hf.embedding_input(text)
    assert ids == tok.encode(text)
    plain = hf.tokenize(text)
    if wrapped:
        assert ids == [tok.bos_token_id, *plain, tok.eos_token_id]
    else:  # this tokenizer defines no post-processor: nothing to add
        assert ids == plain


def test_hf_returns_plain_lists(hf: HFPromptTokenizer) -> None:
    for ids in (
        hf.tokenize("hello"),
        hf.embedding_input("hello"),
        hf.apply_chat_template(CHATS[0]),
    ):
        assert type(ids) is list and all(type(i) is int for i in ids)
