"""Replica routing on a simulated cluster, in virtual time: which replica each request
goes to, and what that does to prefix-cache hits, TTFT and goodput.

    .venv/bin/python -m benchmarks.replica_routing [--quick] [--out DIR]

Cluster: 8 calibrated simulated engines (docs/benchmarks/simulated-engine-calibration
.json: SmolLM2 on this CPU), each with a prefix cache of ``CACHE_BLOCKS`` × 128 tokens,
all on one virtual clock (``app.bench.virtual_time``): hours of serving in seconds,
the same request stream (same seed) for every arm.

Workloads:
* ``shared-context`` (llm-d's shared-prefix benchmark): ``TENANTS`` tenants, each a
  ``CONTEXT`` -token shared context plus a short question; total prefix demand is 6× one
  replica's prefix cache. Poisson arrivals in steps of 0.5×, 1×, 2× and 3× the capacity
  of the least-loaded arm measured first in the same run (closed loop, 64 users).
* ``no-reuse`` (control): every prompt distinct, the same lengths.
* ``agentic``: sessions of ``AGENT_CALLS`` chained calls (each waits for the previous)
  over a growing context — one system prompt shared by all, the session's task, then
  each answer and tool result — arriving in bursts of ``AGENT_BURST`` sessions at
  ``AGENT_LOAD``× capacity; measured per session (E2E from its first call's arrival to
  its last call's end).

Arms: round-robin; least-loaded (power of two choices on in-flight requests, what Ray
Serve's default router does); ``prefix-affinity-baseline`` (Ray Serve LLM's
PrefixCacheAffinityRouter with its 2.60 defaults re-stated on token blocks instead of
characters: the replica with the longest match if the match rate ≥ 0.1, else the replica
with the smallest tree, lowest queue among them, no eviction, no load rule); ``ours``
(``app.scheduler``, approximate mode, default weights); ``ours precise`` (the engines'
KV events, delivered as they happen, correct the index; 128-token blocks, the engines'
own); each of ours also split over two independent routers (two ingress replicas).
Arms are in ``benchmarks.replica_arms``. Metrics per arm and step: the
engines' own prefix hit rate (cached ÷ prompt tokens), TTFT p50/p90, TPOT p90, goodput
(TTFT ≤ 2 s and TPOT ≤ 100 ms), balance (max ÷ mean in-flight, sampled each second).
Also: the same at 2× load with Zipf(1.2) tenant popularity (where load-blind affinity
pins a hot prefix to one replica). Writes replica-routing-<date>.{md,json,png}. Not
here: Ray Serve's own router code as an arm (least-loaded re-states its rule).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.bench.metrics import percentile
from app.bench.virtual_time import VirtualTime
from app.engine.kv_events import KvEvent
from app.engine.protocol import GenerationRequest, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile
from benchmarks import replica_arms as arms
from benchmarks.replica_arms import ARMS, Arm, LeastLoaded, Ours, SimRequest

REPLICAS = 8
CACHE_BLOCKS = 48  # 6,144 tokens of prefix cache per replica
TENANTS = 24  # × CONTEXT tokens = 6 × one replica's prefix cache
CONTEXT = 1536
QUESTION = 32
OUTPUT = 48
TTFT_SLO_S, TPOT_SLO_S = 2.0, 0.1
AGENT_SYSTEM, AGENT_TASK, AGENT_STEP, AGENT_CALLS, AGENT_BURST = 1024, 256, 192, 4, 8
AGENT_LOAD = 0.7  # agentic calls offered ÷ least-loaded capacity


# --------------------------------------------------------------------------- workload
def shared_context(n: int, seed: int, zipf: float = 0.0) -> list[SimRequest]:
    """Tenants drawn uniformly, or with Zipf popularity ``zipf`` (tenant k ∝ 1/k^zipf)."""
    rng = random.Random(seed)
    contexts = [tuple(rng.randrange(1, 49152) for _ in range(CONTEXT)) for _ in range(TENANTS)]
    weights = [1.0 / (k + 1) ** zipf for k in range(TENANTS)]
    out = []
    for i in range(n):
        question = tuple(rng.randrange(1, 49152) for _ in range(QUESTION))
        tenant = rng.choices(range(TENANTS), weights)[0]
        out.append(SimRequest(f"q{i}", contexts[tenant] + question))
    return out


def no_reuse(n: int, seed: int) -> list[SimRequest]:
    rng = random.Random(seed)
    length = CONTEXT + QUESTION
    return [SimRequest(f"u{i}", tuple(rng.randrange(1, 49152) for _ in range(length)))
            for i in range(n)]  # fmt: skip


def agentic(n_sessions: int, seed: int) -> list[list[SimRequest]]:
    """Agent sessions of ``AGENT_CALLS`` chained calls: every prompt starts with one
    ``AGENT_SYSTEM``-token system prompt (tool descriptions) shared by all sessions,
    then the session's ``AGENT_TASK``-token task; each next call appends the previous
    answer and an ``AGENT_STEP``-token tool result (the context grows by ~240 tokens)."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(1, 49152) for _ in range(AGENT_SYSTEM))
    out = []
    for s in range(n_sessions):
        context = system + tuple(rng.randrange(1, 49152) for _ in range(AGENT_TASK))
        calls = []
        for k in range(AGENT_CALLS):
            calls.append(SimRequest(f"s{s}-{k}", context, session=f"s{s}"))
            context += tuple(rng.randrange(1, 49152) for _ in range(OUTPUT + AGENT_STEP))
        out.append(calls)
    return out


