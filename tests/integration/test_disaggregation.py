"""Prefill/decode disaggregation on real vLLM CPU engines of the tiny model: a prefill
replica and a decode replica joined by vLLM's NixlConnector (UCX over host memory),
beside a unified replica of the same weights. Greedy answers match the unified engine;
the decode engine's own connector counters show the KV arriving; the rule's choices
show in the route header; a frozen prefill engine (SIGSTOP) makes the request fall back
to a local prefill after the deadline; a client that leaves during either leg frees
both engines; every request leaves exactly one ledger record.

The two tests that freeze the prefill engine run last, and nothing runs on the pair
after them. A request that gets no answer fails with both engines' stats and every
process's stack: that is how the ~30 s stalls of full CI runs were traced to vLLM
compiling its sampler on the first sampled request (docs/architecture.md)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ray import serve

from tests.integration.conftest import Deploy, Gateway
from tests.integration.processes import describe, engine_processes, stacks

APP = "pd"
PD, UNIFIED = "tiny-pd", "tiny-unified"
PREFILL = f"LLMServer-{PD}-prefill"
DEADLINE_S = 4.0


@pytest.fixture(scope="module")
def pd(deploy: Deploy, tiny_model_dir: Path) -> Iterator[Gateway]:
    engine: dict[str, Any] = {
        "source": str(tiny_model_dir),
        "max_model_len": 512,
        "kv_cache_memory_bytes": 32 * 1024**2,
        "max_num_seqs": 4,
    }
    gw = deploy(
        APP,
        {
            "models": [
                {
                    "id": PD,
                    **engine,
                    "routing": {"prefix": {"block_size": 128}},
                    "disaggregation": {
                        "min_uncached_tokens": 128,
                        "prefill_deadline_s": DEADLINE_S,
                    },
                },
                {"id": UNIFIED, **engine},
            ],
            "gateway": {"kv_cache": {"default": "shared"}},
        },
    )
    yield gw
    serve.delete(APP)


def _prompt(i: int) -> str:
    """About 280 tokens of the tiny tokenizer: over the 128-token threshold."""
    return f"Report {i}: " + " ".join(f"r{i}y{j}" for j in range(55))


def _chat(gw: Gateway, model: str, content: str, key: str | None = None, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=gw.v1, api_key=key or gw.api_key, max_retries=0)
    try:
        return client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            max_tokens=kw.pop("max_tokens", 12),
            temperature=0,
            extra_body={"ignore_eos": True},
            **kw,
        )
    except openai.APIStatusError as exc:  # the known stall (module docstring): show where
        raise AssertionError(f"{exc.status_code} {exc.message}\n{_stalled(gw)}") from None


def _stalled(gw: Gateway) -> str:
    """What the pair was doing when a request got no answer: both engines' stats and
    every process's Python stack."""
    pre, dec = _stats(gw, PREFILL), _stats(gw, f"LLMServer-{PD}")
    return f"prefill={pre}\ndecode={dec}\n{stacks(gw.name)}"


def _route(raw: Any) -> dict[str, str]:
    return dict(p.split("=", 1) for p in raw.headers["x-switchyard-route"].split("; "))


def _stats(gw: Gateway, deployment: str) -> Any:
    return serve.get_deployment_handle(deployment, app_name=gw.name).stats.remote().result()


def _settled(gw: Gateway, deployment: str, deadline_s: float = 30.0) -> Any:
    """The engine's stats once nothing runs on it any more."""
    end = time.monotonic() + deadline_s
    while True:
        s = _stats(gw, deployment)
        if (s.running == 0 and s.extra["in_flight"] == 0) or time.monotonic() > end:
            return s
        time.sleep(0.2)


@contextmanager
def _frozen_prefill_engine() -> Iterator[None]:
    """The prefill replica's engine processes stopped (SIGSTOP): it hangs, alive. Where
    vLLM's process title is not visible yet (CI saw ``python … spawn_main``), every
    multiprocessing child of the replica is stopped: the engine core and its worker."""
    pids = engine_processes(APP, PREFILL)
    assert pids, f"no engine-core process under the prefill replica: {describe(APP, PREFILL)}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_a_long_prompt_is_prefilled_remotely_and_answers_as_the_unified_engine(
    pd: Gateway,
) -> None:
    key = pd.new_key(tenant="pd-remote")
    prefill_stats, decode_stats = _stats(pd, PREFILL), _stats(pd, f"LLMServer-{PD}")
    prefill_before, decode_before = prefill_stats.extra, decode_stats.extra
    busy_before = prefill_stats.busy_seconds_total + decode_stats.busy_seconds_total
    raw = _chat(pd, PD, _prompt(1), key)
    unified = _chat(pd, UNIFIED, _prompt(1)).parse()
    got = raw.parse()
    assert got.choices[0].message.content == unified.choices[0].message.content
    assert got.usage.prompt_tokens == unified.usage.prompt_tokens > 128
    route = _route(raw)
    assert (route["pd"], route["pd_reason"]) == ("remote", "long_uncached")
    prefill_stats, decode_stats = _stats(pd, PREFILL), _stats(pd, f"LLMServer-{PD}")
    prefill, decode = prefill_stats.extra, decode_stats.extra
    busy = prefill_stats.busy_seconds_total + decode_stats.busy_seconds_total - busy_before
    assert prefill["prefills_total"] == prefill_before["prefills_total"] + 1
    assert decode["prefills_total"] == decode_before["prefills_total"]
    # The decode engine's own connector counters: the prompt's KV arrived over NIXL.
    assert decode["kv_transfers_total"] >= decode_before["kv_transfers_total"] + 1
    assert decode["kv_transfer_bytes_total"] > decode_before["kv_transfer_bytes_total"]
    records = pd.records("pd-remote")
    assert len(records) == 1
    assert records[0]["prompt_tokens"] == got.usage.prompt_tokens
    assert records[0]["completion_tokens"] == got.usage.completion_tokens == 12
    # GPU time: both legs charged to the request, adding up to the two engines' own
    # busy time while it ran (nothing else ran on them)
    assert records[0]["gpu_seconds"] == pytest.approx(busy, rel=0.05)
    assert pd.metric("switchyard_pd_requests_total", served="remote",
                     reason="long_uncached") >= 1  # fmt: skip


