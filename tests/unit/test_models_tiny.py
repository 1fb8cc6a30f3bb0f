"""Tests for app.models.tiny: a real build, loaded and run with transformers."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
from pathlib import Path
from typing import Any

import pytest

from app.models import tiny as tiny_module
from app.models.store import MANIFEST_NAME, Manifest, file_sha256
from app.models.tiny import CHAT_TEMPLATE, build_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


def manifest_sha(root: Path) -> str:
    manifest = Manifest.from_json((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest is not None
    return manifest.sha256


def test_config_has_the_tiny_shape(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    shape = {
        key: config[key]
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        )
    }
    assert shape == {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "max_position_embeddings": 2048,
    }
    assert config["head_dim"] == 32  # a head size vLLM's CPU attention supports
    assert config["torch_dtype"] == "bfloat16"
    assert "rope_theta" in config


def test_tokenizer_matches_the_model(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    config = json.loads((tiny / "config.json").read_text())
    assert 900 <= len(tokenizer) <= 1000
    assert len(tokenizer) == config["vocab_size"]
    assert tokenizer.eos_token == "</s>"
    assert tokenizer.convert_tokens_to_ids("</s>") == config["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids("<s>") == config["bos_token_id"]
    tokenizer_config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    text = "Grüße, 世界! tabs\tand  spaces"
    assert tokenizer.decode(tokenizer.encode(text)) == text  # byte-level: nothing is <unk>


def test_chat_template_renders(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<s>user\nHi</s>\n<s>assistant\n"


def test_generates_three_tokens(tiny: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    assert model.dtype == torch.bfloat16
    inputs: Any = tokenizer("The model streams tokens", return_tensors="pt")
    prompt_length = inputs["input_ids"].shape[1]
    output = model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert output.shape == (1, prompt_length + 3)
    assert torch.equal(output[0, :prompt_length], inputs["input_ids"][0])


def test_second_build_returns_at_once(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid copy is found from its manifest: no lock is taken, nothing is built or
    rewritten (asserted on what runs, not on a wall clock)."""
    weights = tiny / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a valid copy must not be rebuilt")

    monkeypatch.setattr(tiny_module, "directory_lock", no_build)
    monkeypatch.setattr(tiny_module, "_write_model", no_build)
    assert build_tiny_llama(tiny) == tiny
    assert weights.stat().st_mtime_ns == mtime


def test_same_seed_same_bytes_other_seed_other_weights(tiny: Path, tmp_path: Path) -> None:
    again = build_tiny_llama(tmp_path / "llama")  # same directory name as the fixture's
    other = build_tiny_llama(tmp_path / "other", seed=1)
    assert manifest_sha(again) == manifest_sha(tiny)
    assert file_sha256(other / "model.safetensors") != file_sha256(tiny / "model.safetensors")
    assert file_sha256(other / "tokenizer.json") == file_sha256(tiny / "tokenizer.json")


def test_a_different_seed_replaces_an_existing_build(tmp_path: Path) -> None:
    dest = build_tiny_llama(tmp_path / "llama", seed=0)
    before = file_sha256(dest / "model.safetensors")
    build_tiny_llama(dest, seed=2)
    assert file_sha256(dest / "model.safetensors") != before
    manifest = Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert manifest is not None and manifest.origin["seed"] == "2"
