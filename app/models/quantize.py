# Weight quantization of a Llama-family Hugging Face directory into vLLM's
# compressed-tensors format, here, without calibration data (round to nearest).
#
# Rule. Every linear projection of the decoder layers (q/k/v/o, gate/up/down) is
# quantized symmetrically; embeddings, norms and the (tied) head keep the source dtype.
#   w8a8:  int8 weights, one scale per output channel (max |w| ÷ 127); activations int8
#          per token, dynamic (vLLM computes their scale at run time). Format
#          ``int-quantized``: vLLM's CPU build runs it on its int8 scaled-mm kernel.
#   w4a16: int4 weights, one scale per group of ``group_size`` input columns (max |w| ÷
#          7, values clamped to [-8, 7]), packed eight to an int32; activations stay
#          16-bit. Format ``pack-quantized``: vLLM's CPU build runs it on its WNA16 kernel.
# Scales keep the source dtype. Round to nearest is the simplest scheme; GPTQ and AWQ
# calibrate on data to lose less and are not done here. Every other file of the source
# (tokenizer, generation config; not its manifest) is copied; config.json gains
# ``quantization_config``.
#
# Parameters: scheme (w8a8 | w4a16), group_size (64; must divide every input width).
"""``quantize``: a model directory → its int8 or int4 weight-quantized copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from app.models.store import MANIFEST_NAME

Scheme = Literal["w8a8", "w4a16"]
SCHEMES: tuple[Scheme, ...] = ("w8a8", "w4a16")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP_SIZE = 64


def quantization_config(scheme: Scheme, group_size: int = GROUP_SIZE) -> dict[str, Any]:
    """config.json's ``quantization_config`` for ``scheme`` (compressed-tensors)."""
    if scheme == "w8a8":
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                   "dynamic": False}  # fmt: skip
        activations: dict[str, Any] | None = {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
            "dynamic": True,
        }  # fmt: skip
        fmt = "int-quantized"
    else:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": group_size, "dynamic": False}  # fmt: skip
        activations, fmt = None, "pack-quantized"
    group: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    if activations is not None:
        group["input_activations"] = activations
    return {"quant_method": "compressed-tensors", "format": fmt,
            "quantization_status": "compressed", "config_groups": {"group_0": group},
            "ignore": ["lm_head"]}  # fmt: skip


def _quantized(name: str) -> bool:
    parts = name.split(".")
    return name.endswith(".weight") and len(parts) >= 2 and parts[-2] in PROJECTIONS


def quantize_tensor(name: str, w: Any, scheme: Scheme, group_size: int) -> dict[str, Any]:
    """The tensors that replace the weight ``name`` (module comment)."""
    import torch
    from compressed_tensors.compressors import pack_to_int32

    base = name.removesuffix("weight")
    wf = w.float()
    if scheme == "w8a8":
        scale = wf.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(wf / scale).clamp(-127, 127).to(torch.int8)
        return {name: q, base + "weight_scale": scale.to(w.dtype)}
    rows, cols = wf.shape
    if cols % group_size:
        raise ValueError(f"{name}: {cols} columns are not a multiple of group {group_size}")
    grouped = wf.reshape(rows, cols // group_size, group_size)
    scale = grouped.abs().amax(dim=2, keepdim=True).clamp(min=1e-8) / 7.0
    q = torch.round(grouped / scale).clamp(-8, 7).to(torch.int8).reshape(rows, cols)
    return {
        base + "weight_packed": pack_to_int32(q, 4),
        base + "weight_scale": scale.reshape(rows, cols // group_size).to(w.dtype),
        base + "weight_shape": torch.tensor([rows, cols], dtype=torch.int32),
    }


def _quantized_model(path: Path) -> bool:
    """``path`` holds an earlier output of ``quantize`` (which may be replaced)."""
    try:
        return "quantization_config" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def quantize(
    source: Path, dest: Path, scheme: Scheme, group_size: int = GROUP_SIZE
) -> Path:
    """Write ``source``'s ``scheme`` copy to ``dest`` (a new directory, or an earlier
    quantized copy, which is replaced); returns it."""
    from safetensors.torch import load_file, save_file

    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    shards = sorted(source.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{source}: no safetensors weights")
    config = json.loads((source / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{source}: already quantized")
    if dest.exists() and not _quantized_model(dest):
        raise ValueError(f"{dest} exists and is not a quantized model: remove it or pick another")
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for f in source.iterdir():
        copied = f.suffix != ".safetensors" and f.name not in ("config.json", MANIFEST_NAME)
        if f.is_file() and copied:
            shutil.copy(f, staging / f.name)
    try:
        for shard in shards:
            out: dict[str, Any] = {}
            for name, w in load_file(str(shard)).items():
                out.update(quantize_tensor(name, w, scheme, group_size) if _quantized(name)
                           else {name: w})  # fmt: skip
            save_file(out, str(staging / shard.name), metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    config["quantization_config"] = quantization_config(scheme, group_size)
    (staging / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest
