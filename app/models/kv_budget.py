"""How much KV cache a model needs, from its Hugging Face ``config.json``.

The rule (full attention in every layer, as vLLM caches it):

* KV bytes per token = 2 (K and V) × ``num_layers`` × ``num_kv_heads`` × ``head_dim`` ×
  ``dtype_bytes``; one sequence of ``seq_len`` tokens holds that × ``seq_len``.
* vLLM allocates the cache in blocks of ``block_size`` tokens (16 by default), so a
  budget of ``memory`` bytes holds ``floor(memory / (block_size × bytes_per_token))``
  blocks, and a sequence of ``seq_len`` tokens takes ``ceil(seq_len / block_size)``
  of them: the largest batch at that length is ``floor(blocks / blocks_per_sequence)``.

The parameters come from the config (from its ``text_config`` when a multimodal config
nests the language model there): ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads`` (absent: one per attention head, MHA; fewer is GQA, one is
MQA) and ``head_dim`` (absent: ``hidden_size // num_attention_heads``). The dtype is
``dtype`` (``auto``: the config's ``torch_dtype``/``dtype``, float32 when it names
none; vLLM's own ``auto`` may serve a float32 checkpoint in 16 bits, so pass the dtype
it serves with). float32 takes 4 bytes, bfloat16/float16 2, and vLLM's
``kv_cache_dtype`` values fp8/fp8_e4m3/fp8_e5m2 1.

Configs the rule does not describe raise :class:`ValueError` naming the field: MLA
(``kv_lora_rank``: a compressed latent is cached, not per-head K and V), encoder-only
models that keep no KV cache (``model_type`` bert and its kin), and missing fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["DEFAULT_BLOCK_SIZE", "DTYPE_BYTES", "KvShape", "kv_shape", "kv_shape_of_dir"]

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size, in tokens."""

DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
"""Bytes per element for each dtype (the model dtypes and vLLM's ``kv_cache_dtype``)."""

_CANONICAL = {"float": "float32", "half": "float16"}
_ENCODER_ONLY = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "mpnet",
     "deberta", "deberta-v2", "camembert", "modernbert"}
)  # fmt: skip

AttentionKind = Literal["MHA", "GQA", "MQA"]


@dataclass(frozen=True)
class KvShape:
    """The KV-cache shape of a model: what one cached token costs, and what fits."""

    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int

    @property
    def attention(self) -> AttentionKind:
        """``MHA`` (a KV head per query head), ``MQA`` (one KV head) or ``GQA``."""
        if self.kv_heads == self.attention_heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    def bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head_dim × dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def bytes_for(self, seq_len: int, batch: int = 1) -> int:
        """Bytes for ``batch`` sequences of ``seq_len`` tokens (not rounded to blocks)."""
        _positive(seq_len=seq_len, batch=batch)
        return self.bytes_per_token() * seq_len * batch

    def blocks(self, memory_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        """Whole blocks of ``block_size`` tokens that ``memory_bytes`` holds."""
        _positive(block_size=block_size)
        if memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
        return memory_bytes // (block_size * self.bytes_per_token())

    def max_batch(
        self, memory_bytes: int, seq_len: int, block_size: int = DEFAULT_BLOCK_SIZE
    ) -> int:
        """Most sequences of ``seq_len`` tokens that ``memory_bytes`` holds at once."""
        blocks = self.blocks(memory_bytes, block_size)  # checks block_size
        _positive(seq_len=seq_len)
        return blocks // -(-seq_len // block_size)  # ceil(seq_len / block_size) each


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _int_field(config: Mapping[str, Any], field: str, why: str) -> int:
    value = config.get(field)
    if value is None:
        raise ValueError(f"config has no {field}: {why}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config field {field} must be a positive integer, got {value!r}")
    return value


def _config_dtype(config: Mapping[str, Any], top: Mapping[str, Any]) -> tuple[str, str] | None:
    """The field naming the dtype and its value (``text_config`` first), or None."""
    for source in (config, top):
        for key in ("torch_dtype", "dtype"):
            if isinstance(source.get(key), str):
                return key, source[key].lower().removeprefix("torch.")
    return None


def _dtype(config: Mapping[str, Any], top: Mapping[str, Any], dtype: str) -> str:
    field, name = "--dtype", dtype.lower()
    if name == "auto":
        found = _config_dtype(config, top)
        if found is None:
            return "float32"
        field, name = found
    if name not in DTYPE_BYTES:
        known = ", ".join(["auto", *DTYPE_BYTES])
        raise ValueError(f"{field} {name!r} is not a known dtype; known: {known}")
    return _CANONICAL.get(name, name)


def kv_shape(config: Mapping[str, Any], dtype: str = "auto") -> KvShape:
    """The KV shape of the model an HF ``config.json`` (as a dict) describes.

    ``dtype`` is a model dtype or a vLLM ``kv_cache_dtype`` (see :data:`DTYPE_BYTES`);
    ``auto`` reads the config's. Raises :class:`ValueError` naming the field when the
    rule cannot be applied (MLA, an encoder-only model, a missing field).
    """
    text = config.get("text_config")
    lm: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    if lm.get("kv_lora_rank") is not None:
        raise ValueError(
            "config has kv_lora_rank: multi-head latent attention (MLA) caches a "
            "compressed latent, not per-head K and V; this rule does not apply"
        )
    model_type = lm.get("model_type", config.get("model_type"))
    if model_type in _ENCODER_ONLY:
        raise ValueError(
            f"config model_type {model_type!r} is an encoder-only model: it keeps no KV cache"
        )
    layers = _int_field(lm, "num_hidden_layers", "the number of layers is needed")
    heads = _int_field(lm, "num_attention_heads", "the number of attention heads is needed")
    kv_heads = heads
    if lm.get("num_key_value_heads") is not None:
        kv_heads = _int_field(lm, "num_key_value_heads", "")
        if heads % kv_heads:
            raise ValueError(
                f"config field num_key_value_heads {kv_heads} does not divide "
                f"num_attention_heads {heads}"
            )
    if lm.get("head_dim") is not None:
        head_dim = _int_field(lm, "head_dim", "")
    else:
        hidden = _int_field(lm, "hidden_size", "head_dim is absent, so hidden_size is needed")
        if hidden % heads:
            raise ValueError(
                f"config has no head_dim and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
    name = _dtype(lm, config, dtype)
    return KvShape(layers, heads, kv_heads, head_dim, name, DTYPE_BYTES[name])


def kv_shape_of_dir(path: str | Path, dtype: str = "auto") -> KvShape:
    """:func:`kv_shape` of ``path/config.json`` (``FileNotFoundError`` if absent)."""
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}/config.json is not a JSON object")
    return kv_shape(config, dtype)