def bursts(n: int, size: int, rate: float, seed: int) -> list[float]:
    """Start times of ``n`` flows arriving ``size`` at a time, bursts Poisson at
    ``rate`` per second."""
    starts = poisson(rate, (n + size - 1) // size, seed)
    return [starts[i // size] for i in range(n)]


# ------------------------------------------------------------------------------ run
@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    good: int = 0
    done: int = 0
    span_s: float = 0.0
    balance: list[float] = field(default_factory=list)
    session_e2e: list[float] = field(default_factory=list)


class _Forward:
    """A replica's KV events, straight to the arm's routers (one ZMQ hop in a cluster)."""

    def __init__(self, replica: str, listen: Callable[[str, list[KvEvent]], None]) -> None:
        self.replica, self.listen = replica, listen

    def publish(self, events: list[KvEvent]) -> None:
        self.listen(self.replica, events)


def _profile() -> SimulationProfile:
    return SimulationProfile(prefix_cache_blocks=CACHE_BLOCKS, max_model_len=4096,
                             eos_probability=0.0, max_waiting=100_000)  # fmt: skip


async def serve(
    arm: Arm,
    requests: list[SimRequest],
    arrivals: list[float] | None,
    users: int = 0,
    sessions: list[list[SimRequest]] | None = None,
) -> Result:
    """Run ``requests`` through ``arm`` on a fresh cluster: at ``arrivals`` (open loop),
    with ``users`` closed-loop users, or — with ``sessions`` — each session's calls one
    after another, the sessions starting at ``arrivals``."""
    vt = VirtualTime()
    names = [f"replica-{i}" for i in range(REPLICAS)]
    listen = getattr(arm, "engine_events", None)  # precise arms: told at once
    engines = {
        n: SimulatedEngine(_profile(), clock=vt, sleep=vt.sleep,
                           kv_publisher=_Forward(n, listen) if listen else None)
        for n in names
    }  # fmt: skip
    for e in engines.values():
        await e.start()
    res = Result()
    in_flight = dict.fromkeys(names, 0)
    finished = [0]
    flows = sessions if sessions is not None else [[r] for r in requests]
    total = sum(len(f) for f in flows)

    async def one(req: SimRequest) -> None:
        replica = arm.choose(req, names)
        in_flight[replica] += 1
        start, first, last = vt.now, None, None
        gen = GenerationRequest(req.rid, req.tokens, SamplingOptions(ignore_eos=True), OUTPUT)
        async for d in engines[replica].generate(gen):
            if d.prompt_tokens:
                res.prompt_tokens += d.prompt_tokens
                res.cached_tokens += d.cached_prompt_tokens
            if d.num_new_tokens:
                first = vt.now if first is None else first
                last = vt.now
        in_flight[replica] -= 1
        arm.done(req, replica)
        assert first is not None and last is not None
        ttft, tpot = first - start, (last - first) / max(1, OUTPUT - 1)
        res.ttft.append(ttft)
        res.tpot.append(tpot)
        res.good += ttft <= TTFT_SLO_S and tpot <= TPOT_SLO_S
        finished[0] += 1

    async def flow(calls: list[SimRequest]) -> None:
        start = vt.now
        for call in calls:
            await one(call)
        if sessions is not None:
            res.session_e2e.append(vt.now - start)

    async def sample() -> None:
        while finished[0] < total:
            busy = list(in_flight.values())
            mean = statistics.fmean(busy)
            if mean >= 1:
                res.balance.append(max(busy) / mean)
            await vt.sleep(1.0)

    tasks: list[asyncio.Task[None]] = []
    if arrivals is not None:

        async def arrive() -> None:
            for calls, at in zip(flows, arrivals, strict=True):
                await vt.sleep(at - vt.now)
                tasks.append(asyncio.ensure_future(flow(calls)))

        feeder: asyncio.Future[Any] = asyncio.ensure_future(arrive())
    else:
        queue = list(reversed(requests))

        async def user() -> None:
            while queue:
                await one(queue.pop())

        feeder = asyncio.gather(*(user() for _ in range(users)))
    sampler = asyncio.ensure_future(sample())
    await vt.run(lambda: finished[0] >= total)
    await feeder
    sampler.cancel()  # parked on a timer nobody fires any more
    res.done, res.span_s = finished[0], vt.now
    for e in engines.values():
        await e.shutdown()
    return res


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def figures(r: Result) -> dict[str, Any]:
    return {
        "requests": r.done,
        "hit_rate": r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0,
        "ttft_p50_s": percentile(r.ttft, 50), "ttft_p90_s": percentile(r.ttft, 90),
        "tpot_p90_s": percentile(r.tpot, 90),
        "goodput_rps": r.good / r.span_s if r.span_s else 0.0,
        "throughput_rps": r.done / r.span_s if r.span_s else 0.0,
        "balance_max_over_mean_p50": percentile(r.balance, 50) if r.balance else None,
        "balance_max_over_mean_p90": percentile(r.balance, 90) if r.balance else None,
    }  # fmt: skip


def make_arms() -> list[Arm]:
    return arms.make_arms([f"replica-{i}" for i in range(REPLICAS)])


def run(quick: bool) -> dict[str, Any]:
    n = 320 if quick else 800
    steps = (0.5, 1.0, 2.0, 3.0)
    uniform = shared_context(n, seed=7)
    capacity = figures(asyncio.run(serve(LeastLoaded(), uniform, None, users=64)))
    cap = capacity["throughput_rps"]
    print(f"[replica-routing] least-loaded capacity: {cap:.2f} req/s (simulated)")
    doc: dict[str, Any] = {"capacity_rps": cap, "steps": list(steps), "requests": n}
    doc.update(shared={}, skewed={}, no_reuse={}, agentic={}, decision_us={})
    for step in steps:
        arrivals = poisson(step * cap, n, seed=11)
        for arm in make_arms():
            out = figures(asyncio.run(serve(arm, uniform, arrivals)))
            doc["shared"].setdefault(arm.name, {})[str(step)] = out
            if isinstance(arm, Ours) and arm.decide_ns:
                p99 = percentile([x / 1000 for x in arm.decide_ns], 99)
                doc["decision_us"].setdefault(arm.name, {})[str(step)] = p99
            print(
                f"[replica-routing] shared {step}x {arm.name}: hit {out['hit_rate']:.2f} "
                f"ttft p90 {out['ttft_p90_s']:.2f}s goodput {out['goodput_rps']:.2f}"
            )
    skewed = shared_context(n, seed=7, zipf=1.2)
    arrivals = poisson(2.0 * cap, n, seed=11)
    for arm in make_arms():
        out = figures(asyncio.run(serve(arm, skewed, arrivals)))
        doc["skewed"][arm.name] = out
        print(
            f"[replica-routing] skewed {arm.name}: hit {out['hit_rate']:.2f} "
            f"ttft p90 {out['ttft_p90_s']:.2f}s goodput {out['goodput_rps']:.2f}"
        )
    control = no_reuse(n, seed=13)
    arrivals = poisson(0.7 * cap, n, seed=17)
    for arm in make_arms():
        if arm.name in ("least-loaded", "ours", "ours precise"):
            out = figures(asyncio.run(serve(arm, control, arrivals)))
            doc["no_reuse"][arm.name] = out
            print(f"[replica-routing] no-reuse {arm.name}: ttft p90 {out['ttft_p90_s']:.2f}s")
    sessions = agentic(n // AGENT_CALLS, seed=19)
    starts = bursts(len(sessions), AGENT_BURST, AGENT_LOAD * cap / (AGENT_CALLS * AGENT_BURST), 23)
    for arm in make_arms():
        res = asyncio.run(serve(arm, [], starts, sessions=sessions))
        out = figures(res)
        out["session_e2e_p50_s"] = percentile(res.session_e2e, 50)
        out["session_e2e_p95_s"] = percentile(res.session_e2e, 95)
        doc["agentic"][arm.name] = out
        print(
            f"[replica-routing] agentic {arm.name}: hit {out['hit_rate']:.2f} "
            f"session e2e p95 {out['session_e2e_p95_s']:.2f}s"
        )
    return doc




def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"replica-routing-{doc['date'][:10]}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    steps = [str(s) for s in doc["steps"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm in ARMS:
        rows = [doc["shared"][arm][s] for s in steps]
        xs = [float(s) for s in steps]
        axes[0].plot(xs, [r["ttft_p90_s"] for r in rows], marker="o", label=arm)
        axes[1].plot(xs, [r["hit_rate"] for r in rows], marker="o", label=arm)
        axes[2].plot(xs, [r["goodput_rps"] for r in rows], marker="o", label=arm)
    axes[0].set_yscale("log")
    titles = ("TTFT p90 (s, log)", "prefix hit rate (engines' own)",
              "goodput (req/s, TTFT ≤ 2 s, TPOT ≤ 100 ms)")  # fmt: skip
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("offered load ÷ least-loaded capacity")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    lines = [
        "# Replica routing on a simulated cluster (virtual time)",
        "",
        "`python -m benchmarks.replica_routing` — 8 calibrated simulated engines (SmolLM2 "
        f"on this CPU), {doc['requests']} requests per arm and step, the same seeded "
        "stream for every arm; shared-context workload: "
        f"{TENANTS} tenants × {CONTEXT}-token contexts (6× one replica's prefix cache) + "
        f"{QUESTION}-token questions, {OUTPUT} tokens out. Least-loaded capacity (closed "
        f"loop, 64 users): {doc['capacity_rps']:.2f} req/s simulated.",
        "",
        "## Shared context, uniform tenants",
        "",
        "| load | arm | hit rate | TTFT p50 (s) | TTFT p90 (s) | TPOT p90 (s) | goodput "
        "(req/s) | max/mean in flight p90 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        for arm in ARMS:
            r = doc["shared"][arm][s]
            lines.append(
                f"| {s}× | {arm} | {_f(r['hit_rate'])} | {_f(r['ttft_p50_s'])} | "
                f"{_f(r['ttft_p90_s'])} | {_f(r['tpot_p90_s'], 3)} | {_f(r['goodput_rps'])} | "
                f"{_f(r['balance_max_over_mean_p90'])} |"
            )
    lines += ["", "## Shared context, Zipf(1.2) tenant popularity, 2× load", "",
              "| arm | hit rate | TTFT p90 (s) | goodput (req/s) | max/mean in flight p90 |",
              "|---|---|---|---|---|"]  # fmt: skip
    for arm in ARMS:
        r = doc["skewed"][arm]
        balance = _f(r["balance_max_over_mean_p90"])
        lines.append(f"| {arm} | {_f(r['hit_rate'])} | {_f(r['ttft_p90_s'])} | "
                     f"{_f(r['goodput_rps'])} | {balance} |")  # fmt: skip
    lines += ["", "## Control: no shared prefixes, 0.7× load", "",
              "| arm | TTFT p90 (s) | throughput (req/s) |", "|---|---|---|"]  # fmt: skip
    for arm, r in doc["no_reuse"].items():
        lines.append(f"| {arm} | {_f(r['ttft_p90_s'])} | {_f(r['throughput_rps'])} |")
    lines += ["", f"## Agentic sessions ({AGENT_CALLS} chained calls, bursts of "
              f"{AGENT_BURST}, {AGENT_LOAD}× load)", "",
              "| arm | hit rate | TTFT p90 (s) | session E2E p50 (s) | session E2E p95 (s) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for arm, r in doc["agentic"].items():
        lines.append(f"| {arm} | {_f(r['hit_rate'])} | {_f(r['ttft_p90_s'])} | "
                     f"{_f(r['session_e2e_p50_s'])} | {_f(r['session_e2e_p95_s'])} |")  # fmt: skip
    lines += ["", f"![TTFT, hit rate, goodput]({stem.name}.png)", ""]
    Path(f"{stem}.md").write_text("\n".join(lines))
    return Path(f"{stem}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    a = parser.parse_args()
    started = time.monotonic()
    doc = run(a.quick)
    doc["wall_s"] = time.monotonic() - started
    doc["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"wrote {write(doc, a.out)}")


if __name__ == "__main__":
    main()
