"""What structure costs, and how fast a whole-session cancel frees the engine, on the
embedded SmolLM2 through Switchyard (real vLLM CPU engine), one run, side by side.

    .venv/bin/python -m benchmarks.agent_api [--quick]

One application: SmolLM2 (float32, ``tool_parser: hermes``, as serve_configs/local.yaml)
behind 2 ingress replicas sharing a real local ``redis-server``.

1. Structure cost. Three request kinds with the same prompt: plain text, ``response_format:
   json_schema`` (strict) and a named ``tool_choice`` with the same schema as its
   parameters. Streams are measured at the client: TTFT = the first chunk carrying
   content or a tool-call delta; ITL = the gaps between such chunks. Closed loops at
   concurrency 1 and 8, the kinds interleaved round by round (so drift of this box's
   speed hits all three alike); reported as p50 ratios to plain, in the same run.
2. Grammar caching. Per trial a schema never seen before (fresh property names): the
   first request with it, then a second with the same schema (TTFT each, concurrency 1),
   next to a plain request in the same trial.
3. Session cancel. Per trial, 4 streaming calls of one new session (sent through Ray's
   proxy, which spreads them over both ingress replicas); once the engine runs them all,
   ``POST /v1/sessions/{id}/cancel`` to one replica; the time from sending the cancel to
   the engine's running + waiting count back at its level before the session started
   (LLMServer ``stats``, polled every 5 ms). The ledger says which replicas held calls.

Writes docs/benchmarks/agent-api-<date>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from app.stats import percentile
from benchmarks.layer1_http import ray_serve
from benchmarks.local_redis import redis_server
from benchmarks.serving_lib import (
    KV_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_ID,
    OUT_DIR,
    environment,
    prepared_model_dir,
)

APP = "agent-api"
ADMIN = "agent-api-bench-admin"
TENANT = "bench"
KINDS = ("plain", "json_schema", "named_tool")
PROMPT = [
    {"role": "system", "content": "You answer with facts about cities."},
    {"role": "user", "content": "Give the name and the population of the capital of France."},
]
MAX_TOKENS = 32
CANCEL_STREAMS = 4
XGRAMMAR_ID = "SmolLM2-xgrammar"  # the same weights, vLLM's xgrammar backend


def log(message: str) -> None:
    print(f"[agent-api] {message}", file=sys.stderr, flush=True)


def schema(suffix: str = "") -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            f"city{suffix}": {"type": "string"},
            f"population{suffix}": {"type": "integer"},
        },
        "required": [f"city{suffix}", f"population{suffix}"],
        "additionalProperties": False,
    }


def body(
    kind: str, max_tokens: int = MAX_TOKENS, suffix: str = "", model: str = MODEL_ID
) -> dict[str, Any]:
    """Plain text ignores EOS, so every kind makes ``max_tokens`` tokens (the schema's
    open strings let the constrained kinds run to the limit too)."""
    out: dict[str, Any] = {"model": model, "messages": PROMPT, "max_tokens": max_tokens,
                           "temperature": 0.0, "stream": True}  # fmt: skip
    if kind == "plain":
        out["ignore_eos"] = True
    elif kind == "json_schema":
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": schema(suffix), "strict": True},
        }
    elif kind == "named_tool":
        out["tools"] = [{"type": "function", "function": {
            "name": "record_city", "description": "Record a city and its population.",
            "parameters": schema(suffix)}}]  # fmt: skip
        out["tool_choice"] = {"type": "function", "function": {"name": "record_city"}}
    return out


async def stream(http: httpx.AsyncClient, url: str, payload: dict[str, Any],
                 headers: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One streamed call: TTFT, ITLs, chunks, status (measured at the client)."""
    start = time.perf_counter()
    stamps: list[float] = []
    error = None
    async with http.stream("POST", url, json=payload, headers=headers) as r:
        status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                error = data["error"].get("code")
                continue
            for choice in data.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls"):
                    stamps.append(time.perf_counter())
    ttft = stamps[0] - start if stamps else None
    itls = [b - a for a, b in itertools.pairwise(stamps)]
    return {"status": status, "error": error, "ttft": ttft, "itls": itls, "chunks": len(stamps)}


def p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def pct(values: list[float], q: float) -> float | None:
    return percentile(values, q)


