"""Fair sharing of a saturated pool, on a simulated cluster in virtual time: FIFO (the
engines' own first-come queues, what Switchyard did before ``app.fairness``) against
the fair queue (``app.fairness.queue``: bands, VTC, shedding) ahead of the same engines.

    .venv/bin/python -m benchmarks.fair_sharing [--quick] [--out DIR]

Pool: ``REPLICAS`` simulated engines of ``BATCH`` sequences each, in two profiles
(``PROFILES``: SmolLM2 as calibrated on this CPU, where a prompt's prefill outlasts five
decode steps, and the same with prefill 10× cheaper), on one virtual clock
(``app.bench.virtual_time``). The replica is Switchyard's replica router's choice
(``app.scheduler``: one router per ingress replica, each seeing only its own requests,
as in the app), scoring the load alone or the load and the pending prefill. Each
request: ``PROMPT`` distinct prompt tokens, ``OUTPUT`` tokens out. The fair arm's cap
is the pool's slots (REPLICAS × BATCH), as ``gateway.fairness`` sets it; its
``max_waiting`` is the default (256).

Capacity: the FIFO pool's completed requests per second under a closed loop of
2 × slots users, measured first in the same run. Every load below is a multiple of it
(Poisson arrivals for ``DURATION`` simulated seconds, then drained).

Experiments:
* noisy neighbour: A at 3× its fair share (1.5× capacity), B at 0.3× (0.15×); B's TTFT
  p90 against B alone at the same rate;
* backlogged pair: A at 1.5× and B at 0.6× capacity, both above their half: each
  one's share of the weighted service (prompt + 2 × output tokens) and the largest gap
  between their services over time (VTC's bound: it stays bounded under fair, grows
  under FIFO);
* priority: an interactive tenant at 0.1× capacity under a batch flood at 2×:
  interactive TTFT p90 against alone;
* overload: two standard tenants at 1× capacity each (2× in all): what is shed (status,
  reason, Retry-After), errors, and the admitted requests' completion rate against
  capacity.
Arms (``ARMS``): FIFO; the fair queue with the headroom fixed (``headroom_sigmas``
none) and sized to the light demand (``app.fairness.reserve``, z = 1, the default); the
fair queue on two ingress replicas, each with half the slots, its own counters and its
own replica router, a request going to one at random (what a load balancer does); the
last two again with the replica router's prefill scorer on (``plugins/prefill.py``).
"Alone" is the light stream by itself, routed as the arm routes (``SOLO``). Not here: the whole
ingress (auth, store, HTTP; tests/unit/test_api_fair_queue.py runs the queue inside
it), a real vLLM pair (``benchmarks/fair_sharing_vllm.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.metadata import collect_metadata
from app.bench.metrics import percentile
from app.bench.virtual_time import VirtualTime
from app.engine.protocol import EngineOverloaded, GenerationRequest, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile
from app.fairness.queue import PoolQueue, QueueSettings, Shed
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.state import RoutedRequest
from app.state.records import Priority
from benchmarks import scaffold

REPLICAS = 8
BATCH = 4
PROMPT = 128
OUTPUT = 64
DURATION = 60.0
SEED = 5
W_IN, W_OUT = 1.0, 2.0  # the weighted service VTC counts (app.fairness.vtc)
# The replica router's scorers (``app.scheduler``, one router per ingress replica, as in
# the app): the load alone, or the load and the pending prefill (``plugins/prefill.py``).
LOAD = {"load": 1.0}
PREFILL = {"load": 1.0, "prefill": 1.0}
# arm → (ingress replicas with a fair queue, 0: FIFO; the headroom's z, None: fixed;
# the replica router's scorers)
ARMS: dict[str, tuple[int, float | None, dict[str, float]]] = {
    "fifo": (0, None, LOAD),
    "fair, fixed headroom": (1, None, LOAD),
    "fair": (1, 1.0, LOAD),
    "fair, 2 ingress": (2, 1.0, LOAD),
    "fair, prefill-aware": (1, 1.0, PREFILL),
    "fair, prefill-aware, 2 ingress": (2, 1.0, PREFILL),
}
# the light stream alone, routed as each arm routes
SOLO = {"solo": LOAD, "solo, prefill-aware": PREFILL}
STYLES = {"fifo": "--", "fair, fixed headroom": "-.", "fair": "-", "fair, 2 ingress": ":",
          "fair, prefill-aware": (0, (5, 1)),
          "fair, prefill-aware, 2 ingress": (0, (1, 3))}  # fmt: skip


@dataclass(frozen=True)
class Stream:
    """One tenant's Poisson arrivals: ``load`` × capacity requests per second."""

    tenant: str
    load: float
    band: Priority = "standard"


@dataclass
class Run:
    ttft: dict[str, list[float]] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    shed: dict[str, int] = field(default_factory=dict)  # "status reason" → count
    retry_after: list[int] = field(default_factory=list)
    errors: int = 0  # engine refusals (FIFO: its queue full)
    service: dict[str, float] = field(default_factory=dict)
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (t, S_A, S_B)
    finished_at: list[float] = field(default_factory=list)
    waits: dict[str, list[float]] = field(default_factory=dict)  # for a slot (fair arm)
    span_s: float = 0.0


# The calibrated CPU engine, where a 128-token prefill (0.19 s) outlasts five decode
# steps; and the same with prefill 10× cheaper, closer to a GPU's ratio of the two.
PROFILES: dict[str, dict[str, float]] = {
    "cpu-calibrated": {},
    "prefill-light": {"prefill_s_per_token": 0.00015},
}


def _profile(name: str) -> SimulationProfile:
    return SimulationProfile(max_batch_size=BATCH, eos_probability=0.0, prefix_cache_blocks=0,
                             **PROFILES[name])  # fmt: skip


def _arrivals(
    streams: list[Stream], capacity: float, duration: float
) -> list[tuple[float, Stream]]:
    rng = random.Random(SEED)
    out: list[tuple[float, Stream]] = []
    for s in streams:
        t = 0.0
        while True:
            t += rng.expovariate(s.load * capacity)
            if t >= duration:
                break
            out.append((t, s))
    return sorted(out, key=lambda a: a[0])


async def serve(
    profile: str,
    ingress: int,
    streams: list[Stream],
    capacity: float,
    duration: float,
    users: int = 0,
    sigmas: float | None = None,
    scorers: dict[str, float] = LOAD,
) -> Run:
    """Serve ``streams`` (open loop) or, with ``users``, a closed loop for ``duration``."""
    vt = VirtualTime()
    engines = [
        SimulatedEngine(_profile(profile), clock=vt, sleep=vt.sleep) for _ in range(REPLICAS)
    ]
    for e in engines:
        await e.start()
    # ingress replicas with a fair queue each (0: FIFO), the slots split among them; a
    # request goes to one at random, as a load balancer would send it
    cap = math.ceil(REPLICAS * BATCH / max(1, ingress))
    settings = QueueSettings(headroom_sigmas=sigmas)
    queues = [PoolQueue(cap, settings, vt, vt.sleep) for _ in range(ingress)]
    ids = [f"replica-{i}" for i in range(REPLICAS)]
    routers = [Scheduler(ReplicaRouting(scorers=scorers)) for _ in range(max(1, ingress))]
    for router in routers:
        router.set_replicas(ids)
    run, rng, seq = Run(), random.Random(SEED + 1), [0]
    pending = [0]

    async def one(s: Stream) -> None:
        seq[0] += 1
        rid, arrived = f"r{seq[0]}", vt.now
        ticket = None
        try:
            at = rng.randrange(len(queues)) if queues else 0
            router = routers[at]
            if queues:
                ticket = queues[at].ticket(s.tenant, s.band, PROMPT)
                await ticket.wait()
                run.waits.setdefault(s.tenant, []).append(ticket.waited_s)
            routed = RoutedRequest(rid, prompt_tokens=PROMPT)
            chosen = router.decide(routed, ids).replica
            router.routed(rid, routed, chosen)
            replica = ids.index(chosen)
            tokens = tuple(rng.randrange(10, 40000) for _ in range(PROMPT))
            request = GenerationRequest(rid, tokens, SamplingOptions(ignore_eos=True), OUTPUT)
            first = None
            try:
                async for d in engines[replica].generate(request):
                    if d.num_new_tokens and first is None:
                        first = vt.now
                        router.first_token(rid)
                        run.ttft.setdefault(s.tenant, []).append(first - arrived)
            finally:
                router.completed(rid, rid)
            run.done[s.tenant] = run.done.get(s.tenant, 0) + 1
            run.finished_at.append(vt.now)
            run.service[s.tenant] = run.service.get(s.tenant, 0.0) + W_IN * PROMPT + W_OUT * OUTPUT
        except Shed as shed:
            key = f"{shed.status} {shed.reason}"
            run.shed[key] = run.shed.get(key, 0) + 1
            run.retry_after.append(shed.retry_after_s)
        except EngineOverloaded:
            run.errors += 1
        finally:
            if ticket is not None:
                ticket.leave(OUTPUT)
            pending[0] -= 1

    async def sample() -> None:
        names = [s.tenant for s in streams]
        while pending[0] > 0 or vt.now < duration:
            if len(names) == 2:
                a, b = (run.service.get(n, 0.0) for n in names)
                run.samples.append((vt.now, a, b))
            await vt.sleep(1.0)

    tasks: list[asyncio.Task[None]] = []
    if users:
        stream = streams[0]

        async def user() -> None:
            while vt.now < duration:
                pending[0] += 1
                await one(stream)

        feeder: asyncio.Future[Any] = asyncio.gather(*(user() for _ in range(users)))
    else:
        plan = _arrivals(streams, capacity, duration)
        pending[0] = len(plan)

        async def arrive() -> None:
            for at, s in plan:
                await vt.sleep(at - vt.now)
                tasks.append(asyncio.ensure_future(one(s)))

        feeder = asyncio.ensure_future(arrive())
    sampler = asyncio.ensure_future(sample())
    await vt.run(lambda: feeder.done() and pending[0] <= 0)
    await feeder
    await asyncio.gather(*tasks)
    sampler.cancel()
    run.span_s = vt.now
    for e in engines:
        await e.shutdown()
    return run


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _solo(arm: str) -> str:
    """The light stream alone, routed as ``arm`` routes."""
    if arm in SOLO:
        return arm
    return "solo, prefill-aware" if ARMS[arm][2] == PREFILL else "solo"


