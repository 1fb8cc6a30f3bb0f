"""``switchyard models kv-budget``: the KV cache a model needs (see
:mod:`app.models.kv_budget` for the rule), printed as ``name: value`` lines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from app.models.kv_budget import DEFAULT_BLOCK_SIZE, KvShape, kv_shape_of_dir
from app.models.prepare import MODELS, find_prepared
from app.settings import Settings, load_settings

__all__ = ["kv_budget_command", "parse_size"]

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?)b?|b?)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``: a count (``1073741824``) or a size; KiB/MiB/GiB/TiB (or Ki,
    Mi...) are powers of 1024, KB/MB/GB/TB (or K, M...) powers of 1000, as in Kubernetes."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size (examples: 1073741824, 512MiB, 1GiB)")
    number, unit, binary = match.groups()
    power = 0 if unit is None else "kmgt".index(unit.lower()) + 1
    return int(float(number) * (1024 if binary else 1000) ** power)


def _human(count: int) -> str:
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{count:,} B" if unit == "B" else f"{count:,} B ({value:.1f} {unit})"


def report_lines(
    shape: KvShape, seq_len: int, batch: int, memory: int | None, block_size: int
) -> list[str]:
    """The command's output for ``shape``, one ``name: value`` per line."""
    lines = [
        f"layers: {shape.layers}",
        f"attention heads: {shape.attention_heads}",
        f"KV heads: {shape.kv_heads} ({shape.attention})",
        f"head_dim: {shape.head_dim}",
        f"dtype: {shape.dtype} ({shape.dtype_bytes} bytes)",
        f"bytes/token: {_human(shape.bytes_per_token())}",
        f"bytes for {seq_len} tokens x {batch}: {_human(shape.bytes_for(seq_len, batch))}",
    ]
    if memory is not None:
        per_sequence = -(-seq_len // block_size)
        lines += [
            f"memory: {_human(memory)}",
            f"blocks: {shape.blocks(memory, block_size):,} of {block_size} tokens",
            f"max batch at {seq_len} tokens: {shape.max_batch(memory, seq_len, block_size):,}"
            f" ({per_sequence} blocks per sequence)",
        ]
    return lines


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _model_dir(model: str, settings: Settings) -> Path:
    name = model.removeprefix("embedded:")
    if name in MODELS:
        found = find_prepared(name, settings.models_dir)
        if found is None:
            raise _fail(f"model {name!r} is not prepared; run: switchyard models prepare {name}")
        return found.path
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        known = ", ".join(MODELS)
        raise _fail(f"unknown model {model!r}: not one of {known} nor a directory with a "
                    "config.json")  # fmt: skip
    return path


def kv_budget_command(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Argument(help=f"{', '.join(MODELS)}, or a directory with a config.json.")
    ],
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per sequence.")] = 2048,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Sequences.")] = 1,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (the config's), float32, bfloat16, float16, fp8…")
    ] = "auto",
    memory: Annotated[
        str | None,
        typer.Option("--memory", help="KV cache budget: bytes or a size (512MiB, 1GiB)."),
    ] = None,
    block_size: Annotated[
        int, typer.Option("--block-size", min=1, help="vLLM block size in tokens.")
    ] = DEFAULT_BLOCK_SIZE,
) -> None:
    """KV-cache bytes per token and for SEQ_LEN x BATCH; with --memory, the blocks it holds
    and the largest batch at SEQ_LEN. Exit 2 for a model it cannot find or compute."""
    try:
        budget = None if memory is None else parse_size(memory)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--memory") from None
    settings = ctx.find_object(Settings) or load_settings()
    path = _model_dir(model, settings)
    try:
        shape = kv_shape_of_dir(path, dtype)
    except (OSError, ValueError) as exc:
        raise _fail(f"{path}: {exc}") from None
    typer.echo(f"model: {path}")
    for line in report_lines(shape, seq_len, batch, budget, block_size):
        typer.echo(line)
