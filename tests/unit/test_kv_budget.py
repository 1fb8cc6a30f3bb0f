"""KV-cache sizes (app.models.kv_budget) and ``switchyard models kv-budget``, checked
against values computed by hand: bytes/token = 2 x layers x kv_heads x head_dim x
dtype bytes; blocks = floor(memory / (block_size x bytes/token)); max batch =
floor(blocks / ceil(seq_len / block_size))."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli.kv import parse_size
from app.cli.main import app
from app.models.kv_budget import KvShape, kv_shape, kv_shape_of_dir
from app.models.prepare import find_prepared
from app.settings import Settings, load_settings

GiB = 1024**3
MiB = 1024**2

# SmolLM2-135M-Instruct as its config.json has it (no head_dim: 576 // 9 = 64).
SMOLLM2: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "hidden_size": 576, "torch_dtype": "bfloat16",
}  # fmt: skip
# Meta-Llama-3-8B: 4096 // 32 = 128.
LLAMA3_8B: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip
# GPT-2-small-like MHA: no num_key_value_heads, 768 // 12 = 64, no dtype (float32).
MHA: dict[str, Any] = {
    "model_type": "gpt2-like", "num_hidden_layers": 12, "num_attention_heads": 12,
    "hidden_size": 768,
}  # fmt: skip
# Gemma-7B-like: head_dim 256 although 3072 // 16 = 192.
GEMMA_7B: dict[str, Any] = {
    "model_type": "gemma", "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 16, "hidden_size": 3072, "head_dim": 256, "dtype": "bfloat16",
}  # fmt: skip
# MQA: one KV head; 2048 // 16 = 128.
MQA: dict[str, Any] = {
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 1,
    "hidden_size": 2048, "torch_dtype": "bfloat16",
}  # fmt: skip
# A multimodal config keeps the LM under text_config; the dtype is at the top.
LLAVA: dict[str, Any] = {
    "model_type": "llava", "torch_dtype": "float16",
    "text_config": {k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"},  # no dtype
}  # fmt: skip

SHAPES = [
    # config, dtype, (layers, heads, kv_heads, head_dim, dtype, bytes), kind, bytes/token
    # 2 x 30 x 3 x 64 x 2 = 23,040
    (SMOLLM2, "auto", (30, 9, 3, 64, "bfloat16", 2), "GQA", 23_040),
    # 2 x 32 x 8 x 128 x 2 = 131,072
    (LLAMA3_8B, "auto", (32, 32, 8, 128, "bfloat16", 2), "GQA", 131_072),
    # fp8 KV cache: 2 x 32 x 8 x 128 x 1 = 65,536
    (LLAMA3_8B, "fp8", (32, 32, 8, 128, "fp8", 1), "GQA", 65_536),
    (LLAMA3_8B, "fp8_e5m2", (32, 32, 8, 128, "fp8_e5m2", 1), "GQA", 65_536),
    # float32 asked for: 2 x 32 x 8 x 128 x 4 = 262,144
    (LLAMA3_8B, "float", (32, 32, 8, 128, "float32", 4), "GQA", 262_144),
    # 2 x 12 x 12 x 64 x 2 = 36,864
    (MHA, "float16", (12, 12, 12, 64, "float16", 2), "MHA", 36_864),
    (MHA, "half", (12, 12, 12, 64, "float16", 2), "MHA", 36_864),
    # no dtype in the config: float32, 2 x 12 x 12 x 64 x 4 = 73,728
    (MHA, "auto", (12, 12, 12, 64, "float32", 4), "MHA", 73_728),
    # explicit head_dim: 2 x 28 x 16 x 256 x 2 = 458,752 (not 2 x 28 x 16 x 192 x 2)
    (GEMMA_7B, "auto", (28, 16, 16, 256, "bfloat16", 2), "MHA", 458_752),
    # 2 x 24 x 1 x 128 x 2 = 12,288
    (MQA, "auto", (24, 16, 1, 128, "bfloat16", 2), "MQA", 12_288),
    # text_config nesting, top-level float16: 2 x 32 x 8 x 128 x 2 = 131,072
    (LLAVA, "auto", (32, 32, 8, 128, "float16", 2), "GQA", 131_072),
]


@pytest.mark.parametrize(("config", "dtype", "fields", "kind", "per_token"), SHAPES)
def test_shape_and_bytes_per_token(
    config: dict[str, Any], dtype: str, fields: tuple[Any, ...], kind: str, per_token: int
) -> None:
    shape = kv_shape(config, dtype)
    assert shape == KvShape(*fields)
    assert shape.attention == kind
    assert shape.bytes_per_token() == per_token


def test_bytes_for_sequences() -> None:
    shape = kv_shape(SMOLLM2)
    assert shape.bytes_for(2048) == 47_185_920  # 23,040 x 2048
    assert shape.bytes_for(2048, 4) == 188_743_680  # 23,040 x 2048 x 4
    assert shape.bytes_for(1) == 23_040


BUDGETS = [
    # config, memory, block_size, seq_len, blocks, max batch
    # 1 GiB / (16 x 23,040 = 368,640) = 2,912.7 -> 2,912; 2048 / 16 = 128; 2,912 / 128 = 22.75
    (SMOLLM2, GiB, 16, 2048, 2_912, 22),
    # 512 MiB / 368,640 = 1,456.4 -> 1,456; ceil(1000 / 16) = 63; 1,456 / 63 = 23.1 -> 23
    (SMOLLM2, 512 * MiB, 16, 1000, 1_456, 23),
    # 1 GiB / (32 x 23,040 = 737,280) = 1,456.4 -> 1,456; 2048 / 32 = 64; 1,456 / 64 = 22.75
    (SMOLLM2, GiB, 32, 2048, 1_456, 22),
    # 16 GiB / (16 x 131,072 = 2 MiB) = 8,192; 8192 / 16 = 512; 8,192 / 512 = 16
    (LLAMA3_8B, 16 * GiB, 16, 8192, 8_192, 16),
    # 2048 tokens need 128 blocks; 100 blocks (100 x 2 MiB) hold none of them
    (LLAMA3_8B, 100 * 2 * MiB, 16, 2048, 100, 0),
    # less than one block (368,640 B): nothing
    (SMOLLM2, 368_639, 16, 16, 0, 0),
]


@pytest.mark.parametrize(("config", "memory", "block", "seq_len", "blocks", "batch"), BUDGETS)
def test_blocks_and_max_batch(
    config: dict[str, Any], memory: int, block: int, seq_len: int, blocks: int, batch: int
) -> None:
    shape = kv_shape(config)
    assert shape.blocks(memory, block) == blocks
    assert shape.max_batch(memory, seq_len, block) == batch


def test_default_block_size_is_16() -> None:
    shape = kv_shape(SMOLLM2)
    assert shape.blocks(GiB) == 2_912
    assert shape.max_batch(GiB, 2048) == 22


def test_the_prepared_smollm2_config_when_present() -> None:
    found = find_prepared("smollm2", load_settings().models_dir)
    if found is None:
        pytest.skip("smollm2 is not prepared here (switchyard models prepare smollm2)")
    shape = kv_shape_of_dir(found.path)
    assert shape == KvShape(30, 9, 3, 64, "bfloat16", 2)
    assert shape.bytes_per_token() == 23_040


def _without(config: dict[str, Any], field: str) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key != field}


REFUSALS = [
    # DeepSeek-V2-Lite-like MLA
    ({**LLAMA3_8B, "kv_lora_rank": 512}, "auto", "kv_lora_rank"),
    ({**MHA, "model_type": "bert"}, "auto", "model_type 'bert'"),
    (_without(SMOLLM2, "num_hidden_layers"), "auto", "num_hidden_layers"),
    (_without(SMOLLM2, "num_attention_heads"), "auto", "num_attention_heads"),
    (_without(SMOLLM2, "hidden_size"), "auto", "hidden_size"),
    ({**SMOLLM2, "num_hidden_layers": "30"}, "auto", "num_hidden_layers"),
    ({**SMOLLM2, "num_key_value_heads": 2}, "auto", "num_key_value_heads"),
    ({**SMOLLM2, "torch_dtype": "float8_e4m3fn"}, "auto", "torch_dtype"),
    (SMOLLM2, "int3", "--dtype"),
]


@pytest.mark.parametrize(("config", "dtype", "named"), REFUSALS)
def test_configs_it_cannot_compute_name_the_field(
    config: dict[str, Any], dtype: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        kv_shape(config, dtype)


def test_bad_arguments_are_refused() -> None:
    shape = kv_shape(SMOLLM2)
    with pytest.raises(ValueError, match="seq_len"):
        shape.bytes_for(0)
    with pytest.raises(ValueError, match="block_size"):
        shape.max_batch(GiB, 2048, block_size=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        shape.blocks(-1)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1073741824", GiB), ("1GiB", GiB), ("512MiB", 512 * MiB), ("1.5Gi", 1536 * MiB),
     ("64KiB", 65_536), ("1GB", 10**9), ("2k", 2_000), ("100B", 100), (" 2 TiB ", 2 * 1024**4)],
)  # fmt: skip
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "1xx", "-1", "1 GiBs"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def _model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_cli_prints_the_budget(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, SMOLLM2)
    result = CliRunner().invoke(
        app, ["models", "kv-budget", str(model), "--memory", "1GiB", "--batch", "4"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"model: {model}"
    assert "KV heads: 3 (GQA)" in lines
    assert "dtype: bfloat16 (2 bytes)" in lines
    assert "bytes/token: 23,040 B (22.5 KiB)" in lines
    assert "bytes for 2048 tokens x 4: 188,743,680 B (180.0 MiB)" in lines
    assert "blocks: 2,912 of 16 tokens" in lines
    assert "max batch at 2048 tokens: 22 (128 blocks per sequence)" in lines


def test_cli_options(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, LLAMA3_8B)
    args = ["--dtype", "fp8", "--seq-len", "8192", "--memory", "17179869184", "--block-size", "32"]
    result = CliRunner().invoke(app, ["models", "kv-budget", str(model), *args])
    assert result.exit_code == 0, result.output
    # 65,536 B/token; 16 GiB / (32 x 65,536 = 2 MiB) = 8,192 blocks; 8192 / 32 = 256; 32
    assert "bytes/token: 65,536 B (64.0 KiB)" in result.stdout
    assert "blocks: 8,192 of 32 tokens" in result.stdout
    assert "max batch at 8192 tokens: 32 (256 blocks per sequence)" in result.stdout
    assert "memory:" not in CliRunner().invoke(app, ["models", "kv-budget", str(model)]).stdout


@pytest.mark.parametrize(
    ("config", "message"),
    [(None, "unknown model"), ({"model_type": "bert"}, "encoder-only"),
     ({**LLAMA3_8B, "kv_lora_rank": 512}, "kv_lora_rank")],
)  # fmt: skip
def test_cli_exits_2_with_one_line(
    tmp_path: Path, config: dict[str, Any] | None, message: str
) -> None:
    model = tmp_path if config is None else _model_dir(tmp_path, config)
    result = CliRunner().invoke(app, ["models", "kv-budget", str(model)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_cli_an_embedded_model_must_be_prepared(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    result = CliRunner().invoke(app, ["models", "kv-budget", "smollm2"], obj=settings)
    assert result.exit_code == 2
    assert "not prepared; run: switchyard models prepare smollm2" in result.stderr


def test_cli_refuses_a_bad_memory_size(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, SMOLLM2)
    result = CliRunner().invoke(app, ["models", "kv-budget", str(model), "--memory", "lots"])
    assert result.exit_code == 2
    assert "--memory" in result.output
