"""Weight quantization into compressed-tensors (app.models.quantize): which tensors are
quantized, how close they dequantize, the config vLLM reads, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import unpack_from_int32
from safetensors.torch import load_file

from app.models.quantize import quantization_config, quantize
from app.models.store import MANIFEST_NAME

PROJ = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def source(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.mark.parametrize(
    ("scheme", "fmt", "bits", "activations"),
    [("w8a8", "int-quantized", 8, True), ("w4a16", "pack-quantized", 4, False)],
)
def test_the_config_names_the_scheme(scheme: str, fmt: str, bits: int, activations: bool) -> None:
    c = quantization_config(scheme)  # type: ignore[arg-type]
    group = c["config_groups"]["group_0"]
    assert (c["quant_method"], c["format"], c["ignore"]) == ("compressed-tensors", fmt, ["lm_head"])
    assert group["weights"]["num_bits"] == bits
    assert ("input_activations" in group) == activations


def test_w8a8_keeps_every_row_within_half_a_step(source: Path, tmp_path: Path) -> None:
    out = quantize(source, tmp_path / "w8a8", "w8a8")
    before, after = load_file(str(source / "model.safetensors")), load_file(
        str(out / "model.safetensors")
    )
    q, scale = after[f"{PROJ}.weight"], after[f"{PROJ}.weight_scale"]
    assert q.dtype == torch.int8 and scale.shape == (q.shape[0], 1)
    w = before[f"{PROJ}.weight"].float()
    error = (q.float() * scale.float() - w).abs()
    assert bool((error <= scale.float() / 2 + 1e-3).all())
    # embeddings and norms are left as they were
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        assert torch.equal(after[name], before[name])
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    assert (out / "tokenizer.json").is_file() and not (out / MANIFEST_NAME).exists()


def test_w4a16_packs_groups_that_dequantize_within_half_a_step(
    source: Path, tmp_path: Path
) -> None:
    out = quantize(source, tmp_path / "w4a16", "w4a16", group_size=32)
    after = load_file(str(out / "model.safetensors"))
    w = load_file(str(source / "model.safetensors"))[f"{PROJ}.weight"].float()
    rows, cols = w.shape
    assert after[f"{PROJ}.weight_shape"].tolist() == [rows, cols]
    q = unpack_from_int32(after[f"{PROJ}.weight_packed"], 4, torch.Size([rows, cols]))
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    scale = after[f"{PROJ}.weight_scale"].float().repeat_interleave(32, dim=1)
    error = (q.float() * scale - w).abs()
    assert bool((error <= scale / 2 + 1e-3).all())
    assert f"{PROJ}.weight" not in after


def test_refusals(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scheme"):
        quantize(source, tmp_path / "x", "int3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a multiple of group"):
        quantize(source, tmp_path / "g", "w4a16", group_size=48)
    assert not (tmp_path / "g").exists() and not (tmp_path / "g.partial").exists()
    done = quantize(source, tmp_path / "w8a8", "w8a8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(done, tmp_path / "again", "w8a8")
    with pytest.raises(FileNotFoundError):
        quantize(tmp_path, tmp_path / "none", "w8a8")
    # a directory that is not an earlier quantized copy is never replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="is not a quantized model"):
        quantize(source, tmp_path / "mine", "w8a8")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    # an earlier copy is
    assert quantize(source, done, "w4a16", group_size=32) == done
    assert '"pack-quantized"' in (done / "config.json").read_text()
