"""A hot LoRA adapter on a simulated pool, in virtual time: spread over warm replicas
(ours) against pinned to the replica that holds it, and against adapter-blind routing.

    .venv/bin/python -m benchmarks.adapter_spread [--quick] [--out DIR]

Pool: 8 calibrated simulated engines (SmolLM2 on this CPU; docs/benchmarks/simulated-
engine-calibration.md) with multi-LoRA on (``max_loras`` 4 per batch, ``max_cpu_loras``
8 held, a cold load costs ``LOAD_S`` of the engine step), one virtual clock, the same
seeded request stream for every arm. Each replica reports the adapters its engine holds
every ``STATS_PERIOD_S`` (Ray's routing-stats period), as LLMServer does.

Workload: ``ADAPTERS`` adapters; the hot one carries ``HOT_SHARE`` of the requests, the
others share the rest evenly. Prompts: the adapter's ``SYSTEM``-token system prompt plus
``QUESTION`` distinct tokens, ``OUTPUT`` tokens out. Poisson arrivals at 0.5× and 0.8×
the pool's capacity, measured first in the same run (closed loop, 64 users,
adapter-blind least-loaded routing, ``USERS`` users: 32 per replica, its batch size).

Arms: ``least-loaded`` (adapter-blind: power of two choices on in-flight requests, Ray
Serve's default rule); ``pinned`` (always the least loaded replica holding the adapter,
any replica only when none does: multiplexed routing that prefers a replica holding the
model, ray#65691, without Ray's fallback once holders hit ``max_ongoing_requests``);
``ours`` (``app.scheduler`` defaults: a
hot adapter is kept warm on ≥ 2 replicas and spreads past saturated holders).

Metrics per arm and load: TTFT p50/p90, balance (max ÷ mean in-flight, sampled every
second), cold loads (the engines' own counters), replicas that served at least 5 % of
the hot adapter's requests. Writes adapter-spread-<date>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.bench.metrics import percentile
from app.bench.virtual_time import VirtualTime
from app.engine.protocol import Adapter, GenerationRequest, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile
from app.scheduler.adapter_placement import AdapterPlacement
from app.scheduler.blocks import chain_hashes, routing_salt
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest

REPLICAS = 8
ADAPTERS = 16
HOT_SHARE = 0.5
SYSTEM, QUESTION, OUTPUT = 256, 128, 48
LOAD_S = 0.05
STATS_PERIOD_S = 10.0
LOADS = (0.5, 0.8)
USERS = 32 * REPLICAS
HOT = "base:hot"


@dataclass(frozen=True)
class Job:
    rid: str
    tokens: tuple[int, ...]
    adapter: str | None


class Arm(Protocol):
    name: str

    def choose(self, job: Job, replicas: Sequence[str]) -> str: ...

    def done(self, job: Job) -> None: ...

    def report(self, replica: str, adapters: Sequence[str]) -> None: ...


class LeastLoaded:
    """Power of two choices on this router's in-flight count (adapter-blind)."""

    name = "least-loaded"

    def __init__(self, seed: int = 3) -> None:
        self._rng = random.Random(seed)
        self._in_flight: dict[str, int] = {}
        self._where: dict[str, str] = {}

    def choose(self, job: Job, replicas: Sequence[str]) -> str:
        a, b = self._rng.sample(list(replicas), 2)
        pick = a if self._in_flight.get(a, 0) <= self._in_flight.get(b, 0) else b
        self._in_flight[pick] = self._in_flight.get(pick, 0) + 1
        self._where[job.rid] = pick
        return pick

    def done(self, job: Job) -> None:
        self._in_flight[self._where.pop(job.rid)] -= 1

    def report(self, replica: str, adapters: Sequence[str]) -> None:
        pass


class Pinned(LeastLoaded):
    """Multiplexed routing that always prefers a replica holding the adapter: the least
    loaded of the holders (reported, or sent one), any replica only when none holds it
    (Ray Serve's multiplexed rule without its fallback at ``max_ongoing_requests``)."""

    name = "pinned"

    def __init__(self) -> None:
        super().__init__()
        self._holders: dict[str, set[str]] = {}

    def choose(self, job: Job, replicas: Sequence[str]) -> str:
        held = [r for r in replicas if r in self._holders.get(job.adapter or "", ())]
        if not held or job.adapter is None:
            pick = super().choose(job, replicas)
        else:
            pick = min(held, key=lambda r: self._in_flight.get(r, 0))
            self._in_flight[pick] = self._in_flight.get(pick, 0) + 1
            self._where[job.rid] = pick
        if job.adapter is not None:
            self._holders.setdefault(job.adapter, set()).add(pick)
        return pick

    def report(self, replica: str, adapters: Sequence[str]) -> None:
        for adapter, holders in self._holders.items():
            if adapter not in adapters:
                holders.discard(replica)
        for adapter in adapters:
            self._holders.setdefault(adapter, set()).add(replica)


