"""A random-weight LoRA adapter for any served Hugging Face model, written as PEFT writes
one: for trying the adapter workflow and for benchmarks, without downloading a
fine-tune. Its weights are random (it changes the model's answers, it teaches nothing).

Rule: for every weight ``<prefix>.<module>.weight`` of the base (read from its
safetensors headers, no tensor loaded) whose module is in ``targets``, with shape
(out, in), write ``lora_A`` (rank × in, N(0, 1/in)) and ``lora_B`` (out × rank,
N(0, scale²/rank)) under ``base_model.model.<prefix>.<module>``; ``lora_alpha`` is
2 × rank. The same base, seed, rank and scale give the same files.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

DEFAULT_TARGETS = ("q_proj", "v_proj")


def _weight_shapes(model_dir: Path) -> Iterator[tuple[str, list[int]]]:
    for file in sorted(model_dir.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                yield name, list(meta["shape"])


def build_random_lora(
    dest: Path,
    base_dir: Path,
    *,
    seed: int = 0,
    rank: int = 8,
    scale: float = 0.5,
    targets: Sequence[str] = DEFAULT_TARGETS,
) -> Path:
    """Write the adapter into ``dest`` and return it; ``base_dir`` is the base model's
    weights directory. Raises ValueError when the base has none of ``targets``."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(_weight_shapes(base_dir)):
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or module.rpartition(".")[2] not in targets or len(shape) != 2:
            continue
        out, inp = shape
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) / math.sqrt(inp)
        tensors[f"{prefix}.lora_B.weight"] = (
            torch.randn(out, rank, generator=gen) * scale / math.sqrt(rank)
        )
    if not tensors:
        raise ValueError(f"{base_dir} has no weights of the modules {list(targets)}")
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(targets),
        "base_model_name_or_path": base_dir.name,
    }  # fmt: skip
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return dest
