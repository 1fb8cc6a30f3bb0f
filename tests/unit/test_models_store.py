"""Tests for app.models.store: manifests, hashing, locking and publishing on real files."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib
import json
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.models import store
from app.models.store import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    directory_lock,
    file_sha256,
    hash_files,
    inline_tokenizer_config,
    pin_llama_config,
    publish_directory,
    quiet_transformers,
    read_valid_manifest,
    staging_directory,
    tree_sha256,
    write_manifest,
)

ORIGIN = {"distribution": "example-wheel", "version": "1.0"}


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("bee\n")
    (root / "a.bin").write_bytes(bytes(range(256)))
    (root / "sub" / "c.json").write_text('{"c": 1}\n')
    return root


def publish_manifest(root: Path, name: str = "example") -> Manifest:
    manifest = Manifest.build(name, {**ORIGIN, "file": "x"}, "f" * 64, {"t": "1"}, hash_files(root))
    write_manifest(root, manifest)
    return manifest


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


# --- hashing --------------------------------------------------------------------------


def test_hash_files_lists_every_file_but_the_manifest_sorted(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    (root / MANIFEST_NAME).write_text("{}")
    entries = hash_files(root)
    assert [e.path for e in entries] == ["a.bin", "b.txt", "sub/c.json"]
    assert entries[1] == FileEntry("b.txt", 4, hashlib.sha256(b"bee\n").hexdigest())
    assert all(e.sha256 == file_sha256(root / e.path) for e in entries)


def test_tree_checksum_is_sha256sum_of_sorted_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    lines = "".join(
        f"{file_sha256(root / rel)}  {rel}\n" for rel in ("a.bin", "b.txt", "sub/c.json")
    )
    expected = hashlib.sha256(lines.encode()).hexdigest()
    assert tree_sha256(hash_files(root)) == expected
    assert tree_sha256(tuple(reversed(hash_files(root)))) == expected  # order-free


# --- manifest -------------------------------------------------------------------------


def test_manifest_round_trips_through_json(tmp_path: Path) -> None:
    manifest = publish_manifest(make_tree(tmp_path / "m"))
    text = (tmp_path / "m" / MANIFEST_NAME).read_text(encoding="utf-8")
    assert text == manifest.to_json()
    assert json.loads(text)["format"] == store.MANIFEST_FORMAT
    assert Manifest.from_json(text) == manifest
    assert manifest.sha256 == tree_sha256(manifest.files)


@pytest.mark.parametrize(
    "text",
    ["{", "[]", "{}", json.dumps({"format": 999}), json.dumps({"format": 1, "name": "x"})],
    ids=["truncated", "list", "empty", "other-format", "missing-keys"],
)
def test_manifest_from_bad_json_is_none(text: str) -> None:
    assert Manifest.from_json(text) is None


def test_read_valid_manifest_accepts_an_intact_directory(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    manifest = publish_manifest(root)
    assert read_valid_manifest(root, "example", ORIGIN) == manifest
    assert read_valid_manifest(root, "example", ORIGIN, verify=True) == manifest


def _same_size_flip(root: Path) -> None:
    data = bytearray((root / "a.bin").read_bytes())
    data[0] ^= 0xFF
    (root / "a.bin").write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "name", "origin"),
    [
        pytest.param(lambda root: None, "other", ORIGIN, id="other-name"),
        pytest.param(lambda root: None, "example", {"version": "2.0"}, id="other-origin"),
        pytest.param(lambda root: (root / "b.txt").write_text("b"), "example", ORIGIN, id="size"),
        pytest.param(lambda root: (root / "x").write_text(""), "example", ORIGIN, id="extra"),
        pytest.param(lambda root: (root / "b.txt").unlink(), "example", ORIGIN, id="missing"),
        pytest.param(
            lambda root: (root / MANIFEST_NAME).unlink(), "example", ORIGIN, id="no-manifest"
        ),
    ],
)
def test_read_valid_manifest_rejects_a_mismatch(
    tmp_path: Path, damage: Callable[[Path], object], name: str, origin: dict[str, str]
) -> None:
    root = make_tree(tmp_path / "m")
    publish_manifest(root)
    damage(root)
    assert read_valid_manifest(root, name, origin) is None


def test_only_verify_catches_a_same_size_corruption(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    manifest = publish_manifest(root)
    _same_size_flip(root)
    assert read_valid_manifest(root, "example", ORIGIN) == manifest
    assert read_valid_manifest(root, "example", ORIGIN, verify=True) is None


def test_read_valid_manifest_rejects_a_wrong_tree_checksum(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "m")
    publish_manifest(root)
    document = read_json(root / MANIFEST_NAME)
    document["sha256"] = "0" * 64
    write_json(root / MANIFEST_NAME, document)
    assert read_valid_manifest(root, "example", ORIGIN) is None


# --- lock, staging, publish -----------------------------------------------------------


def test_directory_lock_excludes_other_holders(tmp_path: Path) -> None:
    dest = tmp_path / "models" / "m"
    order: list[str] = []
    held = threading.Event()

    def other() -> None:
        held.wait()
        with directory_lock(dest):
            order.append("other")

    thread = threading.Thread(target=other)
    thread.start()
    with directory_lock(dest):
        held.set()
        time.sleep(0.2)
        order.append("first")
    thread.join(timeout=10)
    assert order == ["first", "other"]
    assert (tmp_path / "models" / ".m.lock").is_file()


def test_staging_directory_clears_leftovers_and_itself(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    for leftover in (".m.staging-old", ".m.old-old", ".other.staging-x"):
        (tmp_path / leftover).mkdir()
    with staging_directory(dest) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".m.staging-")
        (staging / "f").write_text("x")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [".other.staging-x", staging.name]
        )
    assert not staging.exists()


def test_staging_directory_is_removed_on_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), staging_directory(tmp_path / "m") as staging:
        raise RuntimeError("converter crashed")
    assert not staging.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replace"])
def test_publish_directory_renames_into_place(tmp_path: Path, existing: bool) -> None:
    dest = tmp_path / "m"
    if existing:
        dest.mkdir()
        (dest / "stale").write_text("old")
    with staging_directory(dest) as staging:
        make_tree(staging)
        os.chmod(staging / "b.txt", 0o600)
        publish_directory(staging, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert sorted(e.path for e in hash_files(dest)) == ["a.bin", "b.txt", "sub/c.json"]
    assert stat.S_IMODE((dest / "b.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755


# --- Hugging Face fix-ups -------------------------------------------------------------


def test_inline_tokenizer_config_moves_the_template_in(tmp_path: Path) -> None:
    write_json(
        tmp_path / "tokenizer_config.json",
        {"tokenizer_class": "GPT2Tokenizer", "local_files_only": True, "eos_token": "</s>"},
    )
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    inline_tokenizer_config(tmp_path, model_max_length=512)
    assert read_json(tmp_path / "tokenizer_config.json") == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "chat_template": "{{ messages }}",
    }
    assert not (tmp_path / "chat_template.jinja").exists()


def test_inline_tokenizer_config_requires_a_chat_template(tmp_path: Path) -> None:
    write_json(tmp_path / "tokenizer_config.json", {})
    with pytest.raises(ValueError, match="no chat template"):
        inline_tokenizer_config(tmp_path, model_max_length=512)


@pytest.mark.parametrize(
    ("rope", "expected_theta"), [({"rope_theta": 5e5}, 5e5), (None, 1e4)], ids=["set", "default"]
)
def test_pin_llama_config(
    tmp_path: Path, rope: dict[str, float] | None, expected_theta: float
) -> None:
    write_json(
        tmp_path / "config.json",
        {"max_position_embeddings": 2048, "rope_parameters": rope, "_model_name_or_path": "/x"},
    )
    assert pin_llama_config(tmp_path, default_rope_theta=1e4, dtype="bfloat16") == 2048
    config = read_json(tmp_path / "config.json")
    assert config["rope_theta"] == expected_theta
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    assert "_model_name_or_path" not in config


def test_quiet_transformers_silences_and_restores_progress_bars() -> None:
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    before = (hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm)
    with quiet_transformers():
        assert not hf_logging.is_progress_bar_enabled()
        assert gguf_utils.tqdm is not before[1]
    assert (hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm) == before