async def structure_cost(url: str, rounds: dict[int, int]) -> dict[str, Any]:
    """Closed loops at each concurrency, kinds interleaved round by round."""
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=300) as http:
        for kind in KINDS:  # warm-up: the engine, and each kind's grammar once
            await stream(http, url, body(kind))
        for concurrency, n_rounds in rounds.items():
            calls: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
            for i in range(n_rounds):
                for kind in KINDS:
                    got = await asyncio.gather(
                        *(stream(http, url, body(kind)) for _ in range(concurrency))
                    )
                    calls[kind].extend(got)
                log(f"c={concurrency}: round {i + 1}/{n_rounds}")
            figures = {}
            for kind, results in calls.items():
                ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
                itls = [g for r in results for g in r["itls"]]
                figures[kind] = {
                    "requests": len(results),
                    "failed": sum(1 for r in results if r["status"] != 200 or r["error"]),
                    "ttft_p50_s": p50(ttfts), "itl_p50_s": p50(itls),
                    "chunks_mean": statistics.fmean(r["chunks"] for r in results),
                }  # fmt: skip
            for kind in KINDS:
                base = figures["plain"]
                f = figures[kind]
                f["ttft_p50_ratio"] = f["ttft_p50_s"] / base["ttft_p50_s"]
                f["itl_p50_ratio"] = f["itl_p50_s"] / base["itl_p50_s"]
            out[f"c{concurrency}"] = figures
    return out


async def grammar_cache(url: str, trials: int, model: str) -> dict[str, Any]:
    rows = []
    async with httpx.AsyncClient(timeout=300) as http:
        await stream(http, url, body("json_schema", 4, "_warm", model))
        for i in range(trials):
            suffix = "_" + uuid.uuid4().hex[:8]
            plain = await stream(http, url, body("plain", 4, model=model))
            first = await stream(http, url, body("json_schema", 4, suffix, model))
            second = await stream(http, url, body("json_schema", 4, suffix, model))
            rows.append({"plain_ttft_s": plain["ttft"], "first_ttft_s": first["ttft"],
                         "second_ttft_s": second["ttft"]})  # fmt: skip
            log(f"grammar cache ({model}): trial {i + 1}/{trials}")
    ratios = [r["first_ttft_s"] / r["second_ttft_s"] for r in rows]
    return {
        "trials": rows,
        "first_ttft_p50_s": p50([r["first_ttft_s"] for r in rows]),
        "second_ttft_p50_s": p50([r["second_ttft_s"] for r in rows]),
        "plain_ttft_p50_s": p50([r["plain_ttft_s"] for r in rows]),
        "first_over_second_p50": p50(ratios),
    }


def _busy(handle: Any) -> int:
    s = handle.stats.remote().result()
    return int(s.running + s.waiting)


