"""What a PEFT LoRA adapter directory declares, checked before it is registered.

Rule: the directory holds ``adapter_config.json`` with ``peft_type`` LORA, an integer
rank ``r`` no larger than the pool's ``max_lora_rank``, and ``target_modules`` that the
base model has (a weight name of the base ends in ``<module>.weight``), plus the weights
(``adapter_model.safetensors`` or ``adapter_model.bin``). Anything else is refused with
a message that names the problem.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class AdapterInvalid(ValueError):
    """The adapter cannot be served as given; the message says why."""


@dataclass(frozen=True)
class AdapterFiles:
    rank: int
    target_modules: tuple[str, ...]


def inspect_adapter(path: Path) -> AdapterFiles:
    config_path = path / "adapter_config.json"
    if not path.is_dir():
        raise AdapterInvalid(f"{path} is not a directory on this node")
    if not config_path.is_file():
        raise AdapterInvalid(f"{path} holds no adapter_config.json (not a PEFT adapter)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterInvalid(f"{config_path} is not readable JSON: {exc}") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterInvalid(f"{config_path}: peft_type must be LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterInvalid(f"{config_path}: r (the rank) must be a positive integer")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterInvalid(f"{config_path}: target_modules must name the modules adapted")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise AdapterInvalid(f"{path} holds no adapter weights ({' or '.join(WEIGHT_FILES)})")
    return AdapterFiles(rank, tuple(targets))


def base_weight_names(model_dir: Path) -> set[str]:
    """Weight names of a Hugging Face model directory, from its safetensors headers
    (or their index) without loading any tensor."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    names: set[str] = set()
    for file in sorted(model_dir.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        names.update(k for k in header if k != "__metadata__")
    return names


def check_adapter(files: AdapterFiles, max_rank: int, base_names: set[str] | None) -> None:
    """Refuse a rank above the pool's limit and target modules the base lacks (checked
    when the base's weights are on this node: ``base_names``)."""
    if files.rank > max_rank:
        raise AdapterInvalid(
            f"rank {files.rank} exceeds the pool's max_lora_rank {max_rank} "
            "(raise lora.max_lora_rank for the base model)"
        )
    if base_names:
        missing = [t for t in files.target_modules
                   if not any(n.endswith(f"{t}.weight") for n in base_names)]  # fmt: skip
        if missing:
            raise AdapterInvalid(f"target modules {missing} are not modules of the base model")
