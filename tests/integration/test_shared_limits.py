"""Two ingress replicas sharing one real Redis share one budget and one rate limit
exactly: 16 concurrent streams of one tenant overshoot by 0 tokens and are never
refused while budget remains; an rpm bucket admits its capacity once, not once per
replica; a Responses chain continues from whichever replica answers the next turn."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import openai
import pytest

from tests.integration.conftest import SIM_FAST as FAST
from tests.integration.conftest import Deploy, Gateway

MIN_OUTPUT = 16
PROMPT = [{"role": "user", "content": "Count the tokens of this budget please."}]


@pytest.fixture(scope="module")
def shared_gateway(deploy: Deploy, redis_server_url: str) -> Gateway:
    return deploy(
        "shared",
        {
            "models": [{"id": "sim-shared", "engine": "simulated", "simulation": FAST}],
            "ingress_replicas": 2,
            # Exactness, not the store deadline, is tested here (test_store_outage covers
            # the deadline): 32 concurrent store calls on a loaded 2-core CI box took over
            # the default 0.5 s once, and fail-closed answered 503.
            "gateway": {"min_output_tokens": MIN_OUTPUT, "store_timeout_s": 5.0},
        },
        state_url=redis_server_url,
    )


async def _stream_until_refused(client: openai.AsyncOpenAI, log: list[str]) -> None:
    while True:
        try:
            stream = await client.chat.completions.create(
                model="sim-shared",
                messages=PROMPT,
                max_tokens=64,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                pass
            log.append("ok")
        except openai.RateLimitError as exc:
            log.append(str(exc.code))
            return


def test_sixteen_streams_share_one_budget_exactly(shared_gateway: Gateway) -> None:
    budget = 4000
    key = shared_gateway.new_key(tenant="shared-budget", daily_tokens=budget)
    client = openai.AsyncOpenAI(base_url=shared_gateway.v1, api_key=key, max_retries=0)
    outcomes: list[str] = []

    async def run() -> None:
        await asyncio.gather(*(_stream_until_refused(client, outcomes) for _ in range(16)))

    asyncio.run(run())
    assert outcomes.count("insufficient_quota") == 16
    records = shared_gateway.records("shared-budget", outcomes.count("ok"))
    assert len(records) == outcomes.count("ok"), "settlements missing"
    billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)
    prompt = records[0]["prompt_tokens"]
    assert billed <= budget  # overshoot: 0 tokens
    assert budget - billed < prompt + MIN_OUTPUT  # no refusal while a request still fit
    assert len({r["ingress"] for r in records}) == 2  # both replicas took part


def test_rpm_bucket_is_shared_not_per_replica(shared_gateway: Gateway) -> None:
    key = shared_gateway.new_key(tenant="shared-rpm", rpm=20)
    body = {"model": "sim-shared", "messages": PROMPT, "max_tokens": 1}
    headers = {"Authorization": f"Bearer {key}"}

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as http:
            sends = [
                http.post(shared_gateway.v1 + "/chat/completions", json=body, headers=headers)
                for _ in range(60)
            ]
            return [r.status_code for r in await asyncio.gather(*sends)]

    codes = asyncio.run(run())
    # 60 requests in well under a second: the shared bucket admits its capacity (20)
    # plus at most what refills meanwhile (20/60 per second) — never 2 × 20.
    admitted = codes.count(200)
    assert codes.count(429) == 60 - admitted
    assert 20 <= admitted <= 22
    assert len(shared_gateway.records("shared-rpm", admitted)) == admitted


def test_a_responses_chain_continues_on_either_replica(shared_gateway: Gateway) -> None:
    """Six chains of four turns at once: every turn finds its predecessor in Redis,
    whichever ingress replica stored it."""
    key = shared_gateway.new_key(tenant="shared-chains")
    client = openai.AsyncOpenAI(base_url=shared_gateway.v1, api_key=key, max_retries=0)

    async def chain(n: int) -> list[str]:
        ids: list[str] = []
        previous = None
        for turn in range(4):
            out = await client.responses.create(
                model="sim-shared", input=f"chain {n} turn {turn}", max_output_tokens=4,
                previous_response_id=previous,
            )  # fmt: skip
            assert out.previous_response_id == previous
            ids.append(out.id)
            previous = out.id
        return ids

    async def run() -> list[list[str]]:
        return list(await asyncio.gather(*(chain(n) for n in range(6))))

    chains = asyncio.run(run())
    records = {r["request_id"]: r for r in shared_gateway.records("shared-chains", 24)}
    assert len(records) == 24
    by_turn = [[records[i.removeprefix("resp_")] for i in ids] for ids in chains]
    crossed = sum(a["ingress"] != b["ingress"] for turns in by_turn
                  for a, b in itertools.pairwise(turns))  # fmt: skip
    assert crossed > 0  # some turn was answered by the other replica than its predecessor
    for ids, turns in zip(chains, by_turn, strict=True):
        assert {t["session_id"] for t in turns} == {ids[0]}  # one chain, one session
        prompts = [t["prompt_tokens"] for t in turns]
        assert prompts == sorted(prompts) and prompts[0] < prompts[-1]  # the chain grows
