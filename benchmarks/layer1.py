"""Layer-1 cost and shared-limit accuracy, measured side by side in one run.

    .venv/bin/python -m benchmarks.layer1 [--quick] [--out docs/benchmarks]

1. In process: a ``Gatekeeper`` (simulated model, so its prompt tokenizer is the simulated
   one) and, per request, ``identify`` + ``plan`` + prompt tokenization + ``gate.admit``
   + ``gate.settle`` awaited to the end (``gate.drain``), for SQLite (a file) and Redis
   (a ``redis-server`` this script starts on a free loopback port); with an API key
   limited at key and tenant level (rpm, tpm, max_concurrent, daily tokens and USD, all
   too large to refuse) and anonymous without limits (principal lookup + ledger only).
   Configurations alternate in blocks of 100 requests so drift hits all of them.
   Also: the SmolLM2 HF tokenizer on the same chat prompt, if the model is prepared.
2. Over HTTP (``benchmarks.layer1_http``): the same app three times on Ray Serve
   (throughput-optimized mode, zero-latency simulated engine): anonymous/SQLite,
   limited key/SQLite, limited key/Redis; sequential ``max_tokens=1`` requests sent
   round-robin; p50/p99 and the deltas against the anonymous app.
3. Shared limits, two ingress replicas on one Redis: an rpm=600 key under an open-loop
   20 req/s sender (admitted count over the last 60 s vs the limit), and a 20 000-token
   daily budget under 16 concurrent streams (overshoot and unused budget from the ledger).

Writes ``layer1-<date>[-quick].{md,json,png}``; progress on stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import scaffold
from benchmarks.layer1_common import (
    BIG_LIMITS,
    BLOCK,
    CONTEXT,
    MAX_TOKENS,
    MESSAGES,
    MODEL,
    PHASES,
    PRICING,
    SPIKE_MS,
    TICKS,
    log,
    spikes,
    summarize,
)
from benchmarks.local_redis import redis_server


def evaluate_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets with the measured value and pass/miss."""
    rows: list[dict[str, Any]] = []

    def add(name: str, value: float | None, target: str, ok: bool | None) -> None:
        rows.append({"target": name, "value": value, "goal": target, "pass": ok})

    configs = doc.get("inprocess", {}).get("configs", {})
    for cfg, q, goal in (("sqlite-limits", "p50", 1.0), ("sqlite-limits", "p99", 3.0),
                         ("redis-limits", "p50", 2.0)):  # fmt: skip
        v = configs.get(cfg, {}).get("summary", {}).get("total", {}).get(f"{q}_ms")
        add(f"in-process {cfg} {q}", v, f"<= {goal} ms", None if v is None else v <= goal)
    rate = doc.get("rate", {}).get("window")
    if rate:
        err = rate["error_pct"]
        add("rpm=600 admitted, 2 replicas", err, "within ±2 %", abs(err) <= 2.0)
    budget = doc.get("budget", {}).get("accuracy")
    if budget:
        add("budget overshoot (tokens)", budget["overshoot"], "<= 0", budget["overshoot"] <= 0)
        ok = not budget["false_refusal"]
        add("unused budget (tokens)", budget["unused"], f"< {budget['smallest_request']}", ok)
    return rows


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def render_markdown(doc: dict[str, Any], image: str | None = None) -> str:
    meta = doc["meta"]
    lines = [f"# Layer-1 overhead and shared-limit accuracy ({meta['date'][:10]})", ""]
    lines += ["How: `benchmarks/layer1.py` (see benchmarks/README.md).", ""]
    lines += ["## Targets", "", "| target | measured | goal | |", "|---|---|---|---|"]
    for t in doc.get("targets", []):
        verdict = {True: "pass", False: "**miss**", None: "–"}[t["pass"]]
        lines.append(f"| {t['target']} | {_f(t['value'])} | {t['goal']} | {verdict} |")
    inproc = doc.get("inprocess")
    if inproc:
        lines += ["", "## In process, per request (ms)", ""]
        lines += ["| configuration | phase | p50 | p90 | p99 | p99.9 | mean |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for cfg, data in inproc["configs"].items():
            for ph in PHASES:
                s = data["summary"][ph]
                vals = " | ".join(_f(s[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "p99_9_ms"))
                lines.append(f"| {cfg} | {ph} | {vals} | {_f(s['mean_ms'])} |")
        slow = ", ".join(
            f"{cfg} {d['spikes']['count']}" + (f" (every ~{d['spikes']['median_gap']:.0f}th)"
            if d["spikes"]["median_gap"] else "")
            for cfg, d in inproc["configs"].items()
        )  # fmt: skip
        lines += ["", f"Requests over {SPIKE_MS} ms in total: {slow}."]
        hf = inproc.get("hf_tokenizer", {})
        lines.append("")
        if "skipped" in hf:
            lines.append(f"SmolLM2 HF tokenizer: skipped ({hf['skipped']}).")
        elif hf:
            h, s = hf["hf"], hf["simulated"]
            lines.append(
                f"Chat prompt ({hf['prompt_tokens']} tokens) through the SmolLM2 HF tokenizer "
                f"(chat template + encode): p50 {_f(h['p50_ms'])} ms, p99 {_f(h['p99_ms'])} ms; "
                f"simulated tokenizer p50 {_f(s['p50_ms'])} ms. A vLLM model's layer-1 cost is "
                "the `plan+tokenize` phase above plus the difference."
            )
    http = doc.get("http")
    if http:
        lines += ["", "## End to end over HTTP (ms, sequential, max_tokens=1)", ""]
        lines += ["| app | p50 | p99 | mean | Δp50 vs a | Δp99 vs a |", "|---|---|---|---|---|---|"]
        for app, s in http["summary"].items():
            d = http["deltas"].get(app, {})
            lines.append(
                f"| {app} | {_f(s['p50_ms'])} | {_f(s['p99_ms'])} | {_f(s['mean_ms'])} "
                f"| {_f(d.get('p50_ms'))} | {_f(d.get('p99_ms'))} |"
            )
    rate = doc.get("rate")
    if rate:
        w = rate["window"]
        lines += ["", "## Shared rate limit: rpm=600, 2 ingress replicas, Redis", ""]
        lines += [
            f"Drain burst first: {rate['drain_sent']} requests until the first 429. Then "
            f"{rate['rate']} req/s open loop for {rate['seconds']} s ({rate['sent']} sent, "
            f"statuses {rate['statuses']}, send lateness p99 {_f(rate['lateness_p99_ms'])} ms).",
            "",
            f"Admitted over the last {w['window_s']} s: **{w['admitted']}** "
            f"(expected {_f(w['expected'], 1)}; {_f(w['per_minute'], 1)}/min; "
            f"error {_f(w['error_pct'], 2)} %). Admitted per second: "
            f"{min(rate['admitted_per_s'])}–{max(rate['admitted_per_s'])}. Ledger records per "
            f"ingress replica (drain burst included): {rate.get('ledger_per_ingress')}.",
        ]
    budget = doc.get("budget")
    if budget:
        b = budget["accuracy"]
        lines += ["", "## Shared budget: daily_tokens, 16 concurrent streams, 2 replicas", ""]
        lines += ["| budget | billed | overshoot | unused | prompt + min_output | records |"]
        lines += ["|---|---|---|---|---|---|"]
        lines.append(
            f"| {b['budget']} | {b['billed']} | {b['overshoot']} | {b['unused']} "
            f"| {b['smallest_request']} | {b['records']} |"
        )
        lines += ["", f"Client outcomes: {budget['outcomes']}; capped by the budget "
                  f"(fewer than 64 tokens): {b['capped']}; records per ingress replica: "
                  f"{b['per_ingress']}."]  # fmt: skip
    if image:
        lines += ["", f"![layer 1]({image})"]
    lines += ["", "## Environment and parameters", "", "```json", json.dumps(meta, indent=1)]
    return "\n".join([*lines, "```", ""])


# ---------------------------------------------------------------------- in process
async def _layer(url: str, limited: bool) -> tuple[Any, dict[str, str]]:
    from app.admin.service import AdminService
    from app.config import GatewayArgs
    from app.engine.factory import SimulatedEngineConfig
    from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
    from app.observability.metrics import GatewayMetrics
    from app.state.records import Limits

    config = GatewayConfig(
        args=GatewayArgs(anonymous_tenant=None if limited else "anonymous"),
        state_url=url,
        tokenizers={MODEL: SimulatedEngineConfig(served_name=MODEL)},
    )
    layer = Gatekeeper(config, GatewayMetrics([MODEL]), replica="bench")
    if not limited:
        return layer, {}
    admin, tenant = AdminService(layer.store), f"bench-{uuid.uuid4().hex[:8]}"
    await admin.create_tenant(tenant, Limits(**BIG_LIMITS))
    issued = await admin.create_key(tenant, limits=Limits(**BIG_LIMITS))
    return layer, {"authorization": f"Bearer {issued.secret}"}


async def _one(layer: Any, headers: dict[str, str], prompt: int) -> tuple[float, ...]:
    """One request through layer 1 as ``app.api.generation`` drives it; phase times (s)."""
    from app.request import InferenceRequest, Outcome, Prompt
    from app.routing.spec import Pricing

    price = Pricing(**PRICING).price()
    t0 = time.perf_counter()
    caller, principal = await layer.identify(headers)
    t1 = time.perf_counter()
    plan = layer.plan(caller, principal)
    tokens, tokenizer = 0, layer.tokenizer(MODEL)
    if plan.needs_prompt_tokens and tokenizer is not None:
        tokens = len(tokenizer.apply_chat_template(MESSAGES))
    t2 = time.perf_counter()
    request = InferenceRequest(
        id=uuid.uuid4().hex, endpoint="chat", model=MODEL, prompt=Prompt(messages=MESSAGES),
        max_tokens=MAX_TOKENS, caller=caller,
    )  # fmt: skip
    admission = await layer.gate.admit(
        request, plan, prompt_tokens=tokens, context_left=CONTEXT - tokens, price=price
    )
    t3 = time.perf_counter()
    outcome = Outcome("chat", "ok", 200, model_served=MODEL, pool="LLMServer-sim",
                      prompt_tokens=prompt, completion_tokens=MAX_TOKENS)  # fmt: skip
    layer.gate.settle(admission, outcome)
    await layer.gate.drain()
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0


async def _inprocess(sqlite_dir: Path, redis_url: str, n: int, warmup: int) -> dict[str, Any]:
    from app.engine.simulated import DEFAULT_VOCAB_SIZE
    from app.engine.tokenizer import SimulatedPromptTokenizer

    prompt = len(SimulatedPromptTokenizer(DEFAULT_VOCAB_SIZE).apply_chat_template(MESSAGES))
    setups = {
        "sqlite-limits": (f"sqlite:///{sqlite_dir / 'limits.db'}", True),
        "redis-limits": (redis_url + "/0", True),
        "sqlite-anonymous": (f"sqlite:///{sqlite_dir / 'anonymous.db'}", False),
        "redis-anonymous": (redis_url + "/1", False),
    }
    layers = {name: await _layer(url, limited) for name, (url, limited) in setups.items()}
    samples: dict[str, list[tuple[float, ...]]] = {name: [] for name in layers}
    for layer, headers in layers.values():
        for _ in range(warmup):
            await _one(layer, headers, prompt)
    for start in range(0, n, BLOCK):
        for name, (layer, headers) in layers.items():
            for _ in range(min(BLOCK, n - start)):
                samples[name].append(await _one(layer, headers, prompt))
        if (start + BLOCK) % 500 == 0 or start + BLOCK >= n:
            log(f"in process: {min(n, start + BLOCK)}/{n} requests per configuration")
    for layer, _ in layers.values():
        await layer.store.close()
    configs = {}
    for name, rows in samples.items():
        cols = dict(zip(PHASES, zip(*rows, strict=True), strict=True))
        configs[name] = {
            "store": setups[name][0].split(":")[0],
            "limited": setups[name][1],
            "summary": {ph: summarize(cols[ph]) for ph in PHASES},
            "spikes": spikes([v * 1000 for v in cols["total"]], SPIKE_MS),
            "samples_ms": {ph: [round(v * 1000, 4) for v in cols[ph]] for ph in PHASES},
        }
    return {"prompt_tokens": prompt, "configs": configs}


def _hf_tokenizer(n: int) -> dict[str, Any]:
    from app.engine.simulated import DEFAULT_VOCAB_SIZE
    from app.engine.tokenizer import HFPromptTokenizer, SimulatedPromptTokenizer
    from app.models.prepare import find_prepared
    from app.settings import load_settings

    found = find_prepared("smollm2", load_settings().models_dir)
    if found is None:
        return {"skipped": "SmolLM2 is not prepared (`switchyard models prepare smollm2`)"}
    out: dict[str, Any] = {}
    for name, tok in (("hf", HFPromptTokenizer.from_path(found.path)),
                      ("simulated", SimulatedPromptTokenizer(DEFAULT_VOCAB_SIZE))):  # fmt: skip
        times = []
        for i in range(n + 50):
            t = time.perf_counter()
            ids = tok.apply_chat_template(MESSAGES)
            if i >= 50:
                times.append(time.perf_counter() - t)
        out[name] = summarize(times)
        out.setdefault("prompt_tokens", len(ids))
    return out


# --------------------------------------------------------------------------- report
def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))

    def cdf(ax: Any, series: dict[str, list[float]], title: str) -> None:
        for name, xs in series.items():
            ys = sorted(xs)
            ax.plot(ys, [(i + 1) / len(ys) for i in range(len(ys))], label=name)
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.set_xticks([t for t in TICKS if lo <= t <= hi])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(title=title, xlabel="ms", ylabel="fraction of requests")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8)

    configs = doc.get("inprocess", {}).get("configs", {})
    cdf(axes[0], {k: v["samples_ms"]["total"] for k, v in configs.items()},
        "layer 1 in process, per request")  # fmt: skip
    cdf(axes[1], doc.get("http", {}).get("samples_ms", {}), "end to end over HTTP")
    rate = doc.get("rate")
    if rate:
        xs = list(range(len(rate["admitted_per_s"])))
        axes[2].step(xs, rate["sent_per_s"], where="post", label="sent/s")
        axes[2].step(xs, rate["admitted_per_s"], where="post", label="admitted (200)/s")
        axes[2].axhline(rate["limit_rpm"] / 60, color="k", ls="--", lw=1, label="rpm / 60")
        w = rate["window"]["window_s"]
        axes[2].axvspan(len(xs) - w, len(xs), color="grey", alpha=0.12, label="counted window")
        axes[2].set(title="rpm=600, 2 ingress replicas", xlabel="s", ylabel="requests/s")
        axes[2].set_ylim(0, rate["rate"] * 1.25)
        axes[2].legend(fontsize=8)
        axes[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = scaffold.parser(__doc__, quick=True)
    parser.add_argument("--skip-http", action="store_true", help="in-process part only")
    a = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so Ray and Redis get stopped
    q = a.quick
    params = {
        "quick": q,
        "inprocess": {
            **{"n": 300 if q else 3000, "warmup": 50 if q else 200, "block": BLOCK},
            **{"limits": BIG_LIMITS, "pricing": PRICING, "max_tokens": MAX_TOKENS},
            "messages": MESSAGES,
        },
        "hf_tokenizer_n": 200 if q else 1000,
        "http": {"n": 60 if q else 500, "warmup": 20 if q else 50},
        "rate": {"limit_rpm": 600, "rate": 20.0, "seconds": 30 if q else 70},
        "budget": {"daily_tokens": 20030, "clients": 16, "max_tokens": 64},
    }
    from benchmarks import layer1_http

    doc: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="switchyard-layer1-") as tmp,
        redis_server(Path(tmp)) as redis_url,
    ):
        params["engine_profiles"] = {"http": layer1_http.ZERO, "shared": layer1_http.FAST}
        doc["meta"] = layer1_http.environment(redis_url, params)
        p = params["inprocess"]
        log(f"in process: {p['n']} requests per configuration after {p['warmup']} warm-up")
        doc["inprocess"] = asyncio.run(_inprocess(Path(tmp), redis_url, p["n"], p["warmup"]))
        doc["inprocess"]["hf_tokenizer"] = _hf_tokenizer(params["hf_tokenizer_n"])
        if not a.skip_http:
            doc.update(layer1_http.run(Path(tmp), redis_url, params))
    doc["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    env = os.environ.items()
    doc["meta"]["ray_serve_env"] = {k: v for k, v in env if k.startswith("RAY_SERVE_")}
    doc["targets"] = evaluate_targets(doc)
    stem = scaffold.stem("layer1", a) + ("-inprocess" if a.skip_http else "")
    scaffold.finish(a, stem, doc, render_markdown(doc, f"{stem}.png"), lambda png: plot(doc, png))
    print(render_markdown(doc))


if __name__ == "__main__":
    main()