async def cancel_trials(root: str, handle: Any, trials: int) -> dict[str, Any]:
    url = f"{root}/v1/chat/completions"
    rows = []
    async with httpx.AsyncClient(timeout=300) as http:
        for i in range(trials):
            session = f"cancel-trial-{i}-{uuid.uuid4().hex[:6]}"
            base = await asyncio.to_thread(_busy, handle)
            payload = {**body("plain", 400), "ignore_eos": True}
            calls = [asyncio.ensure_future(stream(http, url, payload, {"x-session-id": session}))
                     for _ in range(CANCEL_STREAMS)]  # fmt: skip
            deadline = time.monotonic() + 60
            while await asyncio.to_thread(_busy, handle) < base + CANCEL_STREAMS:
                assert time.monotonic() < deadline, "the session's calls never all ran"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # every call is decoding
            sent = time.perf_counter()
            r = await http.post(f"{root}/v1/sessions/{session}/cancel")
            answered = time.perf_counter() - sent
            while await asyncio.to_thread(_busy, handle) > base:
                if time.perf_counter() - sent > 30:
                    break
                await asyncio.sleep(0.005)
            freed = time.perf_counter() - sent
            ended = await asyncio.gather(*calls)
            rows.append({"freed_s": freed, "cancel_answered_s": answered,
                         "cancel_status": r.status_code,
                         "calls_ended_cancelled": sum(c["error"] == "session_cancelled"
                                                      for c in ended)})  # fmt: skip
            log(f"cancel: trial {i + 1}/{trials}: freed in {freed * 1000:.0f} ms")
        records = (
            await http.get(
                f"{root}/admin/usage",
                params={"tenant": TENANT, "group": "records"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
        ).json()
    by_session: dict[str, set[str]] = {}
    for rec in records["data"]:
        if (rec.get("session_id") or "").startswith("cancel-trial-"):
            by_session.setdefault(rec["session_id"], set()).add(rec["ingress"])
    freed = [r["freed_s"] for r in rows]
    return {
        "trials": rows,
        "freed_p50_s": p50(freed), "freed_p95_s": pct(freed, 95), "freed_max_s": max(freed),
        "within_1s": sum(f <= 1.0 for f in freed),
        "sessions_on_both_replicas": sum(len(v) == 2 for v in by_session.values()),
        "cancelled_records": sum(
            1 for rec in records["data"] if rec["status"] == "cancelled"
            and (rec.get("session_id") or "").startswith("cancel-trial-")),
    }  # fmt: skip


def run(quick: bool, out: Path) -> dict[str, Any]:
    from ray import serve

    from app.builders import build_application
    from app.config import AppArgs, ModelSpec
    from app.settings import Settings

    model_dir = prepared_model_dir()
    rounds = {1: 2, 8: 1} if quick else {1: 6, 8: 2}
    grammar_trials, cancel_n = (2, 3) if quick else (6, 20)
    model = {"id": MODEL_ID, "source": str(model_dir), "dtype": "float32",
             "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": KV_BYTES,
             "max_num_seqs": MAX_NUM_SEQS, "tool_parser": "hermes"}  # fmt: skip
    xgrammar = {**model, "id": XGRAMMAR_ID, "tool_parser": None,
                "engine_kwargs": {"structured_outputs_config": {
                    "backend": "xgrammar", "disable_any_whitespace": True}}}  # fmt: skip
    args = AppArgs.model_validate({"models": [model, xgrammar], "ingress_replicas": 2,
                                   "default_model": MODEL_ID,
                                   "gateway": {"anonymous_tenant": TENANT}})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        settings = Settings(cache_dir=Path(tmp), data_dir=Path(tmp) / "d", state_url=redis_url,
                            admin_token=SecretStr(ADMIN))  # fmt: skip
        with ray_serve() as cluster:
            log("deploying SmolLM2 (guidance, xgrammar) behind 2 ingress replicas (Redis)")
            serve.run(build_application(args, settings), name=APP, route_prefix=f"/{APP}")
            root = f"http://127.0.0.1:{cluster.port}/{APP}"
            url = f"{root}/v1/chat/completions"
            handle = serve.get_deployment_handle(ModelSpec.model_validate(model).pool, app_name=APP)
            log("1/3 structure cost")
            cost = asyncio.run(structure_cost(url, rounds))
            log("2/3 grammar caching")
            cache = {
                backend: asyncio.run(grammar_cache(url, grammar_trials, model_id))
                for backend, model_id in (("guidance", MODEL_ID), ("xgrammar", XGRAMMAR_ID))
            }
            log("3/3 session cancel")
            cancel = asyncio.run(cancel_trials(root, handle, cancel_n))
            serve.delete(APP)
    result = {
        "parameters": {"model": MODEL_ID, "dtype": "float32", "max_tokens": MAX_TOKENS,
                       "rounds": rounds, "grammar_trials": grammar_trials,
                       "cancel_trials": cancel_n, "cancel_streams": CANCEL_STREAMS,
                       "ingress_replicas": 2, "state": "redis-server (local)",
                       "structured_outputs_backend": "guidance (structure cost, cancel); "
                       "guidance and xgrammar (grammar compile)"},
        "structure_cost": cost, "grammar_cache": cache, "session_cancel": cancel,
        "environment": environment(model_dir),
    }  # fmt: skip
    write(result, out)
    return result


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1000:.0f}"


def write(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"agent-api-{dt.date.today().isoformat()}"
    cost, cache, cancel = (
        result["structure_cost"],
        result["grammar_cache"],
        result["session_cancel"],
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    width = 0.2
    groups = [(c, m) for c in cost for m in ("ttft_p50_ratio", "itl_p50_ratio")]
    for i, kind in enumerate(KINDS):
        xs = [j + (i - 1) * width for j in range(len(groups))]
        ax.bar(xs, [cost[c][kind][m] for c, m in groups], width, label=kind)
    ax.set_xticks(range(len(groups)), [f"{c}\n{m.split('_')[0].upper()} p50" for c, m in groups])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("ratio to plain (same run)")
    ax.set_title("What structure costs")
    ax.legend()
    ax = axes[1]
    for backend, c in cache.items():
        xs = range(1, len(c["trials"]) + 1)
        for key, label, style in (("first_ttft_s", "1st, new schema", "-o"),
                                  ("second_ttft_s", "2nd, same schema", "--o")):  # fmt: skip
            ax.plot(xs, [t[key] * 1000 for t in c["trials"]], style, label=f"{backend}: {label}")
    ax.set_xlabel("trial (a new schema each)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Grammar compile: first vs second request")
    ax.legend(fontsize=8)
    ax = axes[2]
    freed = sorted(t["freed_s"] * 1000 for t in cancel["trials"])
    ax.plot(freed, [(i + 1) / len(freed) for i in range(len(freed))], marker=".")
    ax.axvline(1000, color="red", lw=0.8, label="1 s bound")
    ax.set_xlabel("cancel sent → engine slots free (ms)")
    ax.set_ylabel("fraction of trials")
    ax.set_title(f"Session cancel, {len(freed)} trials, 2 ingress replicas")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Agent API: what structure costs, and session cancel",
        "",
        "`python -m benchmarks.agent_api` — SmolLM2-135M (float32) on the vLLM CPU engine behind "
        "2 ingress replicas sharing a local Redis; one run, every figure side by side.",
        "",
        "## What structure costs (p50, ratios to plain in the same run)",
        "",
        "| concurrency | kind | requests | TTFT p50 (ms) | TTFT ratio | ITL p50 (ms) | ITL ratio "
        "| chunks / request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, figures in cost.items():
        for kind in KINDS:
            f = figures[kind]
            lines.append(
                f"| {c[1:]} | {kind} | {f['requests']} ({f['failed']} failed) | "
                f"{_ms(f['ttft_p50_s'])} | {f['ttft_p50_ratio']:.2f} | {_ms(f['itl_p50_s'])} | "
                f"{f['itl_p50_ratio']:.2f} | {f['chunks_mean']:.1f} |"
            )
    lines += [
        "",
        "## Grammar compile: the first request with a new schema vs the second",
        "",
        "Per trial a schema never seen before; 4 tokens out, so TTFT is what differs.",
        "",
        "| backend | TTFT p50, 1st (ms) | TTFT p50, 2nd (ms) | plain (ms) "
        "| 1st / 2nd (p50 of trials) |",
        "|---|---|---|---|---|",
        *(
            f"| {backend} | {_ms(c['first_ttft_p50_s'])} | {_ms(c['second_ttft_p50_s'])} | "
            f"{_ms(c['plain_ttft_p50_s'])} | {c['first_over_second_p50']:.2f} |"
            for backend, c in cache.items()
        ),
        "",
        "## Session cancel across 2 ingress replicas",
        "",
        f"- {len(cancel['trials'])} trials of {result['parameters']['cancel_streams']} streaming "
        f"calls each: every engine slot free after p50 {_ms(cancel['freed_p50_s'])} ms, p95 "
        f"{_ms(cancel['freed_p95_s'])} ms, max {_ms(cancel['freed_max_s'])} ms; "
        f"{cancel['within_1s']} / {len(cancel['trials'])} within 1 s.",
        f"- Sessions whose calls were spread over both replicas: "
        f"{cancel['sessions_on_both_replicas']} / {len(cancel['trials'])}; ledger records with "
        f"status `cancelled`: {cancel['cancelled_records']}.",
        "",
        f"![structure cost, grammar compile, cancel]({stem.name}.png)",
        "",
        "## Parameters and environment",
        "",
        "```json",
        json.dumps(
            {"parameters": result["parameters"], "environment": result["environment"]}, indent=1
        ),
        "```",
        "",
    ]
    Path(f"{stem}.md").write_text("\n".join(lines))
    log(f"wrote {stem}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few requests of each part")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--from-json", type=Path, help="re-render a stored result")
    a = parser.parse_args()
    if a.from_json is not None:
        write(json.loads(a.from_json.read_text()), a.out)
        return
    run(a.quick, a.out)


if __name__ == "__main__":
    main()
