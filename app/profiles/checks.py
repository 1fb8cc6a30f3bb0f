"""Contradictions in one pool's resolved knobs, each refused with the knob and why.

Rules (``refusals``), in order; the first three hold for any pool, the rest for the
profile named:
1. chunked prefill off: ``max_num_batched_tokens`` ≥ ``max_model_len`` (a full-length
   prompt must fit one step), and no ``long_prefill_token_threshold`` (it needs chunks);
   always ``max_num_batched_tokens`` ≥ ``max_num_seqs`` and ``long_prefill_token_threshold``
   ≤ ``max_model_len`` (vLLM's own rules, refused here before any engine starts).
2. ``max_queued_requests`` -1 (unbounded) with ``backpressure``: nothing is ever refused.
3. with the model's config at hand (``KvShape``): ``max_model_len`` within the model's
   ``max_position_embeddings``, and the KV budget (``kv_cache_memory_bytes`` over
   block_size × KV bytes per token) holds one ``max_model_len`` sequence.
4. interactive: chunked prefill on (else one long prompt stalls every stream's next
   token); ``max_ongoing_requests`` ≤ ``max_num_seqs`` (the excess would wait inside the
   engine, where backpressure cannot refuse it); the KV budget holds ``max_num_seqs``
   × ``max_model_len`` (no preemption, whose recompute breaks TTFT); with a measured
   prefill rate, one full prefill step (``max_num_batched_tokens`` / rate) within the
   TTFT SLO.
5. long_context: prefix caching on (its traffic re-reads long shared prefixes).
6. throughput: ``max_ongoing_requests`` ≥ ``max_num_seqs`` (else the batch never fills).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from app.models.kv_budget import KvShape, kv_shape_of_dir
from app.profiles.catalog import Bundle
from app.profiles.resolve import ProfileRef

DEFAULT_BLOCK = 16  # vLLM's block size where the model does not set one


class _Backpressure(Protocol):
    @property
    def status_code(self) -> int: ...


class Knobs(Protocol):
    """What the checks read of a model (``app.config.ModelSpec`` has all of it)."""

    @property
    def profile(self) -> ProfileRef | None: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int | None: ...
    @property
    def enable_chunked_prefill(self) -> bool | None: ...
    @property
    def long_prefill_token_threshold(self) -> int | None: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_ongoing_requests(self) -> int: ...
    @property
    def max_queued_requests(self) -> int: ...
    @property
    def backpressure(self) -> _Backpressure | None: ...
    @property
    def kv_cache_bytes(self) -> int | None: ...
    @property
    def block_size(self) -> int | None: ...


def kv_tokens(k: Knobs, shape: KvShape) -> int | None:
    """Tokens the KV budget holds (whole blocks); None where vLLM sizes it (a GPU)."""
    if k.kv_cache_bytes is None:
        return None
    block = k.block_size or DEFAULT_BLOCK
    return shape.blocks(k.kv_cache_bytes, block) * block


def refusals(k: Knobs) -> list[str]:
    """Every contradiction in the knobs alone, as ``knob: reason`` (module docstring:
    all but the KV rules); empty: consistent."""
    out: list[str] = []
    chunked = k.enable_chunked_prefill is not False
    if not chunked:
        if k.max_num_batched_tokens is not None and k.max_num_batched_tokens < k.max_model_len:
            out.append(
                f"max_num_batched_tokens: {k.max_num_batched_tokens} is below max_model_len "
                f"{k.max_model_len} with chunked prefill off, so a full-length prompt could "
                "never be scheduled"
            )
        if k.long_prefill_token_threshold:
            out.append(
                "long_prefill_token_threshold: it splits long prompts into chunks, and "
                "enable_chunked_prefill is false"
            )
    step = k.max_num_batched_tokens
    if step is not None and step < k.max_num_seqs:
        out.append(
            f"max_num_batched_tokens: {step} is below max_num_seqs {k.max_num_seqs} "
            "(every running sequence needs a token of each step; vLLM refuses it)"
        )
    threshold = k.long_prefill_token_threshold
    if threshold and threshold > k.max_model_len:
        out.append(
            f"long_prefill_token_threshold: {threshold} is above max_model_len "
            f"{k.max_model_len} (vLLM refuses it)"
        )
    if k.max_queued_requests == -1 and k.backpressure is not None:
        out.append("max_queued_requests: -1 (unbounded) never refuses, so backpressure is moot")
    if k.profile is None:
        return out
    bundle = k.profile.bundle()
    if bundle.profile == "interactive":
        out += _interactive(k, bundle, chunked)
    elif bundle.profile == "long_context" and not k.enable_prefix_caching:
        out.append(
            "enable_prefix_caching: a long_context pool needs it (its traffic re-reads "
            "long shared prefixes; without it every turn prefills the whole context again)"
        )
    elif bundle.profile == "throughput" and k.max_ongoing_requests < k.max_num_seqs:
        out.append(
            f"max_ongoing_requests: {k.max_ongoing_requests} is below max_num_seqs "
            f"{k.max_num_seqs}, so a throughput pool's batch never fills"
        )
    return out


def kv_refusals(k: Knobs, shape: KvShape, max_positions: int | None = None) -> list[str]:
    """The KV rules (3 and interactive's no-preemption), from the model's own config."""
    out: list[str] = []
    if max_positions is not None and k.max_model_len > max_positions:
        out.append(
            f"max_model_len: {k.max_model_len} is beyond the model's "
            f"max_position_embeddings {max_positions}"
        )
    tokens = kv_tokens(k, shape)
    if tokens is None:
        return out
    if tokens < k.max_model_len:
        out.append(
            f"kv_cache_memory_bytes: {k.kv_cache_bytes} bytes hold {tokens} tokens at "
            f"{shape.bytes_per_token()} bytes each, fewer than one max_model_len "
            f"{k.max_model_len} sequence"
        )
    need = k.max_num_seqs * k.max_model_len
    if k.profile is not None and k.profile.name == "interactive" and tokens < need:
        out.append(
            f"max_num_seqs: {k.max_num_seqs} sequences of max_model_len {k.max_model_len} "
            f"need {need} KV tokens and kv_cache_memory_bytes holds {tokens}: an "
            "interactive pool would preempt (recompute), which breaks its TTFT SLO; lower "
            "max_num_seqs or max_model_len, or raise kv_cache_memory_bytes"
        )
    return out


def _interactive(k: Knobs, bundle: Bundle, chunked: bool) -> list[str]:
    out: list[str] = []
    if not chunked:
        out.append(
            "enable_chunked_prefill: an interactive pool needs it (without chunks one long "
            "prompt's prefill stalls every stream's next token past the ITL SLO)"
        )
    if k.max_ongoing_requests > k.max_num_seqs:
        out.append(
            f"max_ongoing_requests: {k.max_ongoing_requests} is above max_num_seqs "
            f"{k.max_num_seqs}: the excess would wait inside the engine, where backpressure "
            "cannot refuse it before the TTFT SLO passes"
        )
    rate, slo = bundle.measured.prefill_tokens_per_s, bundle.slo.ttft_p95_ms
    step = k.max_num_batched_tokens
    if rate is not None and slo is not None and step is not None:
        step_ms = step / rate * 1000
        if step_ms > slo:
            out.append(
                f"max_num_batched_tokens: one full step of {step} tokens takes {step_ms:.0f} "
                f"ms at the measured {rate:g} prefill tokens/s, above the ttft_p95_ms SLO "
                f"{slo:g}"
            )
    return out


def model_dir_refusals(k: Knobs, model_dir: Path, dtype: str) -> list[str]:
    """``kv_refusals`` from the model's ``config.json`` in ``model_dir`` with the KV
    cache in ``dtype``; nothing where the directory is not here (a replica-side source)
    or its shape is not the formula's (MLA …): vLLM checks those where it runs."""
    config = model_dir / "config.json"
    if not config.is_file():
        return []
    positions = json.loads(config.read_text()).get("max_position_embeddings")
    try:
        shape = kv_shape_of_dir(model_dir, dtype)
    except ValueError:  # a shape the formula does not cover (MLA …): vLLM sizes it
        return []
    return kv_refusals(k, shape, positions if isinstance(positions, int) else None)
