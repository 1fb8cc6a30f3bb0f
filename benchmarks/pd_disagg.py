"""Prefill/decode disaggregation on a simulated pool, in virtual time: 4 prefill + 4
decode replicas (always disaggregate, or Switchyard's per-request rule) against 8
unified replicas, on a long-prompt workload and a balanced one.

    .venv/bin/python -m benchmarks.pd_disagg [--setting cpu|h200] [--prefill-replicas N]
        [--quick] [--out DIR]

Engines: the simulated engine with the KV hand-off on (app/engine/simulated_transfer.py:
``kv_bytes_per_token`` × pulled tokens ÷ ``transfer_bytes_per_s`` + ``transfer_base_s``),
calibrated by ``--setting``:

- ``cpu`` (the default): SmolLM2 on this 2-core CPU (docs/benchmarks/
  simulated-engine-calibration.md), the hand-off calibrated on the CPU NIXL pair
  (benchmarks/pd_cpu.py);
- ``h200``: a Llama-3-8B-shaped model's step costs measured on an H200
  (benchmarks/gpu_step_costs.py, docs/benchmarks/gpu-step-costs-2026-12-04.json), with
  the hand-off over RDMA assumed (not measured: a 400 Gb/s NIC at 45 GB/s, 10 ms fixed —
  one decode step and the connector's notification).

One virtual clock; every arm sees the same seeded request stream.

Workloads: ``long`` — prompts of ``LONG_IN`` distinct tokens, ``LONG_OUT`` out (10:1);
``balanced`` — ``BAL_IN`` in, ``BAL_OUT`` out (1:1). No prompt shares a prefix, so no
arm gains from a cache. Loads: Poisson at ``LOADS`` × the unified pool's capacity for
that workload, measured first in the same run (closed loop, the setting's ``users``).

Arms (8 replicas each): ``unified`` (8 engines, least loaded); ``pd-always`` (4 prefill
+ 4 decode, every request prefilled remotely: Ray Serve LLM's P/D); ``pd-auto`` (the
same 4 + 4 with ``app.disagg.rule`` in mode auto: remote only for ≥ ``THRESHOLD``
uncached tokens, or a shorter one when every decode replica has ``max_decode_in_flight``
requests, with a prefill replica under ``max_prefill_in_flight`` legs). Every
two-leg request goes through ``app.disagg.stream.PdStream``, the code the ingress runs.
Prefill and decode replicas are picked least loaded (in-flight requests).
``--prefill-replicas N`` gives the P/D arms N prefill and 8 − N decode replicas (the
report's name then ends in ``-<N>p<8−N>d``).

Goodput: completed requests per second that meet both SLOs — TTFT ≤ ``TTFT_SLO_X`` × the
unloaded TTFT of the workload's prompt, and TPOT ≤ the setting's ``tpot_slo_s``.
Writes pd-disagg-<date>[-<setting>].{md,json,png} (no suffix for ``cpu``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.bench.metrics import percentile
from app.bench.schedule import arrivals
from app.bench.virtual_time import VirtualTime
from app.disagg.rule import PdChoice, decide
from app.disagg.stream import PdStream
from app.engine.protocol import GenerationDelta, GenerationRequest, KvHandoff, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile

REPLICAS = 8
LONG_IN, LONG_OUT = 1500, 150
BAL_IN, BAL_OUT = 250, 250
LOADS = (0.3, 0.6, 0.9)
THRESHOLD = 512
TTFT_SLO_X = 4.0
ARMS = ("unified", "pd-always", "pd-auto")
WORKLOADS = {"long": (LONG_IN, LONG_OUT), "balanced": (BAL_IN, BAL_OUT)}


@dataclass(frozen=True)
class Setting:
    """One calibration of the engines and the knobs that scale with it: the closed
    loop that measures capacity must fill every batch, and the rule's in-flight limits
    and the TPOT SLO follow the engine's batch size and step time."""

    name: str
    calibration: str  # where the engine's numbers come from (the report says it)
    profiles: dict[str, SimulationProfile]  # per workload
    users: int
    requests: int
    tpot_slo_s: float
    max_prefill_in_flight: int
    max_decode_in_flight: int

    def profile(self, kind: str) -> SimulationProfile:
        return self.profiles[kind]


_CPU = SimulationProfile(kv_connector=True, eos_probability=0.0, max_waiting=100_000)

