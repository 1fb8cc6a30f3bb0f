"""Prompt texts of an exact token count: the simulated tokenizer, real HF tokenizers
(byte-level BPE and SentencePiece-style Metaspace, trained here in a second), the word
selection, the bounded number of whole-text counts, and the ±2 fallback."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from app.bench.prompts import (
    MAX_ROUNDS,
    WORDS,
    HFCounter,
    PromptFactory,
    SimulatedCounter,
    single_token_words,
)

LENGTHS = (3, 4, 16, 64, 255, 1024, 4096, 16384)


def _hf_dir(dest: Path, style: str, vocab: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    alphabet: list[str] = []
    if style == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<unk>"], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator([" ".join(WORDS)] * 3 + ["[0123456789abcdef] Hello there."], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(str(dest))
    return dest


@pytest.fixture(scope="module", params=[("bytelevel", 2000), ("metaspace", 2000)])
def hf_counter(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> HFCounter:
    style, vocab = request.param
    return HFCounter.from_path(_hf_dir(tmp_path_factory.mktemp(style), style, vocab))


class CountingCounter:
    """Wraps a counter and counts the calls (and the characters counted)."""

    def __init__(self, inner: SimulatedCounter | HFCounter) -> None:
        self.inner, self.calls = inner, 0

    def count(self, text: str) -> int:
        self.calls += 1
        return self.inner.count(text)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("hello world", 2), ("a, b.", 4), ("<|user|>\nhi there", 3), ("[0a1b] x y", 5)],
)
def test_simulated_counter_counts_words_punctuation_and_tags(text: str, tokens: int) -> None:
    assert SimulatedCounter().count(text) == tokens


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("prefix", ["", "System: be brief.\n\n"])
def test_simulated_prompts_are_exact_and_start_with_the_prefix(n: int, prefix: str) -> None:
    factory = PromptFactory(SimulatedCounter(), seed=0)
    if n < factory.min_tokens(prefix):
        with pytest.raises(ValueError, match="shorter than the prefix"):
            factory.text(n, random.Random(n), prefix)
        return
    text = factory.text(n, random.Random(n), prefix)
    assert text.startswith(prefix)
    assert SimulatedCounter().count(text) == n
    assert set(text[len(prefix) :].split()[1:]) <= set(WORDS)


def test_hf_prompts_are_exact(hf_counter: HFCounter) -> None:
    factory = PromptFactory(hf_counter, seed=0)
    assert factory.words == WORDS  # every listed word is one token in these vocabularies
    rng = random.Random(1)
    for n in (16, 100, 1000, 16384):
        assert hf_counter.count(factory.text(n, rng)) == n
        assert hf_counter.count(factory.text(n, rng, prefix="Hello there.\n\n")) == n


def test_a_small_vocabulary_uses_only_its_single_token_words(tmp_path: Path) -> None:
    counter = HFCounter.from_path(_hf_dir(tmp_path, "bytelevel", 400))
    factory = PromptFactory(counter, seed=0)
    assert 8 <= len(factory.words) < len(WORDS)
    assert all(counter.count(f" {w}") == 1 for w in factory.words)
    rng = random.Random(2)
    assert [counter.count(factory.text(n, rng)) for n in (40, 500)] == [40, 500]


def test_too_few_single_token_words_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="single tokens"):
        PromptFactory(HFCounter.from_path(_hf_dir(tmp_path, "bytelevel", 300)), seed=0)


@pytest.mark.parametrize("n", [64, 16384])
def test_a_prompt_is_counted_a_bounded_number_of_times(n: int) -> None:
    counter = CountingCounter(SimulatedCounter())
    factory = PromptFactory(counter, seed=0)
    counter.calls = 0
    factory.text(n, random.Random(0))
    assert counter.calls == 2  # the head, then the whole text once: never word by word


def test_hf_prompt_counts_are_bounded_too(hf_counter: HFCounter) -> None:
    counter = CountingCounter(hf_counter)
    factory = PromptFactory(counter, seed=0)
    counter.calls = 0
    factory.text(4096, random.Random(0))
    assert counter.calls <= 1 + MAX_ROUNDS


class EvenCounter:
    """Words, but a text of three or more words counts as the next even number: an odd
    target of 3+ tokens is unreachable (as a tokenizer merging across words can be)."""

    def count(self, text: str) -> int:
        n = len(text.split())
        return n + (n % 2 if n >= 3 else 0)


class WildCounter:
    """One token per word up to two words, then ten per word: nothing lands near."""

    def count(self, text: str) -> int:
        n = len(text.split())
        return n if n <= 2 else 10 * n


def test_a_near_miss_within_tolerance_is_accepted_and_a_far_miss_raises() -> None:
    text = PromptFactory(EvenCounter(), seed=0).text(101, random.Random(0))
    assert abs(EvenCounter().count(text) - 101) <= 2
    with pytest.raises(ValueError, match="could not build a 101-token prompt"):
        PromptFactory(WildCounter(), seed=0).text(101, random.Random(0))


def test_prompts_are_deterministic_and_distinct() -> None:
    factory = PromptFactory(SimulatedCounter(), seed=0)
    assert factory.text(64, random.Random("a")) == factory.text(64, random.Random("a"))
    rng = random.Random(0)
    heads = {factory.text(64, rng).split()[0] for _ in range(2000)}
    assert len(heads) == 2000  # the first token differs: no accidental prefix-cache hits


def test_shared_text_depends_on_factory_seed_and_key_only() -> None:
    a, b = PromptFactory(SimulatedCounter(), seed=1), PromptFactory(SimulatedCounter(), seed=2)
    assert a.shared(50, "tenant-1") == a.shared(50, "tenant-1")
    assert a.shared(50, "tenant-1") != a.shared(50, "tenant-2")
    assert a.shared(50, "tenant-1") != b.shared(50, "tenant-1")
    assert SimulatedCounter().count(a.shared(50, "tenant-1")) == 50


def test_single_token_words_keeps_list_order() -> None:
    assert single_token_words(SimulatedCounter(), ("b", "a", "x-y")) == ("b", "a")