class SchedulerArm:
    """``app.scheduler`` with an adapter block; the placement reads virtual time."""

    def __init__(self, name: str, vt: VirtualTime, adapter: dict[str, Any]) -> None:
        self.name = name
        config = ReplicaRouting.model_validate({"adapter": adapter})
        self.scheduler = Scheduler(config)
        self.scheduler.ctx.adapters = AdapterPlacement(config.adapter.recent_s, vt)
        self.block = config.prefix.block_size

    def choose(self, job: Job, replicas: Sequence[str]) -> str:
        hashes = chain_hashes(job.tokens, self.block, routing_salt(None, job.adapter))
        routed = RoutedRequest(job.rid, hashes, len(job.tokens), None, job.adapter)
        decision = self.scheduler.decide(routed, replicas)
        self.scheduler.routed(job.rid, routed, decision.replica)
        return decision.replica

    def done(self, job: Job) -> None:
        self.scheduler.completed(job.rid)

    def report(self, replica: str, adapters: Sequence[str]) -> None:
        self.scheduler.ctx.adapters.report(replica, adapters)


def make_arm(name: str, vt: VirtualTime) -> Arm:
    if name == "least-loaded":
        return LeastLoaded()
    if name == "pinned":
        return Pinned()
    return SchedulerArm(name, vt, {})


ARMS = ("least-loaded", "pinned", "ours")