def _light(r: Run, light: str, flood: str, solo_p90: float | None) -> dict[str, Any]:
    """The light tenant's figures in one arm, beside what the flood got done."""
    ttft = r.ttft.get(light, [])
    return {"wait_p90_s": _p(r.waits.get(light, []), 90), "ttft_p50_s": _p(ttft, 50),
            "ttft_p90_s": _p(ttft, 90), "over_solo_p90": (_p(ttft, 90) or 0) / (solo_p90 or 1),
            "light_done": r.done.get(light, 0), "flood_done": r.done.get(flood, 0),
            "shed": r.shed, "errors": r.errors}  # fmt: skip


def capacity_rps(profile: str, duration: float) -> float:
    users = 2 * REPLICAS * BATCH
    run = asyncio.run(serve(profile, 0, [Stream("cap", 1.0)], 1.0, duration, users=users))
    return run.done["cap"] / run.span_s


def experiments(profile: str, duration: float) -> dict[str, Any]:
    cap = capacity_rps(profile, duration)
    print(f"[fair-sharing] {profile}: capacity {cap:.2f} req/s (FIFO, closed loop)", flush=True)
    doc: dict[str, Any] = {"capacity_rps": cap, "duration_s": duration}

    def arms(streams: list[Stream], solo: list[Stream] | None = None) -> dict[str, Run]:
        out = {name: asyncio.run(serve(profile, ingress, streams, cap, duration, sigmas=z,
                                       scorers=routing))
               for name, (ingress, z, routing) in ARMS.items()}  # fmt: skip
        if solo is not None:
            for name, routing in SOLO.items():
                out[name] = asyncio.run(serve(profile, 0, solo, cap, duration, scorers=routing))
        return out

    noisy = arms([Stream("A", 1.5), Stream("B", 0.15)], [Stream("B", 0.15)])
    doc["noisy"] = {arm: _light(r, "B", "A", _p(noisy[_solo(arm)].ttft["B"], 90))
                    for arm, r in noisy.items()}  # fmt: skip
    print(f"[fair-sharing] noisy: {doc['noisy']}", flush=True)

    pair = arms([Stream("A", 1.5), Stream("B", 0.6)])
    doc["pair"] = {}
    for arm, r in pair.items():  # while arrivals last (both backlogged), not the drain
        inside = [(t, a, b) for t, a, b in r.samples if t <= duration]
        _, a_end, b_end = inside[-1]
        doc["pair"][arm] = {
            "B_service_share": b_end / ((a_end + b_end) or 1.0),
            "max_gap_weighted_tokens": max(abs(a - b) for _, a, b in inside),
            "gap_series": [(round(t, 1), a - b) for t, a, b in inside],
            "shed": r.shed,
        }
    doc["pair"]["request_weighted_tokens"] = W_IN * PROMPT + W_OUT * OUTPUT
    shares = {arm: round(doc["pair"][arm]["B_service_share"], 3) for arm in pair}
    print(f"[fair-sharing] pair: B's share of the service {shares}", flush=True)

    prio = arms([Stream("I", 0.1, "interactive"), Stream("X", 2.0, "batch")],
                [Stream("I", 0.1, "interactive")])  # fmt: skip
    doc["priority"] = {arm: _light(r, "I", "X", _p(prio[_solo(arm)].ttft["I"], 90))
                       for arm, r in prio.items()}  # fmt: skip
    print(f"[fair-sharing] priority: {doc['priority']}", flush=True)

    over = arms([Stream("A", 1.0), Stream("B", 1.0)])
    doc["overload"] = {}
    for arm, r in over.items():
        done = sum(r.done.values())
        in_window = sum(1 for t in r.finished_at if t <= duration)
        doc["overload"][arm] = {
            "admitted_done": done,
            "goodput_over_capacity": in_window / duration / cap,
            "ttft_p90_s": _p([x for v in r.ttft.values() for x in v], 90),
            "shed": r.shed,
            "shed_with_retry_after": sum(1 for x in r.retry_after if x >= 1),
            "errors": r.errors,
            "drain_s": r.span_s - duration,
        }
    print(f"[fair-sharing] overload: {doc['overload']}", flush=True)
    return doc


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _light_table(title: str, arms: dict[str, Any]) -> list[str]:
    lines = ["", f"### {title}", "",
             "| arm | light wait for a slot p90 (s) | light TTFT p50 (s) | light TTFT p90 (s) "
             "| p90 ÷ alone | light done | flood done | shed |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in (*SOLO, *ARMS):
        r = arms[arm]
        lines.append(f"| {arm} | {_f(r['wait_p90_s'])} | {_f(r['ttft_p50_s'])} | "
                     f"{_f(r['ttft_p90_s'])} | {_f(r['over_solo_p90'])} | {r['light_done']} | "
                     f"{r['flood_done']} | {r['shed']} |")  # fmt: skip
    return lines


def _plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["profiles"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for name in names:
        for arm, style in STYLES.items():
            series = doc["profiles"][name]["pair"][arm]["gap_series"]
            axes[0].plot([t for t, _ in series], [g for _, g in series], linestyle=style,
                         label=f"{name} {arm}")  # fmt: skip
    axes[0].set_title("backlogged pair: service(A) − service(B), weighted tokens")
    axes[0].set_xlabel("simulated s")
    axes[0].legend(fontsize=8)
    bars = [(f"{name}\n{exp}", exp, name) for name in names for exp in ("noisy", "priority")]
    for i, arm in enumerate(ARMS):
        vals = [doc["profiles"][name][exp][arm]["over_solo_p90"] for _, exp, name in bars]
        w = 0.8 / len(ARMS)
        axes[1].bar([x + i * w for x in range(len(bars))], vals, width=w, label=arm)
    axes[1].set_xticks([x + 0.4 for x in range(len(bars))], [b[0] for b in bars], fontsize=8)
    axes[1].set_yscale("log")
    axes[1].axhline(1.5, color="grey", linestyle=":")
    axes[1].set_title("light tenant's TTFT p90 ÷ alone (log; dotted: 1.5×)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _section(name: str, d: dict[str, Any]) -> list[str]:
    n, p, pr, o = d["noisy"], d["pair"], d["priority"], d["overload"]
    lines = ["", f"## Profile {name}: capacity {d['capacity_rps']:.2f} req/s"]
    lines += _light_table("Noisy neighbour (A 1.5× capacity = 3× its share, B 0.15× = 0.3×)", n)
    lines += ["", "### Backlogged pair (A 1.5×, B 0.6×: both above their half)", "",
              "| arm | B's share of weighted service | largest service gap (weighted tokens) |",
              "|---|---|---|"]  # fmt: skip
    for arm in ARMS:
        lines.append(f"| {arm} | {_f(p[arm]['B_service_share'], 3)} | "
                     f"{p[arm]['max_gap_weighted_tokens']:.0f} |")  # fmt: skip
    lines += ["", f"One request is {p['request_weighted_tokens']:.0f} weighted tokens."]
    lines += _light_table("Priority (interactive I 0.1× under a batch flood X at 2×)", pr)
    lines += ["", "### Overload (two tenants at 1× each: 2× capacity)", "",
              "| arm | admitted and done | completed while arriving ÷ capacity | TTFT p90 (s) "
              "| shed | shed with Retry-After | engine errors | drain after arrivals (s) |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in ARMS:
        r = o[arm]
        lines.append(f"| {arm} | {r['admitted_done']} | {_f(r['goodput_over_capacity'])} | "
                     f"{_f(r['ttft_p90_s'])} | {r['shed']} | {r['shed_with_retry_after']} | "
                     f"{r['errors']} | {_f(r['drain_s'], 1)} |")  # fmt: skip
    return lines


def write(doc: dict[str, Any], args: argparse.Namespace) -> Path:
    stem = scaffold.stem("fair-sharing", args, doc["meta"]["date"])
    lines = [
        "# Fair sharing of a saturated pool (simulated, virtual time)",
        "",
        f"`python -m benchmarks.fair_sharing` on {doc['meta']['git_commit']}: {REPLICAS} "
        f"simulated engines × {BATCH} sequences, {PROMPT} prompt / {OUTPUT} output tokens, "
        f"Poisson arrivals for {doc['duration_s']:.0f} simulated s, then drained. Capacity: "
        f"FIFO, closed loop of {2 * REPLICAS * BATCH} users, per profile; every load is a "
        "multiple of it. FIFO: the engines' own first-come queues; fair: "
        "`app.fairness.queue` ahead of them (cap = the pool's slots, max_waiting 256, "
        "headroom 5 %, fixed or sized to the light demand with z = 1); replicas chosen by "
        "`app.scheduler` (load, or load + pending prefill: `prefill-aware`), one router "
        "per ingress replica; each light figure is against the light stream alone, routed "
        "the same way. Profiles: "
        + ", ".join(f"`{k}` {v or '(as calibrated)'}" for k, v in PROFILES.items()) + ".",
    ]  # fmt: skip
    for name, d in doc["profiles"].items():
        lines += _section(name, d)
    lines += ["", f"![service gap and TTFT ratios]({stem}.png)", ""]
    return scaffold.finish(args, stem, doc, "\n".join(lines), lambda png: _plot(doc, png))


def main() -> None:
    a = scaffold.parser(__doc__, quick=True).parse_args()
    started = time.monotonic()
    duration = 20.0 if a.quick else DURATION
    doc: dict[str, Any] = {"duration_s": duration}
    doc["profiles"] = {name: experiments(name, duration) for name in PROFILES}
    doc["meta"] = collect_metadata(
        model_info={"id": "simulated/smollm2-135m-cpu2 (calibrated timing model, no weights)"},
        engine="switchyard SimulatedEngine in virtual time (app.bench.virtual_time)",
        engine_version=None,
        dataset=f"distinct random token ids, seed {SEED}",
        input_lengths=f"{PROMPT} tokens",
        output_lengths=f"{OUTPUT} tokens (ignore_eos)",
        concurrency="open loop, Poisson, loads as multiples of the measured capacity",
        warmup="none",
        duration=f"{doc['duration_s']:.0f} s of simulated arrivals per run, then drained",
        sampling={"ignore_eos": True},
        extra={"wall_s": round(time.monotonic() - started, 1)},
    )
    write(doc, a)


if __name__ == "__main__":
    main()
