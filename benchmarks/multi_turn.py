"""A 10-turn agent run through the Responses API (``previous_response_id``: the gateway
re-renders the stored chain) against the same run through chat completions (the client
resends the history), on the embedded SmolLM2 through Switchyard (real vLLM CPU engine),
side by side in one run.

    .venv/bin/python -m benchmarks.multi_turn [--quick] [--runs N]

One application: SmolLM2 (float32, as serve_configs/local.yaml) behind 2 ingress
replicas sharing a real local ``redis-server`` (so a chain's turns land on either
replica), plus the same weights with 32-token KV blocks (``block_size: 32``, the smallest
vLLM's CPU attention takes; its default there is 128) to show what the block size does to
the cached part of each turn.

A run is one agent: turn 1 states a task (its first line names the run, so no two runs
share a prefix); each later turn sends a tool result of about 90 tokens; every answer
is at most ``MAX_OUTPUT`` tokens at temperature 0. Arms, per run, back to back:

- ``responses``: each turn sends only its new input, with ``previous_response_id``;
- ``chat``: each turn resends the whole history, with the answers the ``responses``
  arm got (so both arms' prompts are the same tokens, turn for turn, but for the run's
  name on the first line: one arm never finds the other's turns in the cache);
- ``responses-b32``: as ``responses``, on the 32-token-block model.

Measured at the client, per turn: TTFT (first text delta of the stream), prompt and
cached tokens (the usage the server reports), and the request body's bytes. Reported
as medians over runs, the arms' ratio per turn, and the ledger's records against the
requests sent.

Writes docs/benchmarks/multi-turn-<date>[-quick][-TAG].{json,md,png}.
"""

from __future__ import annotations

import asyncio
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

from benchmarks import scaffold
from benchmarks.layer1_http import ray_serve
from benchmarks.local_redis import redis_server
from benchmarks.serving_lib import (
    KV_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_ID,
    environment,
    prepared_model_dir,
)

APP = "multi-turn"
ADMIN = "multi-turn-bench-admin"
TENANT = "bench"
B32 = "SmolLM2-b32"
TURNS = 10
MAX_OUTPUT = 24
ARMS = ("responses", "chat", "responses-b32")
TASK = ("You are a travel agent. Plan a five-day trip to Lisbon for two people: flights, "
        "a hotel near the river, three museums, and where to eat each evening.")  # fmt: skip
RESULTS = [
    "flight search: TAP TP1351 departs 07:40, arrives 09:55, 212 EUR per person; easyJet "
    "U27631 departs 13:05, arrives 15:20, 96 EUR per person, one bag included; Ryanair "
    "FR1883 departs 18:30, arrives 20:45, 74 EUR per person, no bags.",
    "hotel search: Memmo Alfama, 4 stars, 210 EUR a night, river view rooms sold out; "
    "Hotel da Baixa, 4 stars, 165 EUR a night, 600 m from the river, breakfast included; "
    "Lisbon Destination Hostel, 45 EUR a night, shared bathrooms.",
    "museum hours: Gulbenkian 10:00-18:00, closed Tuesday, 15 EUR; MAAT 10:00-19:00, closed "
    "Tuesday, 11 EUR; National Tile Museum 10:00-18:00, closed Monday, 8 EUR; Coach Museum "
    "10:00-18:00, closed Monday, 8 EUR.",
    "restaurant search: Cervejaria Ramiro, seafood, no bookings, queue 40 minutes; Taberna "
    "da Rua das Flores, petiscos, cash only; Belcanto, two Michelin stars, booking needed "
    "three weeks ahead; Time Out Market, open until midnight.",
    "weather forecast: day 1 sunny 24 C, day 2 sunny 26 C, day 3 cloudy 21 C with wind 30 "
    "km/h, day 4 rain 18 C, day 5 sunny 23 C; sunset around 20:30 every evening.",
    "transport: Viva Viagem card 0.50 EUR plus 1.80 EUR per ride; tram 28 runs every 12 "
    "minutes from 07:00; airport metro red line to Saldanha 25 minutes; taxi to Baixa "
    "about 18 EUR.",
    "budget check: flights 192 EUR for two on easyJet, hotel 660 EUR for four nights at "
    "Hotel da Baixa, museums 84 EUR, transport 40 EUR, leaving 524 EUR for food and extras "
    "within the 1,500 EUR budget.",
    "calendar: the travellers are free from Thursday 12 June to Monday 16 June; Saint "
    "Anthony's festival fills the Alfama streets on the night of 12 June; museums close "
    "early on 13 June.",
    "reviews: Hotel da Baixa 8.9 of 10 (1,240 reviews: quiet rooms, small lift); Cervejaria "
    "Ramiro 4.6 of 5 (garlic prawns); Time Out Market 4.3 of 5 (crowded at 20:00).",
]  # fmt: skip