def workload(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    names = [HOT] + [f"base:a{i}" for i in range(1, ADAPTERS)]
    systems = {a: tuple(rng.randrange(1000, 40000) for _ in range(SYSTEM)) for a in names}
    jobs = []
    for i in range(n):
        adapter = HOT if rng.random() < HOT_SHARE else rng.choice(names[1:])
        question = tuple(rng.randrange(1000, 40000) for _ in range(QUESTION))
        jobs.append(Job(f"q{i}", systems[adapter] + question, adapter))
    return jobs


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    balance: list[float] = field(default_factory=list)
    done: int = 0
    span_s: float = 0.0
    cold_loads: int = 0
    per_replica: dict[str, int] = field(default_factory=dict)
    hot_per_replica: dict[str, int] = field(default_factory=dict)


def profile() -> SimulationProfile:
    return SimulationProfile(max_loras=4, max_cpu_loras=8, adapter_load_s=LOAD_S,
                             eos_probability=0.0, max_waiting=100_000)  # fmt: skip


async def serve(
    arm_name: str, jobs: list[Job], arrivals: list[float] | None, users: int = 0
) -> Result:
    """``jobs`` through a fresh pool: at ``arrivals`` (open loop) or with ``users``
    closed-loop users."""
    vt = VirtualTime()
    arm = make_arm(arm_name, vt)
    names = [f"replica-{i}" for i in range(REPLICAS)]
    engines = {n: SimulatedEngine(profile(), clock=vt, sleep=vt.sleep) for n in names}
    for e in engines.values():
        await e.start()
    res = Result(per_replica=dict.fromkeys(names, 0), hot_per_replica=dict.fromkeys(names, 0))
    in_flight = dict.fromkeys(names, 0)
    finished = [0]

    async def one(job: Job) -> None:
        replica = arm.choose(job, names)
        in_flight[replica] += 1
        res.per_replica[replica] += 1
        res.hot_per_replica[replica] += job.adapter == HOT
        start, first = vt.now, None
        adapter = Adapter(job.adapter, f"/adapters/{job.adapter}") if job.adapter else None
        gen = GenerationRequest(job.rid, job.tokens, SamplingOptions(ignore_eos=True), OUTPUT,
                                adapter=adapter)  # fmt: skip
        async for d in engines[replica].generate(gen):
            if d.num_new_tokens and first is None:
                first = vt.now
        in_flight[replica] -= 1
        arm.done(job)
        assert first is not None
        res.ttft.append(first - start)
        finished[0] += 1

    async def sample() -> None:
        while finished[0] < len(jobs):
            busy = list(in_flight.values())
            mean = statistics.fmean(busy)
            if mean >= 1:
                res.balance.append(max(busy) / mean)
            await vt.sleep(1.0)

    async def stats() -> None:
        while finished[0] < len(jobs):
            for n, e in engines.items():
                arm.report(n, e.stats().adapters)
            await vt.sleep(STATS_PERIOD_S)

    tasks: list[asyncio.Task[None]] = []
    if arrivals is not None:

        async def arrive() -> None:
            for job, at in zip(jobs, arrivals, strict=True):
                await vt.sleep(at - vt.now)
                tasks.append(asyncio.ensure_future(one(job)))

        feeder: asyncio.Future[Any] = asyncio.ensure_future(arrive())
    else:
        queue = list(reversed(jobs))

        async def user() -> None:
            while queue:
                await one(queue.pop())

        feeder = asyncio.gather(*(user() for _ in range(users)))
    background = [asyncio.ensure_future(sample()), asyncio.ensure_future(stats())]
    await vt.run(lambda: finished[0] >= len(jobs))
    await feeder
    for task in background:
        task.cancel()  # parked on timers nobody fires any more
    res.done, res.span_s = finished[0], vt.now
    for e in engines.values():
        s = e.stats()
        res.cold_loads += int(s.extra["adapter_loads_total"])
        await e.shutdown()
    return res


def hot_replicas(r: Result) -> int:
    """Replicas that served at least 5 % of the hot adapter's requests."""
    total = sum(r.hot_per_replica.values())
    return sum(n >= 0.05 * total for n in r.hot_per_replica.values())


def figures(r: Result) -> dict[str, Any]:
    return {
        "requests": r.done,
        "ttft_p50_s": percentile(r.ttft, 50), "ttft_p90_s": percentile(r.ttft, 90),
        "throughput_rps": r.done / r.span_s if r.span_s else 0.0,
        "balance_max_over_mean_p50": percentile(r.balance, 50) if r.balance else None,
        "balance_max_over_mean_p90": percentile(r.balance, 90) if r.balance else None,
        "cold_loads": r.cold_loads, "hot_adapter_replicas": hot_replicas(r),
        "requests_per_replica": r.per_replica, "hot_requests_per_replica": r.hot_per_replica,
    }  # fmt: skip


def run(quick: bool) -> dict[str, Any]:
    n = 600 if quick else 3000
    jobs = workload(n, seed=7)
    cap_res = asyncio.run(serve("least-loaded", jobs, None, users=USERS))
    cap = cap_res.done / cap_res.span_s
    print(f"[adapter-spread] capacity (least-loaded, {USERS} users): {cap:.2f} req/s simulated")
    doc: dict[str, Any] = {"benchmark": "adapter-spread", "simulated": True,
                           "replicas": REPLICAS, "adapters": ADAPTERS, "hot_share": HOT_SHARE,
                           "load_s": LOAD_S, "requests": n, "capacity_rps": cap,
                           "loads": list(LOADS), "arms": {}}  # fmt: skip
    for arm in ARMS:
        doc["arms"][arm] = {}
        for load in LOADS:
            res = asyncio.run(serve(arm, jobs, poisson(load * cap, n, seed=11)))
            out = figures(res)
            doc["arms"][arm][str(load)] = out
            print(f"[adapter-spread] {load}× {arm}: TTFT p90 {out['ttft_p90_s']:.2f}s, "
                  f"max/mean p90 {out['balance_max_over_mean_p90']:.2f}, cold loads "
                  f"{out['cold_loads']}, hot on {out['hot_adapter_replicas']}")  # fmt: skip
    return doc


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"adapter-spread-{doc['date'][:10]}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    loads = [str(x) for x in doc["loads"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(ARMS)
    for i, arm in enumerate(ARMS):
        xs = [j + i * width for j in range(len(loads))]
        rows = [doc["arms"][arm][x] for x in loads]
        axes[0].bar(xs, [r["ttft_p90_s"] for r in rows], width, label=arm)
        axes[1].bar(xs, [r["balance_max_over_mean_p90"] for r in rows], width, label=arm)
        axes[2].bar(xs, [r["cold_loads"] for r in rows], width, label=arm)
    titles = ("TTFT p90 (s, log)", "max ÷ mean in flight, p90", "cold adapter loads")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xticks([j + width for j in range(len(loads))], [f"{x}× capacity" for x in loads])
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    lines = [
        "# A hot LoRA adapter on a simulated pool (virtual time)",
        "",
        f"`python -m benchmarks.adapter_spread` — {REPLICAS} calibrated simulated engines "
        f"(SmolLM2 on this CPU) with multi-LoRA (4 adapters per batch, 8 held, a cold load "
        f"{doc['load_s']} s of the engine step), {doc['requests']} requests per arm and load, "
        f"the same seeded stream for every arm: {ADAPTERS} adapters, the hot one "
        f"{HOT_SHARE:.0%} of the requests, {SYSTEM}-token system prompt per adapter + "
        f"{QUESTION} distinct tokens, {OUTPUT} out. Capacity (least-loaded, closed loop, "
        f"{USERS} users): {doc['capacity_rps']:.2f} req/s simulated. Wall time "
        f"{doc['wall_s']:.0f} s.",
        "",
        "| load | arm | TTFT p50 (s) | TTFT p90 (s) | max/mean in flight p50 | p90 | cold "
        "loads | replicas serving the hot adapter (≥ 5 % of it) | throughput (req/s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in loads:
        for arm in ARMS:
            r = doc["arms"][arm][x]
            lines.append(
                f"| {x}× | {arm} | {_f(r['ttft_p50_s'])} | {_f(r['ttft_p90_s'])} | "
                f"{_f(r['balance_max_over_mean_p50'])} | {_f(r['balance_max_over_mean_p90'])} | "
                f"{r['cold_loads']} | {r['hot_adapter_replicas']} | {_f(r['throughput_rps'])} |"
            )
    lines += ["", f"![TTFT, balance, cold loads]({stem.name}.png)", ""]
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
