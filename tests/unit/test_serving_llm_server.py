"""LLMServer over the simulated engine: prompt rendering, context checks, streaming."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from app.engine.factory import SimulatedEngineConfig
from app.engine.protocol import (
    ContextLengthExceeded,
    EngineDead,
    EngineNotReady,
    GenerationDelta,
    GenerationRequest,
    InvalidRequest,
    SamplingOptions,
    StructuredOutput,
)
from app.engine.simulated import SimulationProfile
from app.request import InferenceRequest, ToolChoice
from app.serving.llm_server import LLMServer, children, merge, output_limit
from tests.request_helpers import embedding, inference

FAST = SimulationProfile(
    max_model_len=128,
    prefill_s_per_token=0.0,
    prefill_base_s=0.0,
    decode_base_s=0.0,
    decode_s_per_seq=0.0,
    kv_capacity_tokens=1024,
)


@pytest.fixture
async def server() -> AsyncIterator[LLMServer]:
    srv = await LLMServer.create(SimulatedEngineConfig(served_name="sim", profile=FAST))
    yield srv
    await srv.shutdown()


async def _collect(srv: LLMServer, payload: InferenceRequest) -> tuple[str, int, str | None]:
    text, tokens, finish = "", 0, None
    async for d in srv.generate(payload):
        text += d.text
        tokens += d.num_new_tokens
        finish = d.finish_reason or finish
    return text, tokens, finish


@pytest.mark.parametrize(
    "prompt",
    [
        {"messages": ({"role": "user", "content": "hello there"},)},
        {"prompt_text": "hello there"},
        {"prompt_token_ids": (1, 2, 3)},
    ],
)
async def test_every_prompt_form_generates(server: LLMServer, prompt: dict[str, object]) -> None:
    payload = inference("r", max_tokens=4, ignore_eos=True, **prompt)  # type: ignore[arg-type]
    _, tokens, finish = await _collect(server, payload)
    assert (tokens, finish) == (4, "length")


async def test_default_max_tokens_fills_the_context(server: LLMServer) -> None:
    _, tokens, _ = await _collect(
        server, inference("r", prompt_token_ids=tuple(range(100)), ignore_eos=True)
    )
    assert tokens == 28


@pytest.mark.parametrize(("prompt_len", "max_tokens"), [(100, 29), (128, None), (200, 1)])
async def test_context_overflow_is_refused(
    server: LLMServer, prompt_len: int, max_tokens: int | None
) -> None:
    payload = inference(
        request_id="r", prompt_token_ids=tuple(range(prompt_len)), max_tokens=max_tokens
    )
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 128"):
        await _collect(server, payload)


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens", "refusal"),
    [
        (2, 7, InvalidRequest),  # the engine refused it: a 500 before
        (None, 29, ContextLengthExceeded),  # 100 + 29 > 128: the same
    ],
)
async def test_min_tokens_that_cannot_be_honoured_are_refused(
    server: LLMServer, max_tokens: int | None, min_tokens: int, refusal: type[Exception]
) -> None:
    payload = inference("r", prompt_token_ids=tuple(range(100)), max_tokens=max_tokens)
    payload = replace(payload, sampling=replace(payload.sampling, min_tokens=min_tokens))
    with pytest.raises(refusal, match="min_tokens") as info:
        await _collect(server, payload)
    if isinstance(info.value, InvalidRequest):
        assert info.value.param == "min_tokens"


def test_output_limit_with_min_tokens() -> None:
    assert output_limit(100, None, 128, min_tokens=28) == 28
    assert output_limit(100, 8, 128, min_tokens=8) == 8
    with pytest.raises(InvalidRequest):
        output_limit(100, 8, 128, min_tokens=9)
    with pytest.raises(ContextLengthExceeded):
        output_limit(100, None, 128, min_tokens=29)


async def test_missing_prompt_is_invalid(server: LLMServer) -> None:
    with pytest.raises(InvalidRequest):
        await _collect(server, inference("r", max_tokens=1))


async def test_generate_model_refuses_embeddings(server: LLMServer) -> None:
    with pytest.raises(InvalidRequest, match="does not embed"):
        await server.embed(embedding(["x"]))


async def test_embed_model() -> None:
    srv = await LLMServer.create(SimulatedEngineConfig(served_name="e", task="embed", profile=FAST))
    vectors, tokens = await srv.embed(embedding(["a b c", "d"]))
    assert len(vectors) == 2 and tokens == 4
    with pytest.raises(InvalidRequest, match="does not generate"):
        await _collect(srv, inference("r", prompt_text="x", max_tokens=1))
    with pytest.raises(ContextLengthExceeded, match=r"input\[1\] exceeds"):
        await srv.embed(embedding(["ok", "w " * 500]))
    # a batch of the client's inputs from input 64 on names the client's index
    with pytest.raises(ContextLengthExceeded, match=r"input\[65\] exceeds"):
        await srv.embed(embedding(["ok", "w " * 500]), 64)
    assert srv.info().task == "embed"
    await srv.shutdown()


async def test_info_and_stats(server: LLMServer) -> None:
    info = server.info()
    assert (info.served_name, info.max_model_len) == ("sim", 128)
    before = server.stats().finished_total
    await _collect(server, inference("r", prompt_text="x", max_tokens=2))
    assert server.stats().finished_total == before + 1


@pytest.mark.parametrize("token", [-1, 10**9, 2**64, FAST.vocab_size])
async def test_token_ids_outside_the_vocabulary_are_refused(server: LLMServer, token: int) -> None:
    payload = inference("v", prompt_token_ids=(1, token), max_tokens=2)
    with pytest.raises(InvalidRequest, match="out of the model's vocabulary"):
        async for _ in server.generate(payload):
            pass


async def test_the_last_vocabulary_id_is_accepted(server: LLMServer) -> None:
    payload = inference(request_id="v", prompt_token_ids=(FAST.vocab_size - 1,), max_tokens=1)
    deltas = [d async for d in server.generate(payload)]
    assert deltas[-1].finish_reason is not None


async def test_the_replica_is_warm_before_it_takes_traffic() -> None:
    cold = await LLMServer.create(SimulatedEngineConfig(served_name="c", profile=FAST), warm=False)
    with pytest.raises(EngineNotReady):
        cold.ready()
    assert cold.stats().finished_total == 0
    await cold.shutdown()
    warm = await LLMServer.create(SimulatedEngineConfig(served_name="w", profile=FAST))
    assert warm.stats().finished_total == 1  # the warm-up generation
    assert warm.ready().served_name == "w"
    await warm.shutdown()


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [
        (False, [SamplingOptions(temperature=0.0)]),
        # A real engine: vLLM compiles its random sampler and its log-probability rank
        # kernel on first use; the warm-up makes that happen before traffic.
        (True, [SamplingOptions(temperature=0.0), SamplingOptions(temperature=1.0, logprobs=1)]),
    ],
    ids=["simulated", "real"],
)
async def test_the_warm_up_samples_what_a_real_engine_compiles_on_first_use(
    constraints: bool, expected: list[SamplingOptions]
) -> None:
    srv = await LLMServer.create(SimulatedEngineConfig(served_name="s", profile=FAST), warm=False)
    engine = srv._engine
    generate = engine.generate
    seen: list[GenerationRequest] = []

    def recording(request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        seen.append(request)
        return generate(request)

    engine.generate = recording  # type: ignore[method-assign]
    engine.supports_constraints = constraints  # type: ignore[misc]
    try:
        await srv._warm_up()
        assert srv.ready().served_name == "s"
    finally:
        await srv.shutdown()
    assert [r.sampling for r in seen] == expected
    assert all(r.max_tokens == 1 for r in seen)
    assert len({r.request_id for r in seen}) == len(seen)  # each its own engine request


async def test_a_dead_engine_fails_the_health_check_and_its_requests() -> None:
    slow = SimulationProfile(max_model_len=128, decode_base_s=0.01)
    server = await LLMServer.create(SimulatedEngineConfig(served_name="d", profile=slow))
    server.check_health()
    running = server.generate(inference("live", prompt_text="hi", max_tokens=100, ignore_eos=True))
    await running.__anext__()
    server._engine.kill()  # type: ignore[attr-defined]
    with pytest.raises(EngineDead):
        server.check_health()
    with pytest.raises(EngineDead):
        server.ready()
    with pytest.raises(EngineDead):  # the request in flight fails too, it does not hang
        async for _ in running:
            pass
    with pytest.raises(EngineDead):
        async for _ in server.generate(inference("new", prompt_text="hi")):
            pass


@pytest.mark.parametrize(
    ("options", "param", "says"),
    [
        ({"structured": StructuredOutput("json_object")}, "response_format", "simulated"),
        (
            {
                "structured": StructuredOutput("json_schema", {"type": "array"}),
                "tool_choice": ToolChoice("required"),
            },
            "tool_choice",
            "simulated",
        ),
        (
            {
                "structured": StructuredOutput("json_schema", {"type": "object"}),
                "tool_choice": ToolChoice("named", "search"),
            },
            "tool_choice",
            "simulated",
        ),
        ({"logprobs": 2}, "logprobs", "simulated"),
        ({"logit_bias": ((5, 1.0), (99_999, 2.0))}, "logit_bias", "99999"),
        ({"stop_token_ids": (99_999,)}, "stop_token_ids", "99999"),
    ],
)
async def test_options_the_engine_cannot_honour_are_refused_naming_the_param(
    server: LLMServer, options: dict[str, object], param: str, says: str
) -> None:
    options = dict(options)
    choice = options.pop("tool_choice", None)
    request = replace(
        inference(messages=({"role": "user", "content": "hi"},), max_tokens=2),
        sampling=SamplingOptions(**options),  # type: ignore[arg-type]
        tool_choice=choice,
    )
    with pytest.raises(InvalidRequest, match=says) as info:
        await _collect(server, request)
    assert info.value.param == param
    # the parameter survives the trip across Ray (pickled back into the gateway)
    assert pickle.loads(pickle.dumps(info.value)).param == param


async def test_n_choices_stream_interleaved_each_with_its_index(server: LLMServer) -> None:
    request = replace(
        inference(messages=({"role": "user", "content": "hi"},), max_tokens=5, seed=11,
                  ignore_eos=True),
        n=3,
    )  # fmt: skip
    texts: dict[int, str] = {0: "", 1: "", 2: ""}
    tokens, finishes = 0, []
    async for d in server.generate(request):
        texts[d.index] += d.text
        tokens += d.num_new_tokens
        if d.finish_reason:
            finishes.append(d.index)
    assert sorted(finishes) == [0, 1, 2] and tokens == 15
    assert len(set(texts.values())) == 3  # seeds 11, 12, 13: three different answers
    again = {0: "", 1: "", 2: ""}
    async for d in server.generate(request):
        again[d.index] += d.text
    assert again == texts  # seeded: the same three again


def test_children_get_their_own_ids_and_seeds() -> None:
    base = GenerationRequest("r-1", (1, 2), SamplingOptions(seed=2**63 - 1), 4)
    kids = children(base, 2)
    assert [k.request_id for k in kids] == ["r-1-c0", "r-1-c1"]
    assert [k.sampling.seed for k in kids] == [2**63 - 1, 0]  # wraps inside int64
    unseeded = children(GenerationRequest("r", (1,), SamplingOptions(), 4), 2)
    assert [k.sampling.seed for k in unseeded] == [None, None]


async def test_merge_fails_with_a_failing_stream_and_cancels_the_others() -> None:
    cancelled = []

    async def slow() -> AsyncIterator[GenerationDelta]:
        try:
            yield GenerationDelta("a", 1)
            await asyncio.sleep(30)
            yield GenerationDelta("b", 1)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def broken() -> AsyncIterator[GenerationDelta]:
        yield GenerationDelta("x", 1)
        raise InvalidRequest("boom")

    got = []
    with pytest.raises(InvalidRequest, match="boom"):
        async for i, d in merge([slow(), broken()]):
            got.append((i, d.text))
    assert sorted(got) == [(0, "a"), (1, "x")] and cancelled == [True]


async def test_each_leg_of_a_disaggregated_request_is_its_own_engine_request() -> None:
    """The prefill leg (``-p``), the decode leg with the hand-off (``-d``) and a local
    attempt get distinct engine ids: a local fallback started while the abandoned decode
    leg is still being torn down on the same engine is not mistaken for it."""
    profile = FAST.model_copy(update={"kv_connector": True})
    srv = await LLMServer.create(SimulatedEngineConfig(served_name="sim", profile=profile))
    seen: list[str] = []  # the engine requests as the server makes them
    engine = srv._engine
    generate, prefill = engine.generate, engine.prefill

    def recording_generate(request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        seen.append(request.request_id)
        return generate(request)

    async def recording_prefill(request: GenerationRequest) -> object:
        seen.append(request.request_id)
        engine.generate = generate  # type: ignore[method-assign]  # its own inner call
        try:
            return await prefill(request)
        finally:
            engine.generate = recording_generate  # type: ignore[method-assign]

    engine.generate = recording_generate  # type: ignore[method-assign]
    engine.prefill = recording_prefill  # type: ignore[method-assign,assignment]
    try:
        req = inference("r9", prompt_token_ids=(1, 2, 3), max_tokens=2, temperature=0.0)
        handoff = await srv.prefill(req, 2)
        remote = [d.text async for d in srv.generate(req, 2, handoff)]
        local = [d.text async for d in srv.generate(req, 2)]
    finally:
        await srv.shutdown()
    assert seen == [f"{req.engine_id(2)}-p", f"{req.engine_id(2)}-d", req.engine_id(2)]
    assert "".join(remote) == "".join(local)  # same tokens, either way


@pytest.mark.parametrize("n", [1, 2])
async def test_the_first_delta_carries_the_engine_load_and_no_other(
    server: LLMServer, n: int
) -> None:
    """The fair queue's engine caps read it (app.fairness.queue): the engine's running
    and waiting requests and KV usage as this request's first token left, once."""
    one = inference("r", prompt_text="hello there", max_tokens=3, ignore_eos=True)
    payload = replace(one, n=n)
    deltas = [d async for d in server.generate(payload)]
    loads = [d.load for d in deltas]
    assert loads[0] is not None and all(x is None for x in loads[1:])
    assert loads[0].running == n and loads[0].waiting == 0
    assert 0 < loads[0].kv_cache_usage < 1