def log(message: str) -> None:
    print(f"[multi-turn] {message}", file=sys.stderr, flush=True)


def inputs(run: str) -> list[str]:
    """The run's turn inputs: the task, then the tool results, then a closing ask."""
    first = f"Run {run}. {TASK}"
    rest = [f"Tool result, {r} Continue the plan." for r in RESULTS]
    return [*[first, *rest][: TURNS - 1], "Summarise the plan in three sentences."]


async def _sse(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed call: TTFT, the answer's text, the usage, the body's bytes."""
    raw = json.dumps(body).encode()
    start = time.perf_counter()
    ttft, text, usage, rid, status = None, [], None, None, 0
    async with http.stream("POST", url, content=raw,
                           headers={"content-type": "application/json"}) as r:  # fmt: skip
        status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            piece = None
            if data.get("type") == "response.output_text.delta":
                piece = data["delta"]
            elif data.get("type") in ("response.completed", "response.incomplete"):
                usage, rid = data["response"]["usage"], data["response"]["id"]
            elif data.get("object") == "chat.completion.chunk":
                for c in data.get("choices") or ():
                    piece = (c.get("delta") or {}).get("content") or piece
                if data.get("usage"):
                    usage = data["usage"]
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                text.append(piece)
    if usage is None:
        raise RuntimeError(f"{url}: status {status}, no usage")
    details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    return {"ttft": ttft, "text": "".join(text), "id": rid, "bytes": len(raw),
            "prompt": usage.get("input_tokens", usage.get("prompt_tokens")),
            "cached": details.get("cached_tokens", 0)}  # fmt: skip


async def responses_arm(http: httpx.AsyncClient, v1: str, model: str,
                        turns: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    out, previous = [], None
    for text in turns:
        body = {"model": model, "input": text, "max_output_tokens": MAX_OUTPUT,
                "temperature": 0, "stream": True, "previous_response_id": previous}  # fmt: skip
        got = await _sse(http, f"{v1}/responses", body)
        previous = got["id"]
        out.append(got)
    return out


async def chat_arm(http: httpx.AsyncClient, v1: str, turns: list[str],
                   answers: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    out, messages = [], []
    for text, answer in zip(turns, answers, strict=True):
        messages.append({"role": "user", "content": text})
        body = {"model": MODEL_ID, "messages": messages, "max_tokens": MAX_OUTPUT,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        out.append(await _sse(http, f"{v1}/chat/completions", body))
        messages = [*messages, {"role": "assistant", "content": answer}]
    return out


async def measure(v1: str, runs: int) -> dict[str, list[list[dict[str, Any]]]]:
    got: dict[str, list[list[dict[str, Any]]]] = {arm: [] for arm in ARMS}
    async with httpx.AsyncClient(timeout=300) as http:
        for i in range(runs):
            first = await responses_arm(http, v1, MODEL_ID, inputs(uuid.uuid4().hex[:8]))
            got["responses"].append(first)
            answers = [t["text"] for t in first]
            chat = chat_arm(http, v1, inputs(uuid.uuid4().hex[:8]), answers)
            b32 = responses_arm(http, v1, B32, inputs(uuid.uuid4().hex[:8]))
            if i % 2:  # the last two arms swap places every other run (drift)
                got["responses-b32"].append(await b32)
                got["chat"].append(await chat)
            else:
                got["chat"].append(await chat)
                got["responses-b32"].append(await b32)
            log(f"run {i + 1}/{runs} done")
    return got


def _median(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def per_turn(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{k: _median([r[t][k] for r in runs]) for k in ("ttft", "prompt", "cached", "bytes")}
            for t in range(TURNS)]  # fmt: skip


def ledger(root: str, sent: int) -> dict[str, Any]:
    r = httpx.get(f"{root}/admin/usage", params={"tenant": TENANT, "group": "records"},
                  headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)  # fmt: skip
    records = r.json()["data"]
    by = {e: sum(1 for x in records if x["endpoint"] == e) for e in ("responses", "chat")}
    return {"sent": sent, "records": len(records), "by_endpoint": by,
            "ok": sum(1 for x in records if x["status"] == "ok")}  # fmt: skip


def run(runs: int) -> dict[str, Any]:
    from ray import serve

    from app.builders import build_application
    from app.config import AppArgs
    from app.settings import Settings

    model_dir = prepared_model_dir()
    model = {"id": MODEL_ID, "source": str(model_dir), "dtype": "float32",
             "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": KV_BYTES,
             "max_num_seqs": MAX_NUM_SEQS}  # fmt: skip
    args = AppArgs.model_validate({
        "models": [model, {**model, "id": B32, "block_size": 32}], "ingress_replicas": 2,
        "default_model": MODEL_ID, "gateway": {"anonymous_tenant": TENANT},
    })  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        settings = Settings(cache_dir=Path(tmp), data_dir=Path(tmp) / "d", state_url=redis_url,
                            admin_token=SecretStr(ADMIN))  # fmt: skip
        with ray_serve() as cluster:
            log("deploying SmolLM2 (block 128 and 32) behind 2 ingress replicas (Redis)")
            serve.run(build_application(args, settings), name=APP, route_prefix=f"/{APP}")
            root = f"http://127.0.0.1:{cluster.port}/{APP}"
            log(f"{runs} runs of {TURNS} turns, arms {', '.join(ARMS)}")
            got = asyncio.run(measure(f"{root}/v1", runs))
            time.sleep(2)  # the last settlements
            books = ledger(root, sent=runs * TURNS * len(ARMS))
            serve.delete(APP)
    return {
        "parameters": {"model": MODEL_ID, "dtype": "float32", "turns": TURNS, "runs": runs,
                       "max_output_tokens": MAX_OUTPUT, "temperature": 0,
                       "ingress_replicas": 2, "state": "redis-server (local)",
                       "block_size": {"SmolLM2-135M-Instruct": "128 (vLLM's CPU default)",
                                      B32: 32}},
        "turns": {arm: per_turn(got[arm]) for arm in ARMS},
        "raw": {arm: [[{k: t[k] for k in ("ttft", "prompt", "cached", "bytes")} for t in r]
                      for r in got[arm]] for arm in ARMS},
        "ledger": books,
        "environment": environment(model_dir),
    }  # fmt: skip


def _f(v: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "–" if v is None else f"{v * scale:,.{digits}f}"


def markdown(doc: dict[str, Any], command: str) -> str:
    p, t, books = doc["parameters"], doc["turns"], doc["ledger"]
    env = doc["environment"]
    lines = [
        "# Multi-turn agent: Responses (`previous_response_id`) against chat (history resent)",
        "",
        f"Command: `{command}` at commit {env.get('git_commit', '?')}. {p['runs']} runs of "
        f"{p['turns']} turns per arm, answers ≤ {p['max_output_tokens']} tokens at "
        f"temperature 0; {p['model']} ({p['dtype']}) on the vLLM CPU engine, "
        f"{p['ingress_replicas']} ingress replicas sharing {p['state']}. Medians over runs.",
        "",
        "| turn | prompt tokens | cached: responses | cached: chat | cached: responses, "
        "block 32 | TTFT ms: responses | TTFT ms: chat | responses ÷ chat | TTFT ms: "
        "block 32 | body bytes: responses | body bytes: chat |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i in range(p["turns"]):
        r, c, b = t["responses"][i], t["chat"][i], t["responses-b32"][i]
        ratio = r["ttft"] / c["ttft"] if r["ttft"] and c["ttft"] else None
        lines.append(
            f"| {i + 1} | {_f(r['prompt'])} | {_f(r['cached'])} | {_f(c['cached'])} | "
            f"{_f(b['cached'])} | {_f(r['ttft'], 1000)} | {_f(c['ttft'], 1000)} | "
            f"{_f(ratio, 1, 2)} | {_f(b['ttft'], 1000)} | {_f(r['bytes'])} | {_f(c['bytes'])} |"
        )
    later = range(1, p["turns"])  # turns 2.. (turn 1 has no history)

    def ratio_of(a: str, b: str) -> float | None:
        return _median([t[a][i]["ttft"] / t[b][i]["ttft"] for i in later
                        if t[a][i]["ttft"] and t[b][i]["ttft"]])  # fmt: skip

    def share(arm: str) -> float:
        return sum(t[arm][i]["cached"] or 0 for i in later) / max(
            1, sum(t[arm][i]["prompt"] or 0 for i in later))

    lines += [
        "",
        f"Turns 2–{p['turns']}: TTFT responses ÷ chat, median of the per-turn ratios "
        f"{_f(ratio_of('responses', 'chat'), 1, 2)}; block 32 ÷ block 128 (both "
        f"responses) {_f(ratio_of('responses-b32', 'responses'), 1, 2)}. Share of prompt "
        f"tokens found in the prefix cache: responses {share('responses'):.0%}, chat "
        f"{share('chat'):.0%}, block 32 {share('responses-b32'):.0%}. The chain is "
        "re-rendered into the same tokens the client would resend, so the two APIs get "
        "the same cache hits; what the cache can hold of each turn is set by the KV block "
        "size (only whole blocks are reused).",
        "",
        f"Ledger: {books['records']} records for {books['sent']} requests sent "
        f"({books['by_endpoint']['responses']} `responses`, {books['by_endpoint']['chat']} "
        f"`chat`; {books['ok']} ok).",
        "",
        "![TTFT and cached tokens per turn](" + doc["_plot"] + ")",
        "",
        "Environment: " + ", ".join(f"{k} {env.get(k)}" for k in
                                    ("date", "cpu_model", "cpu_count", "ram_gib", "loadavg",
                                     "python", "versions")),
    ]  # fmt: skip
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = doc["turns"]
    xs = list(range(1, doc["parameters"]["turns"] + 1))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in ARMS:
        a.plot(xs, [(x["ttft"] or 0) * 1000 for x in t[arm]], marker="o", label=arm)
        b.plot(xs, [x["cached"] or 0 for x in t[arm]], marker="o", label=arm)
    b.plot(xs, [x["prompt"] or 0 for x in t["responses"]], "k--", label="prompt tokens")
    a.set(xlabel="turn", ylabel="TTFT ms (median)", title="Time to first token")
    b.set(xlabel="turn", ylabel="tokens (median)", title="Cached prompt tokens")
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = scaffold.parser(__doc__, quick=True)
    parser.add_argument("--runs", type=int, default=None, help="runs per arm (default 6)")
    parser.add_argument("--from-json", type=Path, help="re-render a stored result")
    args = parser.parse_args()
    command = scaffold.command("multi_turn")
    if args.from_json is not None:
        doc = json.loads(args.from_json.read_text())
        name = args.from_json.stem
    else:
        runs = args.runs or (2 if args.quick else 6)
        doc = run(runs)
        name = scaffold.stem("multi-turn", args)
    doc["_plot"] = f"{name}.png"
    doc["command"] = doc.get("command", command)
    scaffold.finish(args, name, doc, markdown(doc, doc["command"]),
                    lambda path: plot(doc, path))  # fmt: skip


if __name__ == "__main__":
    main()
