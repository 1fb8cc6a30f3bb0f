"""Serving profiles on the real vLLM CPU engine (issue 32, experiments 1-5): the
baseline table of the default config and each profile, seed 003 §3.3's three traffics
against the long-context profile, where the KV cache runs out, chunked prefill on/off,
and whether a higher prefix-hit rate can come with a worse p95.

    .venv/bin/python -m benchmarks.profiles_kv [--arms a,b,...] [--scale S]

Arms (one ``vllm serve`` of the embedded SmolLM2-135M-Instruct at a time, 2 cores):
each gets the engine arguments Switchyard's builder resolves for local.yaml's SmolLM2
with that profile (``app.profiles`` fills the knobs, ``app.builders.engine_config``
and ``engine_args`` make vLLM's arguments) — ``default`` is local.yaml's model as
shipped. The sweep arms (``lc-kv-*``, ``lc-nochunk``, ``lc-chunk128``) are the
long-context engine with one knob changed, given to vLLM directly (the smallest KV
budgets cross limits the profile checks refuse; the window is 2,048 there). Serve's
knobs (queue bound, backpressure) are not in play: this measures the engine settings
a profile chooses; the gateway's own cost is measured by benchmarks.default_dtype.

Loads (closed loops at fixed concurrency, or Poisson at a share of the capacity measured
in the same run; warm-up excluded; chat template included in the token counts):

- ``c1``/``c8``/``c32`` (experiment 1, run twice): 64-token prompts, 32 output tokens;
- ``poisson70``: Poisson at 70 % of the default arm's capacity (its c32 requests/s);
- ``t1`` 100 short chats (64 in / 16 out), ``t2`` 100 requests sharing one 512-token
  system prompt (+ a 32-token question each), ``t3`` t1's 100 chats mixed with 20
  long-document queries (5 documents of 1,024 tokens, four questions each), all at
  concurrency 8. ``--scale`` multiplies the request counts.

During each load the engine's /metrics is scraped every SCRAPE_S: KV-cache usage,
running and waiting requests (gauges: mean and max), prefix-cache queries/hits and
preemptions (counters: deltas). Report: docs/benchmarks/profiles-kv-<date>.{md,json,png}
(``benchmarks.profiles_kv_report``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.bench.metrics import summarize
from app.bench.prompts import PromptFactory
from app.bench.records import RequestRecord, RequestSpec
from app.bench.workloads import generation_body
from benchmarks.serving_lib import (
    MODEL_ID,
    OUT_DIR,
    ChatTemplateCounter,
    Load,
    _sigterm_as_exit,
    environment,
    make_server,
    prepared_model_dir,
    run_load,
)
from benchmarks.serving_tax import stop

LOCAL_YAML = Path(__file__).resolve().parent.parent / "serve_configs" / "local.yaml"
MIB = 1024**2
SCRAPE_S = 1.0
SHORT_IN, SHORT_OUT = 64, 16
BASE_IN, BASE_OUT = 64, 32
SYSTEM_TOKENS, QUESTION_TOKENS = 512, 32
DOC_TOKENS, DOCS, QUERIES_PER_DOC = 1024, 5, 4
TRAFFIC_CONCURRENCY = 8
BASELINE = (("c1", 1, 4), ("c8", 8, 16), ("c32", 32, 32))  # name, concurrency, requests
RUNS = 2
POISSON_SHARE, POISSON_REQUESTS = 0.70, 40
GAUGES = {
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}
COUNTERS = {
    "prefix_queries": "vllm:prefix_cache_queries",
    "prefix_hits": "vllm:prefix_cache_hits",
    "preemptions": "vllm:num_preemptions",
}
FLAG_KEYS = [
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "enforce_eager",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "seed",
]


# --------------------------------------------------------------------------- arms
def resolved_engine(profile: str | None) -> dict[str, Any]:
    """vLLM's arguments for local.yaml's SmolLM2 with ``profile`` (None: as shipped),
    as Switchyard's builder resolves them on this node."""
    from app.builders import engine_config
    from app.config import AppArgs
    from app.engine.vllm_engine import VLLMEngineConfig, engine_args
    from app.settings import load_settings

    args = yaml.safe_load(LOCAL_YAML.read_text())["applications"][0]["args"]
    model = dict(next(m for m in args["models"] if m["id"] == MODEL_ID))
    if profile is not None:  # the profile's values, not local.yaml's own sizing
        for key in ("max_model_len", "kv_cache_memory_bytes", "max_num_seqs"):
            model.pop(key, None)
        model["profile"] = profile
    spec = AppArgs.model_validate({**args, "models": [model]}).models[0]
    engine = engine_config(spec, load_settings())
    assert isinstance(engine, VLLMEngineConfig)
    got = engine_args(engine)
    return {k: got[k] for k in FLAG_KEYS if got.get(k) is not None}


def flags(engine: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in engine.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if key == "enforce_eager":
                out += [name] if value else []
            else:
                out.append(name if value else "--no-" + key.replace("_", "-"))
        else:
            out += [name, str(value)]
    return out


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    engine: dict[str, Any]
    loads: tuple[str, ...]  # baseline, poisson70, t1, t2, t3


def arms() -> dict[str, Arm]:
    lc = resolved_engine("long_context")
    sweep = {**lc, "max_model_len": 2048}  # the smallest budgets cannot hold 8,192
    out = [
        Arm(
            "default",
            "make run's default (local.yaml, no profile)",
            resolved_engine(None),
            ("baseline", "poisson70", "t1", "t3"),
        ),
        Arm("throughput", "profile throughput", resolved_engine("throughput"), ("baseline",)),
        Arm(
            "interactive",
            "profile interactive",
            resolved_engine("interactive"),
            ("baseline", "poisson70"),
        ),
        Arm("long_context", "profile long_context", lc, ("baseline", "t1", "t2", "t3")),
        Arm(
            "lc-nochunk",
            "long_context, chunked prefill off",
            {**lc, "enable_chunked_prefill": False, "max_num_batched_tokens": lc["max_model_len"]}
            | {"long_prefill_token_threshold": 0},
            ("t1", "t3"),
        ),
        Arm(
            "lc-chunk128",
            "long_context, long-prefill threshold 128",
            {**lc, "long_prefill_token_threshold": 128},
            ("t1", "t3"),
        ),
    ]
    for mib in (128, 256, 512):
        engine = {**sweep, "kv_cache_memory_bytes": mib * MIB}
        out.append(Arm(f"lc-kv-{mib}", f"long_context, KV {mib} MiB, window 2048", engine, ("t3",)))
    return {a.name: a for a in out}


# --------------------------------------------------------------------------- requests
def chat(factory: PromptFactory, rng: random.Random, n_in: int, n_out: int) -> RequestSpec:
    body = generation_body("chat", MODEL_ID, factory.text(n_in, rng), n_out)
    return RequestSpec("chat", body, n_in, n_out, "short")


def with_context(context: str, question: str, n_in: int, kind: str, system: bool) -> RequestSpec:
    messages = (
        [{"role": "system", "content": context}, {"role": "user", "content": question}]
        if system
        else [{"role": "user", "content": context + "\n\nQuestion: " + question}]
    )
    body = generation_body("chat", MODEL_ID, messages, SHORT_OUT)
    return RequestSpec("chat", body, n_in, SHORT_OUT, kind)


def requests(counter: ChatTemplateCounter, scale: float) -> dict[str, list[RequestSpec]]:
    """Every load's requests, built before any server starts (seeded, deterministic).
    A one-message chat's length counts the chat template; a system prompt, document or
    question counts its own tokens."""
    factory, raw = PromptFactory(counter), PromptFactory(counter.raw)
    n = max(1, round(100 * scale))
    rng = random.Random(32)
    out = {
        name: [chat(factory, rng, BASE_IN, BASE_OUT) for _ in range(count)]
        for name, _, count in BASELINE
    }
    out["warmup"] = [chat(factory, rng, BASE_IN, BASE_OUT) for _ in range(4)]
    out["poisson70"] = [chat(factory, rng, BASE_IN, BASE_OUT) for _ in range(POISSON_REQUESTS)]
    out["t1"] = [chat(factory, rng, SHORT_IN, SHORT_OUT) for _ in range(n)]
    system = raw.shared(SYSTEM_TOKENS, "system")
    out["t2"] = [
        with_context(
            system,
            raw.text(QUESTION_TOKENS, rng),
            SYSTEM_TOKENS + QUESTION_TOKENS,
            "shared",
            system=True,
        )
        for _ in range(n)
    ]
    docs = [raw.shared(DOC_TOKENS, f"doc{d}") for d in range(DOCS)]
    n_docs = max(1, round(DOCS * QUERIES_PER_DOC * scale))
    longs = [
        with_context(
            docs[i % DOCS],
            raw.text(QUESTION_TOKENS, rng),
            DOC_TOKENS + QUESTION_TOKENS,
            "long_doc",
            system=False,
        )
        for i in range(n_docs)
    ]
    mixed = list(out["t1"]) + longs
    random.Random(3).shuffle(mixed)
    out["t3"] = mixed
    return out


# --------------------------------------------------------------------------- engine metrics
def read_metrics(base_url: str) -> dict[str, float] | None:
    try:
        text = httpx.get(base_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    wanted = {**GAUGES, **COUNTERS}
    out = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for key, name in wanted.items():
            if family.name == name:  # counters' families drop the _total suffix
                out[key] += sum(s.value for s in family.samples if not s.name.endswith("_created"))
    return out


@dataclass
class Scraper:
    """Polls the engine's /metrics during a load (a thread: the load owns the loop)."""

    base_url: str
    samples: list[dict[str, float]] = field(default_factory=list)
    _stop: bool = False

    async def run(self) -> None:
        while not self._stop:
            got = await asyncio.to_thread(read_metrics, self.base_url)
            if got is not None:
                self.samples.append(got)
            await asyncio.sleep(SCRAPE_S)

    def summary(
        self, before: dict[str, float] | None, after: dict[str, float] | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": len(self.samples)}
        for key in GAUGES:
            vals = [s[key] for s in self.samples]
            out[key + "_mean"] = sum(vals) / len(vals) if vals else None
            out[key + "_max"] = max(vals) if vals else None
        if before is not None and after is not None:
            for key in COUNTERS:
                out[key] = after[key] - before[key]
            q = out["prefix_queries"]
            out["prefix_hit_rate"] = out["prefix_hits"] / q if q else None
        return out


async def measured(
    base_url: str, label: str, load: Load, reqs: list[RequestSpec]
) -> tuple[list[RequestRecord], dict[str, Any]]:
    before = await asyncio.to_thread(read_metrics, base_url)
    scraper = Scraper(base_url)
    task = asyncio.create_task(scraper.run())
    try:
        records = await run_load(label, base_url, load, reqs)
    finally:
        scraper._stop = True
        await task
    after = await asyncio.to_thread(read_metrics, base_url)
    return records, scraper.summary(before, after)


# --------------------------------------------------------------------------- figures
def figures(records: list[RequestRecord], kind: str | None = None) -> dict[str, Any]:
    recs = [r for r in records if kind is None or r.kind == kind]
    s = summarize(recs)
    out: dict[str, Any] = {"requests": s["requests"], "errors": s["failed"]}
    for m in ("ttft", "itl", "e2e"):
        out |= {f"{m}_{p}": s[f"{m}_s"][p] for p in ("p50", "p95", "p99")}
    out["output_tok_per_s"] = s["output_throughput"] if s["duration_s"] > 0 else None
    out["req_per_s"] = s["request_throughput"] if s["duration_s"] > 0 else None
    out["e2e_all_ms"] = sorted(round(r.e2e * 1000, 1) for r in recs if r.ok and r.e2e)
    return out


def rss_gib(pid: int) -> float:
    """Resident memory of the server's whole process group (vLLM's engine core included)."""
    total = 0
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == pid:
                total += proc.memory_info().rss
    return total / 1024**3


def engine_seen(log: Path) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return next(
        (
            ln.split("with config:", 1)[1].strip()[:600]
            for ln in text.splitlines()
            if "with config:" in ln
        ),
        "",
    )


# --------------------------------------------------------------------------- running
def bench_arm(
    arm: Arm,
    model_dir: Path,
    log_dir: Path,
    reqs: dict[str, list[RequestSpec]],
    capacity: float | None,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """One arm's loads (``only``: those load names) on one server. ``poisson70`` runs
    at POISSON_SHARE of ``capacity``, or of this arm's own c32 where none is given."""
    server = make_server("vllm", model_dir, log_dir)
    head = server.cmd[: server.cmd.index("--served-model-name") + 2]
    server.cmd = [*head, *flags(arm.engine), *server.cmd[server.cmd.index("--host") :]]
    server.name, server.log_path = arm.name, log_dir / f"{arm.name}.log"
    result: dict[str, Any] = {"label": arm.label, "engine": arm.engine, "loads": {}}
    print(f"== {arm.name}: {arm.label}\n   {' '.join(flags(arm.engine))}", flush=True)
    server.start()
    try:
        result["ready_s"] = round(server.wait_ready(600.0), 1)
        result["engine_seen"] = engine_seen(server.log_path)
        print(f"   ready in {result['ready_s']} s", flush=True)
        asyncio.run(
            run_load(arm.name, server.base_url, Load("warmup", "closed", 4, 4, 0), reqs["warmup"])
        )
        plan: list[tuple[str, Load]] = []
        if "baseline" in arm.loads:
            plan += [
                (f"{n}-run{r}", Load(n, "closed", c, k, 0))
                for r in range(1, RUNS + 1)
                for n, c, k in BASELINE
            ]
        if "poisson70" in arm.loads:
            plan.append(("poisson70", Load("poisson70", "poisson", 0.0, POISSON_REQUESTS, 70)))
        plan += [
            (t, Load(t, "closed", TRAFFIC_CONCURRENCY, len(reqs[t]), 0))
            for t in ("t1", "t2", "t3")
            if t in arm.loads
        ]
        for key, load in plan:
            if only is not None and load.name not in only:
                continue
            if load.kind == "poisson":
                rate = capacity or capacity_of(result)
                if not rate:
                    print(f"   {key}: skipped, no capacity measured", flush=True)
                    continue
                load = Load(load.name, load.kind, POISSON_SHARE * rate, load.requests, 70)
            load_avg = round(os.getloadavg()[0], 2)
            recs, engine = asyncio.run(
                measured(server.base_url, f"{arm.name} {key}", load, reqs[load.name])
            )
            entry: dict[str, Any] = {
                "load": load.__dict__,
                "all": figures(recs),
                "engine_metrics": engine,
                "rss_gib": round(rss_gib(server.proc.pid), 2) if server.proc else None,
                "loadavg_1m_before": load_avg,
            }
            for kind in {r.kind for r in recs} - {"fixed"}:
                entry[kind] = figures(recs, kind)
            entry["records"] = [r.to_json() for r in recs]
            result["loads"][key] = entry
            a = entry["all"]
            print(
                f"   {key}: ttft p95 {a['ttft_p95']}, e2e p95 {a['e2e_p95']}, "
                f"{a['req_per_s']} req/s, errors {a['errors']}, kv max "
                f"{engine.get('kv_usage_max')}, hit {engine.get('prefix_hit_rate')}, "
                f"preempt {engine.get('preemptions')}",
                flush=True,
            )
    except Exception as exc:  # recorded; the next arm still runs
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"   FAILED: {result['error']} (log {server.log_path})", flush=True)
    finally:
        stop(server)
    return result


def capacity_of(result: dict[str, Any]) -> float | None:
    """The arm's capacity: its best requests/s over the baseline's c32 runs."""
    rates = [
        v["all"]["req_per_s"]
        for k, v in result.get("loads", {}).items()
        if k.startswith("c32") and v["all"]["req_per_s"]
    ]
    return max(rates) if rates else None


def main() -> None:
    from benchmarks.profiles_kv_report import write

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
    parser.add_argument(
        "--only", default=None, help="comma-separated loads (c1,c8,c32,poisson70,t1..t3)"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies t1-t3's counts")
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--stem", default=f"profiles-kv-{dt.date.today().isoformat()}")
    args = parser.parse_args()
    all_arms = arms()
    names = args.arms.split(",") if args.arms else list(all_arms)
    if "default" in names:  # poisson70 needs its capacity first
        names = ["default", *(n for n in names if n != "default")]
    model_dir = prepared_model_dir()
    reqs = requests(ChatTemplateCounter.from_path(model_dir), args.scale)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="switchyard-profiles-kv-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "environment": environment(model_dir),
        "command": " ".join(["python -m benchmarks.profiles_kv", *sys.argv[1:]]),
        "scale": args.scale,
        "constants": {
            "baseline": BASELINE,
            "runs": RUNS,
            "base_in_out": [BASE_IN, BASE_OUT],
            "short_in_out": [SHORT_IN, SHORT_OUT],
            "system_tokens": SYSTEM_TOKENS,
            "question_tokens": QUESTION_TOKENS,
            "doc_tokens": DOC_TOKENS,
            "docs": DOCS,
            "queries_per_doc": QUERIES_PER_DOC,
            "traffic_concurrency": TRAFFIC_CONCURRENCY,
            "poisson_share": POISSON_SHARE,
            "poisson_requests": POISSON_REQUESTS,
            "scrape_s": SCRAPE_S,
        },
        "arms": {},
    }
    started = time.monotonic()
    print(f"arms {names}; logs {log_dir}", flush=True)
    with _sigterm_as_exit():
        capacity: float | None = None
        for name in names:
            doc["arms"][name] = bench_arm(
                all_arms[name],
                model_dir,
                log_dir,
                reqs,
                capacity,
                set(args.only.split(",")) if args.only else None,
            )
            if name == "default":
                capacity = capacity_of(doc["arms"][name])
                doc["default_capacity_req_per_s"] = capacity
            doc["elapsed_s"] = round(time.monotonic() - started)
            write(doc, args.out, args.stem)
            (log_dir / "partial.json").write_text(json.dumps(doc, default=str))


if __name__ == "__main__":
    main()
