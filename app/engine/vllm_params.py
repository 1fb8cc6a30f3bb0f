"""vLLM's per-request parameters from our types, and its outputs back into ours: every
sampling option to ``SamplingParams``, per-step logprob maps to ``TokenLogprob``s, and
finish reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.engine.protocol import FinishReason, RequestTimes, SamplingOptions, TokenLogprob


def sampling_params(
    s: SamplingOptions, max_tokens: int, kv_transfer: dict[str, Any] | None = None
) -> Any:
    """vLLM ``SamplingParams`` of one request: every option maps to vLLM's field of the
    same meaning; deltas come out one engine step at a time (``DELTA``). A KV
    connector's ``kv_transfer`` parameters travel in ``extra_args``."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    structured = None
    if s.structured is not None:
        structured = (
            StructuredOutputsParams(json_object=True)
            if s.structured.kind == "json_object"
            else StructuredOutputsParams(json=s.structured.schema)
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
        stop=list(s.stop) or None,
        ignore_eos=s.ignore_eos,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        top_k=s.top_k,
        min_p=s.min_p,
        min_tokens=s.min_tokens,
        stop_token_ids=list(s.stop_token_ids) or None,
        logit_bias=dict(s.logit_bias) or None,
        logprobs=s.logprobs,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": kv_transfer} if kv_transfer is not None else None,
    )


def token_logprobs(
    token_ids: Sequence[int], logprobs: Any, top: int | None
) -> tuple[TokenLogprob, ...]:
    """One ``TokenLogprob`` per new token from vLLM's per-step ``{token id: Logprob}``
    maps (which hold the sampled token and the ``top`` most likely ones)."""
    if top is None or not logprobs:
        return ()
    out = []
    for token_id, step in zip(token_ids, logprobs, strict=False):
        ranked = sorted(step.items(), key=lambda kv: kv[1].rank or 0)
        chosen = step.get(token_id)
        out.append(
            TokenLogprob(
                token=(chosen.decoded_token or "") if chosen else "",
                logprob=_finite(chosen.logprob) if chosen else -9999.0,
                top=tuple((lp.decoded_token or "", _finite(lp.logprob)) for _, lp in ranked[:top]),
            )
        )
    return tuple(out)


def _finite(logprob: float) -> float:
    """JSON has no -inf: OpenAI's floor for an impossible token."""
    return max(float(logprob), -9999.0)


def finish_reason(reason: str | None) -> FinishReason | None:
    if reason is None:
        return None
    if reason in ("stop", "length", "abort"):
        return reason  # type: ignore[return-value]
    return "stop"


def request_times(stats: Any) -> RequestTimes | None:
    """A finished request's time in the engine from vLLM's per-request stats
    (``RequestOutput.metrics``: engine-core timestamps, kept when stats are on), or None
    when vLLM kept none."""
    queued = getattr(stats, "queued_ts", 0.0) or 0.0
    scheduled = getattr(stats, "scheduled_ts", 0.0) or 0.0
    first = getattr(stats, "first_token_ts", 0.0) or 0.0
    last = getattr(stats, "last_token_ts", 0.0) or 0.0
    if not (queued and scheduled and first and last):
        return None
    return RequestTimes(
        max(0.0, scheduled - queued), max(0.0, first - scheduled), max(0.0, last - first)
    )
