"""``switchyard eval`` against running gateways: on the simulated engine, whose greedy
text is a function of the prompt, a set built from its own answers scores exactly what
it was built to score; the command writes its report; on the tiny vLLM engine, every
service prompt is a request the gateway takes, structured output fits its schema and a
required tool choice yields a valid call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from app.eval.graders import normalise
from app.eval.runner import request_body, run
from app.eval.sets import EvalSet, load
from tests.integration.conftest import Gateway


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=gw.root, timeout=180, headers={"Authorization": f"Bearer {gw.api_key}"}
    )


async def test_a_set_built_from_the_simulated_engines_answers_scores_as_built(
    sim_gateway: Gateway,
) -> None:
    general = load("general")
    probes = general.items[:8]
    async with _client(sim_gateway) as c:
        words = []
        for item in probes:  # the engine's greedy answer to each, asked once
            r = await c.post("/v1/chat/completions", json=request_body(general, item, "sim-chat"))
            assert r.status_code == 200, r.text
            words.append(normalise(r.json()["choices"][0]["message"]["content"]).split()[0])
        # even items accept the engine's own first word, odd ones a word it never says
        items = [
            i.model_copy(update={"accept": [w] if n % 2 == 0 else ["zzzyzx"], "pattern": None})
            for n, (i, w) in enumerate(zip(probes, words, strict=True))
        ]
        built = EvalSet.model_validate(
            {**general.model_dump(), "items": [i.model_dump() for i in items]}
        )
        results = await run(c, [built], "sim-chat", concurrency=4)
    assert [r.verdict.ok for r in results] == [True, False] * 4
    # the simulated engine never stops early: a miss that ran to max_tokens is truncated
    assert {r.answer.finish_reason for r in results} == {"length"}
    assert {r.verdict.failure for r in results if not r.verdict.ok} == {"truncated"}
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in results)


def test_the_command_scores_a_model_and_writes_its_report(
    sim_gateway: Gateway, tmp_path: Path
) -> None:
    exe = Path(sys.executable).with_name("switchyard")
    done = subprocess.run(
        [
            str(exe),
            "eval",
            "run",
            "--model",
            "sim-chat",
            "--url",
            sim_gateway.root,
            "--sets",
            "general,korean",
            "--limit",
            "3",
            "--out",
            str(tmp_path),
            "--tag",
            "t",
        ],
        env={**os.environ, "SWITCHYARD_API_KEY": sim_gateway.api_key},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    paths = [Path(p) for p in done.stdout.split()]
    assert [p.suffix for p in paths] == [".json", ".md", ".png"]
    assert paths[0].name.startswith("eval-sim-chat-") and paths[0].stem.endswith("-t")
    doc = json.loads(paths[0].read_text())
    assert [i["id"] for i in doc["items"]] == [
        "gk-001",
        "gk-002",
        "gk-003",
        "ko-001",
        "ko-002",
        "ko-003",
    ]
    assert doc["overall"]["n"] == 6 and doc["overall"]["failures"]["error"] == 0
    assert sim_gateway.api_key not in paths[0].read_text() + paths[1].read_text()
    assert "sim-chat:" in done.stderr  # the summary line


async def test_every_service_prompt_is_served_and_constrained_output_holds(
    tiny_gateway: Gateway,
) -> None:
    service = load("service")
    async with _client(tiny_gateway) as c:
        results = await run(c, [service], "tiny-llama", concurrency=8)
    by_id = {i.id: i for i in service.items}
    assert len(results) == 50
    assert not [r.answer.error for r in results if r.answer.error], "the gateway refused some"
    for r in results:
        item = by_id[r.item]
        if r.kind == "json":  # guided decoding: it parses and fits, unless cut by max_tokens
            assert r.verdict.ok or r.verdict.failure in ("wrong", "truncated"), (r.item, r.answer)
        if r.kind == "tool_call" and item.tool_choice == "required":  # a forced call
            cut = r.answer.finish_reason == "length"
            assert cut or (r.answer.tool_calls and r.verdict.failure != "tool_error"), (
                r.item,
                r.answer,
            )
