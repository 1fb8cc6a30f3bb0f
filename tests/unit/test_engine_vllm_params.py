"""``app.engine.vllm_params``: our request options in vLLM's ``SamplingParams``, a KV
connector's parameters in its ``extra_args``, and vLLM's logprobs back in our type."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.engine.protocol import RequestTimes, SamplingOptions, StructuredOutput, TokenLogprob
from app.engine.vllm_params import finish_reason, request_times, sampling_params, token_logprobs


def test_every_sampling_option_reaches_vllms_sampling_params() -> None:
    """Each option maps to vLLM's field of the same meaning (the engine gets them)."""
    options = SamplingOptions(
        temperature=0.5, top_p=0.9, seed=7, stop=("x",), ignore_eos=True,
        presence_penalty=1.5, frequency_penalty=-0.5, repetition_penalty=1.2, top_k=40,
        min_p=0.05, min_tokens=3, stop_token_ids=(2, 9), logit_bias=((5, 10.0),),
        logprobs=4, structured=StructuredOutput("json_schema", '{"type": "object"}'),
    )  # fmt: skip
    p = sampling_params(options, max_tokens=12)
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.stop, p.ignore_eos) == (
        12, 0.5, 0.9, 7, ["x"], True,
    )  # fmt: skip
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (1.5, -0.5, 1.2)
    assert (p.top_k, p.min_p, p.min_tokens, p.stop_token_ids) == (40, 0.05, 3, [2, 9])
    assert (p.logit_bias, p.logprobs) == ({5: 10.0}, 4)
    assert p.structured_outputs.json == '{"type": "object"}'
    neutral = sampling_params(SamplingOptions(), max_tokens=1)
    assert (neutral.logit_bias, neutral.logprobs, neutral.structured_outputs) == (None, None, None)
    assert sampling_params(
        SamplingOptions(structured=StructuredOutput("json_object")), 1
    ).structured_outputs.json_object


def test_token_logprobs_keep_the_sampled_token_and_the_top_sorted() -> None:
    from vllm.logprobs import Logprob

    steps = [
        # the sampled token (7) ranked 3rd: outside a top-2
        {7: Logprob(-2.0, 3, "c"), 1: Logprob(-0.1, 1, "a"), 2: Logprob(-1.0, 2, "b")},
        {4: Logprob(float("-inf"), 1, "d")},
    ]
    out = token_logprobs([7, 4], steps, top=2)
    assert out[0] == TokenLogprob("c", -2.0, (("a", -0.1), ("b", -1.0)))
    assert out[1] == TokenLogprob("d", -9999.0, (("d", -9999.0),))  # JSON has no -inf
    assert token_logprobs([7], steps[:1], top=None) == ()


def test_a_kv_connectors_parameters_travel_in_extra_args() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "prefill-1", "remote_block_ids": [3]}
    assert sampling_params(SamplingOptions(), 1, params).extra_args == {
        "kv_transfer_params": params
    }
    assert not sampling_params(SamplingOptions(), 1).extra_args


def test_finish_reasons_map_to_openais() -> None:
    assert [finish_reason(r) for r in (None, "stop", "length", "abort", "other")] == [
        None, "stop", "length", "abort", "stop",
    ]  # fmt: skip


def stats_of(queued: float, scheduled: float, first: float, last: float) -> SimpleNamespace:
    return SimpleNamespace(
        queued_ts=queued, scheduled_ts=scheduled, first_token_ts=first, last_token_ts=last
    )


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        (stats_of(10.0, 10.5, 11.0, 13.0), RequestTimes(0.5, 0.5, 2.0)),
        (stats_of(10.0, 0.0, 0.0, 0.0), None),  # vLLM kept none: no times, not zeros
        (None, None),
    ],
)
def test_a_finished_requests_engine_times_come_from_vllms_own_stats(
    stats: object, expected: RequestTimes | None
) -> None:
    assert request_times(stats) == expected
