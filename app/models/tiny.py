"""A tiny random-weight Llama for fast engine tests where text quality does not matter.

``build_tiny_llama(dest, seed)`` writes a Hugging Face directory that transformers and
vLLM's CPU build load: ``LlamaForCausalLM`` with hidden size 128, 2 layers, 4 heads
(head dim 32, a size vLLM's CPU attention supports), intermediate size 256, 2048
positions, bfloat16 safetensors; and a byte-level BPE tokenizer trained here on
:data:`CORPUS` (vocabulary ~1000, special tokens ``<unk>`` ``<s>`` ``</s>``; ``</s>`` is
eos and pad) saved as ``PreTrainedTokenizerFast`` with :data:`CHAT_TEMPLATE` inline.

The same seed gives byte-identical files. The directory is built beside ``dest`` and
renamed into place with a manifest (see :mod:`app.models.prepare`); a later call finds
the manifest and returns at once.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from app.models.store import (
    Manifest,
    directory_lock,
    hash_files,
    inline_tokenizer_config,
    pin_llama_config,
    publish_directory,
    quiet_transformers,
    read_valid_manifest,
    staging_directory,
    write_manifest,
)

__all__ = ["CHAT_TEMPLATE", "CORPUS", "RECIPE", "build_tiny_llama", "build_tiny_lora"]

RECIPE = "tiny-llama-1"
"""Bumped whenever the output of :func:`build_tiny_llama` changes."""

HIDDEN_SIZE = 128
LAYERS = 2
HEADS = 4
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 2048
VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)

_WORD_TEXT = """
time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot
right study book eye job word business issue side kind head house service friend father
power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education foot boy age policy everything process music market sense nation plan college
interest death experience effect class control care field development role effort rate
heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax
director position player record paper space ground form event official matter center
couple site project activity star table need court oil situation cost industry figure
street image phone data picture practice piece land product doctor wall patient worker
news test movie north love support technology step baby computer type attention film
tree source organization hair window evidence population truth song analysis bank
"""
_WORDS = tuple(_WORD_TEXT.split())

_SUBJECTS = ("the model", "a replica", "the router", "every tenant", "the gateway", "a client")
_VERBS = ("streams", "routes", "admits", "batches", "serves", "caches", "decodes", "releases")
_OBJECTS = ("tokens", "prompts", "answers", "prefixes", "embeddings", "chunks", "metrics")
_PROSE = (
    "Once upon a time there was a small language model that lived on a quiet computer.",
    "What is the capital of France? The capital of France is Paris.",
    "Hello! How are you today? I am fine, thank you for asking.",
    "The quick brown fox jumps over the lazy dog near the old stone bridge.",
    "Numbers like 1, 2, 3, 10, 42, 100 and 2048 appear in many technical texts.",
    "Please write a short poem about the sea, the wind and the distant mountains.",
    "A user asks a question and the assistant answers briefly and politely.",
    "Keep the answer short: yes or no, true or false, left or right, up or down.",
)

CORPUS: tuple[str, ...] = (
    _PROSE
    + tuple(
        f"{subject.capitalize()} {verb} {obj}."
        for subject, verb, obj in itertools.product(_SUBJECTS, _VERBS, _OBJECTS)
    )
    + tuple(
        f"The {first} and the {second} of the {third}."
        for first, second, third in zip(
            _WORDS, _WORDS[1:] + _WORDS[:1], _WORDS[2:] + _WORDS[:2], strict=True
        )
    )
    + tuple(
        f"{word.capitalize()}, {word}s and {word} {index}." for index, word in enumerate(_WORDS)
    )
)
"""Built-in training text for the tokenizer (fixed, so the vocabulary is too)."""


def _train_tokenizer(out: Path) -> int:
    """Train the BPE tokenizer, save it into ``out``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    inline_tokenizer_config(out, model_max_length=MAX_POSITIONS)
    return int(tokenizer.get_vocab_size())


def _write_model(out: Path, vocab_size: int, seed: int) -> dict[str, str]:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    token_ids = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=token_ids["<s>"],
        eos_token_id=token_ids["</s>"],
        pad_token_id=token_ids["</s>"],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    torch.nn.Module.to(model, torch.bfloat16)  # in place, after a float32 init
    with quiet_transformers():
        model.save_pretrained(out)
    pin_llama_config(out, default_rope_theta=10000.0, dtype="bfloat16")
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def build_tiny_llama(dest: Path, seed: int = 0) -> Path:
    """Build (or find) the tiny Llama at ``dest``; returns ``dest``."""
    origin = {"recipe": RECIPE, "seed": str(seed)}
    if read_valid_manifest(dest, dest.name, origin) is not None:
        return dest
    with directory_lock(dest):
        if read_valid_manifest(dest, dest.name, origin) is not None:
            return dest
        with staging_directory(dest) as staging:
            vocab_size = _train_tokenizer(staging)
            converter = _write_model(staging, vocab_size, seed)
            manifest = Manifest.build(
                name=dest.name,
                origin=origin,
                source_sha256=None,
                converter=converter,
                files=hash_files(staging),
            )
            write_manifest(staging, manifest)
            publish_directory(staging, dest)
    return dest


LORA_TARGETS = ("q_proj", "v_proj")


def build_tiny_lora(dest: Path, seed: int, rank: int = 8, scale: float = 0.5) -> Path:
    """A random rank-``rank`` LoRA adapter of the tiny Llama as PEFT writes one
    (``adapter_config.json`` and ``adapter_model.safetensors``, targets q_proj and
    v_proj of every layer): large enough weights that greedy output changes, so a test
    can tell which adapter ran. The same seed gives the same weights."""
    import json

    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer, module in itertools.product(range(LAYERS), LORA_TARGETS):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, HIDDEN_SIZE, generator=gen) * scale
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(HIDDEN_SIZE, rank, generator=gen) * scale
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(LORA_TARGETS),
        "base_model_name_or_path": "tiny-llama",
    }  # fmt: skip
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return dest