# Llama-3-8B's shape in bf16 on one H200 (benchmarks/gpu_step_costs.py, CUDA graphs;
# docs/benchmarks/gpu-step-costs-2026-12-04.json): prefill 1.9 ms + 28.7 µs a token;
# a decode step 5.9 ms + 70 µs a sequence over a 1600-token context (the long
# workload's), 5.8 ms + 29 µs over 384 tokens (the balanced one's). vLLM's GPU defaults
# otherwise: 16-token blocks, 256 sequences, 8192 prompt tokens a step; ~105 GB of KV
# after 16 GB of weights. KV of a token: 2 × 32 layers × 8 heads × 128 dims × 2 bytes.
_H200 = {
    kind: SimulationProfile(
        name="llama3-8b-shape-h200",
        max_model_len=8192,
        vocab_size=128256,
        prefill_s_per_token=2.87e-5,
        prefill_base_s=0.0019,
        decode_base_s=0.0059,
        decode_s_per_seq=per_seq,
        block_size=16,
        kv_capacity_tokens=800_000,
        prefix_cache_blocks=50_000,
        max_waiting=100_000,
        max_batch_size=256,
        max_prefill_tokens_per_step=8192,
        eos_probability=0.0,
        kv_connector=True,
        kv_bytes_per_token=131072,
        transfer_bytes_per_s=45e9,
        transfer_base_s=0.010,
    )
    for kind, per_seq in (("long", 7.0e-5), ("balanced", 2.9e-5))
}

SETTINGS = {
    "cpu": Setting(
        name="cpu",
        calibration="SmolLM2-135M on this 2-core CPU (docs/benchmarks/"
        "simulated-engine-calibration.md); hand-off calibrated on the CPU NIXL pair "
        "(docs/benchmarks/pd-cpu-2026-12-03.md)",
        profiles={kind: _CPU for kind in WORKLOADS},
        users=64,
        requests=1200,
        tpot_slo_s=0.15,
        max_prefill_in_flight=2,
        max_decode_in_flight=8,
    ),
    "h200": Setting(
        name="h200",
        calibration="a Llama-3-8B-shaped model's step costs measured on one H200 "
        "(benchmarks/gpu_step_costs.py, docs/benchmarks/gpu-step-costs-2026-12-04.json); "
        "hand-off over RDMA assumed, not measured",
        profiles=_H200,
        users=2048,  # capacity plateaus here (1024: 0.78x of it on the balanced workload)
        requests=6000,
        tpot_slo_s=0.05,
        # two 1500-token legs make a ~90 ms step, inside the long workload's TTFT SLO
        # with the hand-off (at 4 the rule kept 0.44x unified goodput at 0.9x load,
        # 0.71x at 2); a decode replica counts as busy at a quarter of its batch (at a
        # full batch, 256, local prefills held the balanced workload's TTFT p90 at
        # 0.22 s at 0.6x load)
        max_prefill_in_flight=2,
        max_decode_in_flight=64,
    ),
}


@dataclass(frozen=True)
class Job:
    rid: str
    tokens: tuple[int, ...]
    out: int


