"""``app.engine.vllm_engine`` without starting vLLM: a model directory missing on the
replica's node is a clear not-ready error before vLLM is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.protocol import EngineNotReady, SamplingOptions, StructuredOutput, TokenLogprob
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.engine.vllm_params import sampling_params, token_logprobs


async def test_a_volume_not_mounted_on_this_node_is_a_clear_error(tmp_path: Path) -> None:
    engine = VLLMEngine(VLLMEngineConfig(model_path=tmp_path / "absent", served_name="q"))
    with pytest.raises(EngineNotReady, match="is the volume mounted here"):
        await engine.start()


async def test_an_unreachable_s3_source_is_a_clear_error(tmp_path: Path) -> None:
    """The replica fetches an s3:// source before vLLM is touched; a server that does
    not answer is a not-ready error naming the URL (Ray then retries the replica)."""
    from app.engine.vllm_engine import S3Source
    from benchmarks.local_redis import free_port

    source = S3Source(url="s3://models/tiny", endpoint_url=f"http://127.0.0.1:{free_port()}")
    config = VLLMEngineConfig(model_path=tmp_path / "cache", served_name="q", s3=source)
    with pytest.raises(EngineNotReady, match="s3://models/tiny: cannot list"):
        await VLLMEngine(config).start()
    assert not (tmp_path / "cache").exists()


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