def test_short_and_already_held_prompts_are_served_whole_on_the_decode_replica(
    pd: Gateway,
) -> None:
    before = _stats(pd, PREFILL).extra["prefills_total"]
    short = _route(_chat(pd, PD, "hello there"))
    assert (short["pd"], short["pd_reason"]) == ("local", "short")
    first = _route(_chat(pd, PD, _prompt(2)))
    again = _route(_chat(pd, PD, _prompt(2)))
    assert (first["pd"], again["pd"], again["pd_reason"]) == ("remote", "local", "cached")
    assert _stats(pd, PREFILL).extra["prefills_total"] == before + 1


def _body(content: str) -> dict[str, Any]:
    return {
        "model": PD,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }


def _leave_mid_stream(gw: Gateway, key: str, content: str, chunks: int) -> None:
    """Stream a long answer; leave after ``chunks`` chunks."""
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", gw.v1 + "/chat/completions", json=_body(content), headers=headers
        ) as r,
    ):
        if r.status_code != 200:
            raise AssertionError(f"{r.status_code} {r.read().decode()}\n{_stalled(gw)}")
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= chunks:
                return


def test_a_client_leaving_during_the_decode_leg_frees_both_engines(pd: Gateway) -> None:
    key = pd.new_key(tenant="pd-left-decode")
    before = _stats(pd, f"LLMServer-{PD}")
    _leave_mid_stream(pd, key, _prompt(5), chunks=3)
    decode = _settled(pd, f"LLMServer-{PD}")
    assert decode.running == 0 and decode.aborted_total == before.aborted_total + 1
    assert _settled(pd, PREFILL).running == 0
    records = pd.records("pd-left-decode")
    assert len(records) == 1 and 0 < records[0]["completion_tokens"] < 200


def test_a_hanging_prefill_falls_back_to_one_local_prefill_after_the_deadline(
    pd: Gateway,
) -> None:
    key = pd.new_key(tenant="pd-hang")
    expected = _chat(pd, UNIFIED, _prompt(3)).parse().choices[0].message.content
    with _frozen_prefill_engine():
        started = time.monotonic()
        raw = _chat(pd, PD, _prompt(3), key)
        took = time.monotonic() - started
    route = _route(raw)
    assert (route["pd"], route["pd_reason"]) == ("local", "fallback_prefill_timeout")
    assert raw.parse().choices[0].message.content == expected
    assert took >= DEADLINE_S  # it waited out the deadline, not an error
    assert len(pd.records("pd-hang", expected=2, deadline_s=3)) == 1  # billed once
    assert _settled(pd, PREFILL).running == 0  # the abandoned prefill was aborted
    assert pd.metric("switchyard_pd_requests_total", served="local",
                     reason="fallback_prefill_timeout") >= 1  # fmt: skip


def test_a_client_leaving_during_the_prefill_leg_frees_both_engines(pd: Gateway) -> None:
    key = pd.new_key(tenant="pd-left-prefill")
    decode_before = _stats(pd, f"LLMServer-{PD}")
    with _frozen_prefill_engine():
        # No byte comes before the first token: the client gives up after 1 s.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(pd.v1 + "/chat/completions", json=_body(_prompt(4)),
                       headers={"Authorization": f"Bearer {key}"}, timeout=1.0)  # fmt: skip
        # The request ends (and is settled) while the prefill engine is still frozen.
        records = pd.records("pd-left-prefill", deadline_s=30)
    assert len(records) == 1 and records[0]["completion_tokens"] == 0
    assert _settled(pd, PREFILL).running == 0
    decode = _settled(pd, f"LLMServer-{PD}")
    assert decode.running == 0  # the decode leg never started
    assert decode.finished_total == decode_before.finished_total