def workload(kind: str, n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    n_in, n_out = WORKLOADS[kind]
    return [
        Job(f"{kind}{i}", tuple(rng.randrange(1000, 40000) for _ in range(n_in)), n_out)
        for i in range(n)
    ]


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    remote: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    done: int = 0
    span_s: float = 0.0
    transfer_s: float = 0.0


class Pool:
    """Engines of one arm, least-loaded picking by in-flight requests."""

    def __init__(self, names: list[str], vt: VirtualTime, profile: SimulationProfile) -> None:
        self.engines = {n: SimulatedEngine(profile, clock=vt, sleep=vt.sleep) for n in names}
        self.in_flight = dict.fromkeys(names, 0)

    def pick(self) -> str:
        return min(self.in_flight, key=lambda n: (self.in_flight[n], n))


class _Leg:
    """A started engine stream with the ``cancel`` PdStream expects."""

    def __init__(self, agen: Any) -> None:
        self._agen = agen

    async def __anext__(self) -> GenerationDelta:
        delta: GenerationDelta = await self._agen.__anext__()
        return delta

    def cancel(self) -> None:
        pass


async def serve(
    arm: str,
    jobs: list[Job],
    arrivals: list[float] | None,
    users: int = 0,
    setting: Setting = SETTINGS["cpu"],
    kind: str = "long",
    prefill_replicas: int = REPLICAS // 2,
) -> Result:
    vt = VirtualTime()
    profile = setting.profile(kind)
    if arm == "unified":
        prefill, decode = None, Pool([f"u{i}" for i in range(REPLICAS)], vt, profile)
    else:
        prefill = Pool([f"p{i}" for i in range(prefill_replicas)], vt, profile)
        decode = Pool([f"d{i}" for i in range(REPLICAS - prefill_replicas)], vt, profile)
    pools = [p for p in (prefill, decode) if p is not None]
    for p in pools:
        for e in p.engines.values():
            await e.start()
    res = Result()
    finished = [0]

    def choice(job: Job) -> PdChoice:
        if prefill is None:
            return PdChoice("local", "mode", len(job.tokens))
        return decide(
            mode="always" if arm == "pd-always" else "auto",
            prompt_tokens=len(job.tokens),
            cached_tokens=0,
            min_uncached_tokens=THRESHOLD,
            prefill_in_flight=list(prefill.in_flight.values()),
            max_prefill_in_flight=setting.max_prefill_in_flight,
            decode_in_flight=list(decode.in_flight.values()),
            max_decode_in_flight=setting.max_decode_in_flight,
        )

    async def one(job: Job) -> None:
        req = GenerationRequest(job.rid, job.tokens, SamplingOptions(ignore_eos=True), job.out)
        start = vt.now

        def start_prefill() -> asyncio.Task[KvHandoff]:
            assert prefill is not None
            name = prefill.pick()
            prefill.in_flight[name] += 1

            async def leg() -> KvHandoff:
                try:
                    return await prefill.engines[name].prefill(req)
                finally:
                    prefill.in_flight[name] -= 1

            return asyncio.ensure_future(leg())

        placed: list[str] = []

        def start_decode(handoff: KvHandoff | None) -> _Leg:
            name = decode.pick()
            decode.in_flight[name] += 1
            placed.append(name)
            return _Leg(decode.engines[name].generate(
                GenerationRequest(req.request_id + "-d", req.prompt_token_ids, req.sampling,
                                  req.max_tokens, handoff=handoff)))  # fmt: skip

        s = PdStream(choice(job), start_prefill, start_decode, prefill_deadline_s=3600,
                     transfer_deadline_s=3600, sleep=vt.sleep, clock=vt)  # fmt: skip
        first = await s.__anext__()
        t_first, n = vt.now, first.num_new_tokens
        last = first
        while last.finish_reason is None:
            last = await s.__anext__()
            n += last.num_new_tokens
        decode.in_flight[placed[-1]] -= 1
        res.ttft.append(t_first - start)
        if n > 1:
            res.tpot.append((vt.now - t_first) / (n - 1))
        res.remote += s.outcome.served == "remote"
        res.reasons[s.outcome.reason] = res.reasons.get(s.outcome.reason, 0) + 1
        finished[0] += 1

    if arrivals is not None:
        tasks: list[asyncio.Task[None]] = []

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
    await vt.run(lambda: finished[0] >= len(jobs))
    await feeder
    res.done, res.span_s = finished[0], vt.now
    for p in pools:
        for e in p.engines.values():
            res.transfer_s += e.stats().extra.get("kv_transfer_seconds_total", 0.0)
            await e.shutdown()
    return res


def unloaded_ttft(n_in: int, p: SimulationProfile = _CPU) -> float:
    return p.prefill_base_s + p.prefill_s_per_token * n_in + p.decode_base_s + p.decode_s_per_seq


def figures(r: Result, ttft_slo: float, tpot_slo: float = 0.15) -> dict[str, Any]:
    good = sum(
        1 for t, o in zip(r.ttft, r.tpot, strict=False) if t <= ttft_slo and o <= tpot_slo
    )
    return {
        "requests": r.done,
        "ttft_p50_s": percentile(r.ttft, 50), "ttft_p90_s": percentile(r.ttft, 90),
        "tpot_p50_s": percentile(r.tpot, 50), "tpot_p90_s": percentile(r.tpot, 90),
        "throughput_rps": r.done / r.span_s if r.span_s else 0.0,
        "goodput_rps": good / r.span_s if r.span_s else 0.0,
        "slo_attainment": good / r.done if r.done else 0.0,
        "remote_share": r.remote / r.done if r.done else 0.0,
        "reasons": r.reasons,
        "mean_transfer_s": r.transfer_s / r.remote if r.remote else None,
    }  # fmt: skip


def run(quick: bool, setting: Setting, prefill_replicas: int = REPLICAS // 2) -> dict[str, Any]:
    n = setting.requests // 4 if quick else setting.requests
    users = min(setting.users, n // 3) if quick else setting.users  # quick: a smoke run
    doc: dict[str, Any] = {"benchmark": "pd-disagg", "simulated": True, "replicas": REPLICAS,
                           "setting": setting.name, "calibration": setting.calibration,
                           "requests": n, "loads": list(LOADS), "threshold": THRESHOLD,
                           "users": users, "prefill_replicas": prefill_replicas,
                           "max_prefill_in_flight": setting.max_prefill_in_flight,
                           "max_decode_in_flight": setting.max_decode_in_flight,
                           "tpot_slo_s": setting.tpot_slo_s, "ttft_slo_x": TTFT_SLO_X,
                           "profiles": {k: p.model_dump() for k, p in setting.profiles.items()},
                           "workloads": {}}  # fmt: skip
    for kind, (n_in, n_out) in WORKLOADS.items():
        jobs = workload(kind, n, seed=7)
        cap_res = asyncio.run(serve("unified", jobs, None, users, setting, kind))
        cap = cap_res.done / cap_res.span_s
        ttft_slo = TTFT_SLO_X * unloaded_ttft(n_in, setting.profile(kind))
        print(f"[pd] {kind}: unified capacity {cap:.2f} req/s simulated, TTFT SLO "
              f"{ttft_slo:.2f} s", flush=True)  # fmt: skip
        w: dict[str, Any] = {"in": n_in, "out": n_out, "capacity_rps": cap,
                             "ttft_slo_s": ttft_slo, "arms": {}}  # fmt: skip
        for arm in ARMS:
            w["arms"][arm] = {}
            for load in LOADS:
                times = arrivals("poisson", load * cap, n, seed=11)
                res = asyncio.run(serve(arm, jobs, times, 0, setting, kind, prefill_replicas))
                out = figures(res, ttft_slo, setting.tpot_slo_s)
                w["arms"][arm][str(load)] = out
                print(f"[pd] {kind} {load}× {arm}: goodput {out['goodput_rps']:.2f}/s, TTFT "
                      f"p90 {out['ttft_p90_s']:.2f}s, TPOT p90 {out['tpot_p90_s']:.3f}s, remote "
                      f"{out['remote_share']:.0%}", flush=True)  # fmt: skip
        doc["workloads"][kind] = w
    return doc


def verdicts(doc: dict[str, Any]) -> list[str]:
    """Per workload and load: the rule's goodput against the better fixed choice."""
    out = []
    for kind, w in doc["workloads"].items():
        for load in doc["loads"]:
            g = {arm: w["arms"][arm][str(load)]["goodput_rps"] for arm in ARMS}
            best = max(g["unified"], g["pd-always"])
            ratio = g["pd-auto"] / best if best else 1.0
            out.append(f"| {kind} | {load}× | {g['unified']:.2f} | {g['pd-always']:.2f} | "
                       f"{g['pd-auto']:.2f} | {ratio:.2f} |")  # fmt: skip
    return out


def findings(doc: dict[str, Any]) -> list[str]:
    """Per workload: where always-disaggregate matches the unified pool on goodput,
    what it does to TPOT, and how far the rule is from the better fixed choice."""
    out = []
    for kind, w in doc["workloads"].items():
        a = {x: w["arms"]["pd-always"][str(x)] for x in doc["loads"]}
        u = {x: w["arms"]["unified"][str(x)] for x in doc["loads"]}
        r = {x: w["arms"]["pd-auto"][str(x)] for x in doc["loads"]}
        even = [x for x in doc["loads"] if a[x]["goodput_rps"] >= 0.95 * u[x]["goodput_rps"]]
        top = doc["loads"][-1]
        worst = min(r[x]["goodput_rps"] / max(u[x]["goodput_rps"], a[x]["goodput_rps"], 1e-9)
                    for x in doc["loads"])  # fmt: skip
        out.append(
            f"- **{kind}** ({w['in']}:{w['out']}): always-disaggregate keeps the unified "
            f"pool's goodput (within 5 %) at {', '.join(f'{x}×' for x in even) or 'no load'}; "
            f"at {top}× its goodput is {a[top]['goodput_rps']:.2f} against "
            f"{u[top]['goodput_rps']:.2f} req/s, TPOT p90 {a[top]['tpot_p90_s']:.3f} against "
            f"{u[top]['tpot_p90_s']:.3f} s. The rule's goodput is at least {worst:.2f}× the "
            f"better fixed choice at every load."
        )
    return out


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if doc["setting"] == "cpu" else "-" + doc["setting"]
    split = doc.get("prefill_replicas", REPLICAS // 2)
    if split != REPLICAS // 2:
        suffix += f"-{split}p{REPLICAS - split}d"
    stem = out / f"pd-disagg-{doc['date'][:10]}{suffix}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    kinds = list(doc["workloads"])
    fig, axes = plt.subplots(len(kinds), 3, figsize=(15, 4 * len(kinds)), squeeze=False)
    for row, kind in enumerate(kinds):
        w = doc["workloads"][kind]
        for arm in ARMS:
            pts = [w["arms"][arm][str(x)] for x in doc["loads"]]
            axes[row][0].plot(doc["loads"], [p["goodput_rps"] for p in pts], "o-", label=arm)
            axes[row][1].plot(doc["loads"], [p["ttft_p90_s"] for p in pts], "o-", label=arm)
            axes[row][2].plot(doc["loads"], [p["tpot_p90_s"] for p in pts], "o-", label=arm)
        for ax, title in zip(axes[row], ("goodput (req/s)", "TTFT p90 (s, log)",
                                         "TPOT p90 (s)"), strict=True):  # fmt: skip
            ax.set_title(f"{kind} ({w['in']}:{w['out']}): {title}")
            ax.set_xlabel("load (× unified capacity)")
        axes[row][1].set_yscale("log")
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    p = doc["profiles"]["long"]
    lines = [
        "# Prefill/decode disaggregation on a simulated pool (virtual time)",
        "",
        f"`python -m benchmarks.pd_disagg --setting {doc['setting']}` — {REPLICAS} "
        f"simulated engines per arm (P/D arms: {split} prefill + {REPLICAS - split} decode), "
        f"calibrated on {doc['calibration']}; "
        f"{doc['requests']} requests per workload, arm and load, the same seeded stream for "
        f"every arm; capacity from a closed loop of {doc['users']} users. Rule: remote when "
        f"≥ {doc['threshold']} uncached tokens (or every decode replica has ≥ "
        f"{doc['max_decode_in_flight']} in flight) and a prefill replica has < "
        f"{doc['max_prefill_in_flight']} legs in flight. SLOs: TTFT ≤ {doc['ttft_slo_x']}× "
        f"the unloaded TTFT, TPOT ≤ {doc['tpot_slo_s']} s. Hand-off model: "
        f"{p['transfer_base_s']} s + {p['kv_bytes_per_token']} bytes per token at "
        f"{p['transfer_bytes_per_s'] / 1e9:.1f} GB/s. Wall time {doc['wall_s']:.0f} s.",
        "",
    ]
    for kind, w in doc["workloads"].items():
        lines += [
            f"## {kind}: {w['in']} tokens in, {w['out']} out",
            "",
            f"Unified capacity {w['capacity_rps']:.2f} req/s (simulated); TTFT SLO "
            f"{w['ttft_slo_s']:.2f} s.",
            "",
            "| load | arm | goodput (req/s) | SLO met | TTFT p50 | TTFT p90 | TPOT p50 | "
            "TPOT p90 | throughput | remote | reasons |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for x in doc["loads"]:
            for arm in ARMS:
                r = w["arms"][arm][str(x)]
                reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items()))
                lines.append(
                    f"| {x}× | {arm} | {_f(r['goodput_rps'])} | {r['slo_attainment']:.0%} | "
                    f"{_f(r['ttft_p50_s'])} | {_f(r['ttft_p90_s'])} | {_f(r['tpot_p50_s'], 3)} | "
                    f"{_f(r['tpot_p90_s'], 3)} | {_f(r['throughput_rps'])} | "
                    f"{r['remote_share']:.0%} | {reasons} |"
                )
        lines.append("")
    lines += ["## When disaggregation pays here", "", *findings(doc), ""]
    lines += [
        "## The rule against the better fixed choice",
        "",
        "| workload | load | unified | pd-always | pd-auto | pd-auto ÷ better fixed |",
        "|---|---|---|---|---|---|",
        *verdicts(doc),
        "",
        f"![goodput, TTFT, TPOT]({stem.name}.png)",
        "",
    ]
    Path(f"{stem}.md").write_text("\n".join(lines))
    return Path(f"{stem}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prefill-replicas", type=int, default=REPLICAS // 2,
                        help=f"of the {REPLICAS} replicas of the P/D arms")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    a = parser.parse_args()
    started = time.monotonic()
    if not 0 < a.prefill_replicas < REPLICAS:
        parser.error(f"--prefill-replicas: 1 to {REPLICAS - 1}")
    doc = run(a.quick, SETTINGS[a.setting], a.prefill_replicas)
    doc["wall_s"] = time.monotonic() - started
    doc["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"wrote {write(doc, a.out)}")


if __name__ == "__main__":
    main()
