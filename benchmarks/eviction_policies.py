"""Prefix-cache eviction policies on one simulated engine, in virtual time (issue 32,
experiment 6; seed 003 §3.4): which cached prefixes to give up, and what that does to
each tenant class's hit rate and TTFT.

    .venv/bin/python -m benchmarks.eviction_policies [--quick] [--out DIR]

Engine: one calibrated simulated engine (SmolLM2 on this CPU, docs/benchmarks/simulated-
engine-calibration.md: prefill 1.5 ms per uncached prompt token, no chunked prefill,
128-token blocks), its prefix cache ``CAPACITIES`` blocks large, on one virtual clock
(``app.bench.virtual_time``): the same seeded stream for every policy and capacity.

Traffic, every tenant with its own cache salt (the gateway's default isolation):
* ``paid``: ``PAID_TENANTS`` agent tenants, each with a ``PAID_SYSTEM``-token system
  prompt shared by all its sessions; sessions of ``CALLS`` chained calls (each after the
  previous one's answer and ``THINK_S`` of tool time) over a growing context: system +
  ``TASK`` task tokens + per earlier call ``OUTPUT`` answer + ``TOOL`` tool-result tokens.
* ``free``: ``FREE_TENANTS`` tenants, each a ``FREE_SYSTEM``-token system prompt and a
  distinct ``FREE_BODY``-token body per request.
* ``doc``: one-off ``DOC``-token documents plus a ``QUESTION``-token question (2 free-
  tier tenants; never reused).
Poisson arrivals for ``DURATION_S`` simulated seconds at the rates below, ``OUTPUT``
tokens out (ignore_eos). Paid salts are the engine's ``eviction_paid_salts``.

Policies (app/engine/simulated_eviction.py): lru (vLLM's rule), largest_first,
cheapest_recompute_first, paid_first, and the seed's weighted score at three weight
settings. Per policy × capacity: token-weighted prefix hit rate overall and per class,
the same for requests arriving in "busy" windows only (the ``BUSY_SHARE`` of
``WINDOW_S``-second windows with the most prompt tokens offered, from the schedule, so
the same windows for every arm: where the TTFT tail comes from), TTFT p50/p95 per class (arrival
at the engine to first token), evictions, the engine's busy share. Writes
eviction-policies-<date>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.metadata import collect_metadata
from app.bench.metrics import percentile
from app.bench.virtual_time import VirtualTime
from app.engine.protocol import GenerationRequest, SamplingOptions
from app.engine.simulated import SimulatedEngine, SimulationProfile
from app.engine.simulated_eviction import EvictionName, EvictionWeights

SEED = 32006
VOCAB = 49152
PAID_TENANTS, PAID_SYSTEM, TASK, TOOL, CALLS, THINK_S = 4, 1024, 128, 160, 4, 2.0
FREE_TENANTS, FREE_SYSTEM, FREE_BODY = 16, 256, 384
DOC_TENANTS, DOC, QUESTION = 2, 1536, 64
OUTPUT = 48
SESSION_RATE, FREE_RATE, DOC_RATE = 0.04, 0.35, 0.03  # per simulated second
DURATION_S = 900.0
CAPACITIES = (16, 32, 64, 256)  # prefix-cache blocks of 128 tokens
CLASSES = ("paid", "free", "doc")
WINDOW_S, BUSY_SHARE = 60.0, 0.25  # busy windows: the quarter with most tokens offered
# (arm name, policy, weights of the weighted score: idle, size, recompute⁻¹, priority⁻¹)
ARMS: tuple[tuple[str, EvictionName, tuple[float, float, float, float] | None], ...] = (
    ("lru", "lru", None),
    ("largest_first", "largest_first", None),
    ("cheapest_recompute_first", "cheapest_recompute_first", None),
    ("paid_first", "paid_first", None),
    ("weighted seed .40/.25/.20/.15", "weighted", (0.40, 0.25, 0.20, 0.15)),
    ("weighted priority .30/.10/.10/.50", "weighted", (0.30, 0.10, 0.10, 0.50)),
    ("weighted size .20/.60/.00/.20", "weighted", (0.20, 0.60, 0.0, 0.20)),
)


def salt(cls: str, k: int) -> str:
    return f"tenant-{cls}-{k}"


@dataclass(frozen=True)
class Call:
    rid: str
    cls: str
    tokens: tuple[int, ...]
    salt: str


@dataclass(frozen=True)
class Flow:
    """One arrival: a single request, or a paid session's chained calls."""

    at: float
    calls: tuple[Call, ...]


def traffic(seed: int, duration_s: float) -> list[Flow]:
    rng = random.Random(seed)

    def toks(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, VOCAB) for _ in range(n))

    def arrivals(rate: float) -> list[float]:
        t, out = rng.expovariate(rate), []
        while t < duration_s:
            out.append(t)
            t += rng.expovariate(rate)
        return out

    paid_sys = [toks(PAID_SYSTEM) for _ in range(PAID_TENANTS)]
    free_sys = [toks(FREE_SYSTEM) for _ in range(FREE_TENANTS)]
    flows: list[Flow] = []
    for s, at in enumerate(arrivals(SESSION_RATE)):
        k = rng.randrange(PAID_TENANTS)
        context = paid_sys[k] + toks(TASK)
        calls = []
        for c in range(CALLS):
            calls.append(Call(f"p{s}-{c}", "paid", context, salt("paid", k)))
            context += toks(OUTPUT + TOOL)
        flows.append(Flow(at, tuple(calls)))
    for i, at in enumerate(arrivals(FREE_RATE)):
        k = rng.randrange(FREE_TENANTS)
        call = Call(f"f{i}", "free", free_sys[k] + toks(FREE_BODY), salt("free", k))
        flows.append(Flow(at, (call,)))
    for i, at in enumerate(arrivals(DOC_RATE)):
        k = rng.randrange(DOC_TENANTS)
        flows.append(Flow(at, (Call(f"d{i}", "doc", toks(DOC + QUESTION), salt("doc", k)),)))
    return sorted(flows, key=lambda f: f.at)


@dataclass
class ClassResult:
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    busy: list[tuple[int, int]] = field(default_factory=list)  # (prompt, cached) tokens


def profile(
    capacity: int, policy: EvictionName, weights: tuple[float, ...] | None
) -> SimulationProfile:
    extra: dict[str, Any] = {}
    if weights is not None:
        names = ("idle", "size", "recompute_inverse", "priority_inverse")
        extra["eviction_weights"] = EvictionWeights(**dict(zip(names, weights, strict=True)))
    return SimulationProfile(
        prefix_cache_blocks=capacity, max_model_len=4096, eos_probability=0.0,
        max_waiting=100_000, eviction=policy,
        eviction_paid_salts=frozenset(salt("paid", k) for k in range(PAID_TENANTS)), **extra,
    )  # fmt: skip


def busy_windows(flows: list[Flow]) -> set[int]:
    """Indexes of the ``WINDOW_S`` windows (by flow arrival) with the most prompt tokens
    offered: the top ``BUSY_SHARE`` of them."""
    offered: dict[int, int] = {}
    for f in flows:
        k = int(f.at // WINDOW_S)
        offered[k] = offered.get(k, 0) + sum(len(c.tokens) for c in f.calls)
    top = sorted(offered, key=lambda k: -offered[k])
    return set(top[: max(1, round(BUSY_SHARE * len(top)))])


async def serve(flows: list[Flow], prof: SimulationProfile) -> dict[str, Any]:
    vt = VirtualTime()
    engine = SimulatedEngine(prof, clock=vt, sleep=vt.sleep)
    await engine.start()
    res = {c: ClassResult() for c in CLASSES}
    total = sum(len(f.calls) for f in flows)
    finished = [0]
    busy = busy_windows(flows)

    async def one(call: Call) -> None:
        start, first = vt.now, None
        deep, counted = int(start // WINDOW_S) in busy, False
        gen = GenerationRequest(call.rid, call.tokens, SamplingOptions(ignore_eos=True),
                                OUTPUT, cache_salt=call.salt)  # fmt: skip
        r = res[call.cls]
        async for d in engine.generate(gen):
            if d.prompt_tokens and not counted:  # every delta repeats the prompt's counts
                counted = True
                r.prompt_tokens += d.prompt_tokens
                r.cached_tokens += d.cached_prompt_tokens
                if deep:
                    r.busy.append((d.prompt_tokens, d.cached_prompt_tokens))
            if d.num_new_tokens and first is None:
                first = vt.now
        assert first is not None
        r.ttft.append(first - start)
        finished[0] += 1

    async def flow(f: Flow) -> None:
        for k, call in enumerate(f.calls):
            if k:
                await vt.sleep(THINK_S)
            await one(call)

    tasks: list[asyncio.Task[None]] = []

    async def arrive() -> None:
        for f in flows:
            await vt.sleep(f.at - vt.now)
            tasks.append(asyncio.ensure_future(flow(f)))

    feeder = asyncio.ensure_future(arrive())
    await vt.run(lambda: finished[0] >= total)
    await feeder
    extra = engine.stats().extra
    await engine.shutdown()
    prompt = sum(r.prompt_tokens for r in res.values())
    cached = sum(r.cached_tokens for r in res.values())
    out: dict[str, Any] = {
        "requests": finished[0],
        "hit_rate": cached / prompt if prompt else 0.0,
        "evictions": int(extra["prefix_cache_evictions"]),
        "span_s": vt.now,
        "busy_share": extra["busy_s"] / vt.now if vt.now else 0.0,
    }
    for c, r in res.items():
        busy_prompt = sum(p for p, _ in r.busy)
        out[c] = {
            "requests": len(r.ttft),
            "hit_rate": r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0,
            "busy_requests": len(r.busy),
            "busy_hit_rate": sum(k for _, k in r.busy) / busy_prompt if busy_prompt else None,
            "ttft_p50_s": percentile(r.ttft, 50),
            "ttft_p95_s": percentile(r.ttft, 95),
        }
    return out


def run(quick: bool) -> dict[str, Any]:
    duration = DURATION_S / 3 if quick else DURATION_S
    flows = traffic(SEED, duration)
    doc: dict[str, Any] = {"duration_s": duration, "capacities": list(CAPACITIES), "runs": {}}
    doc["offered"] = {c: sum(1 for f in flows for x in f.calls if x.cls == c) for c in CLASSES}
    doc["busy_windows_start_s"] = sorted(k * WINDOW_S for k in busy_windows(flows))
    for name, policy, weights in ARMS:
        for cap in CAPACITIES:
            out = asyncio.run(serve(flows, profile(cap, policy, weights)))
            doc["runs"].setdefault(name, {})[str(cap)] = out
            print(
                f"[eviction] {name:34s} {cap:4d} blocks: hit {out['hit_rate']:.3f} "
                + " ".join(f"{c} {out[c]['hit_rate']:.2f}/{out[c]['ttft_p95_s']:.2f}s"
                           for c in CLASSES)
                + f" evictions {out['evictions']} busy {out['busy_share']:.2f}",
                flush=True,
            )  # fmt: skip
    return doc


def inversions(
    doc: dict[str, Any], min_hit: float = 0.01, min_ratio: float = 1.1
) -> list[dict[str, Any]]:
    """Pairs at one capacity where arm A has the higher overall hit rate (by ``min_hit``)
    and yet a class's TTFT p95 ``min_ratio`` × B's or worse; the largest ratios first."""
    out = []
    for cap in doc["capacities"]:
        runs = {name: by_cap[str(cap)] for name, by_cap in doc["runs"].items()}
        for a, ra in runs.items():
            for b, rb in runs.items():
                if ra["hit_rate"] < rb["hit_rate"] + min_hit:
                    continue
                for c in CLASSES:
                    pa, pb = ra[c]["ttft_p95_s"], rb[c]["ttft_p95_s"]
                    if pa is not None and pb and pa >= min_ratio * pb:
                        out.append({"capacity": cap, "higher_hit": a, "lower_hit": b,
                                    "class": c, "hit": (ra["hit_rate"], rb["hit_rate"]),
                                    "class_hit": (ra[c]["hit_rate"], rb[c]["hit_rate"]),
                                    "p95": (pa, pb), "ratio": pa / pb})  # fmt: skip
    return sorted(out, key=lambda x: -x["ratio"])


def findings(doc: dict[str, Any]) -> list[str]:
    """Headline lines computed from the run (no hand-typed numbers)."""
    caps = [str(c) for c in doc["capacities"]]
    lru = doc["runs"]["lru"]
    per_cap = [
        f"{c} blocks {lru[c]['hit_rate']:.3f} / {lru[c]['paid']['hit_rate']:.2f} / "
        f"{lru[c]['free']['hit_rate']:.2f}, {_f(lru[c]['paid']['ttft_p95_s'])} s / "
        f"{_f(lru[c]['free']['ttft_p95_s'])} s"
        for c in caps
    ]
    lines = [
        "## Computed from this run",
        "",
        "Where the cache runs out (lru, the real engine's rule): hit rate all / paid / free, "
        "TTFT p95 paid / free, by capacity: " + "; ".join(per_cap) + ".",
        "",
    ]
    for c in caps:
        runs = {name: by_cap[c] for name, by_cap in doc["runs"].items()}
        parts = [f"all hit: {max(runs, key=lambda n: runs[n]['hit_rate'])}"]
        for cls in CLASSES:
            best = min(runs, key=lambda n: runs[n][cls]["ttft_p95_s"] or float("inf"))
            parts.append(f"{cls} p95: {best} ({_f(runs[best][cls]['ttft_p95_s'])} s vs lru "
                         f"{_f(runs['lru'][cls]['ttft_p95_s'])} s)")  # fmt: skip
        lines.append(f"* {c} blocks — best " + "; ".join(parts) + ".")
    inv = inversions(doc)
    lines += ["", f"Higher overall hit rate with a worse class TTFT p95 (≥ 1.1×, hit ≥ +0.01): "
              f"{len(inv)} policy pairs; the largest:", ""]  # fmt: skip
    for x in inv[:8]:
        lines.append(
            f"* {x['capacity']} blocks, {x['class']}: {x['higher_hit']} hit {x['hit'][0]:.3f} "
            f"({x['class']} {x['class_hit'][0]:.2f}) p95 {x['p95'][0]:.2f} s vs {x['lower_hit']} "
            f"hit {x['hit'][1]:.3f} ({x['class']} {x['class_hit'][1]:.2f}) p95 {x['p95'][1]:.2f} s"
        )
    doc["inversions"] = inv
    return lines


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def metadata(doc: dict[str, Any]) -> dict[str, Any]:
    return collect_metadata(
        model_info={"id": "simulated/smollm2-135m-cpu2 (calibrated timing model, no weights)"},
        engine="switchyard SimulatedEngine in virtual time (app.bench.virtual_time)",
        engine_version=None,
        dataset=f"synthetic seeded token ids, seed {SEED} (benchmarks/eviction_policies.py)",
        input_lengths=(
            f"paid: {PAID_SYSTEM}+{TASK}+k·{OUTPUT + TOOL} (k=0..{CALLS - 1}); free: "
            f"{FREE_SYSTEM}+{FREE_BODY}; doc: {DOC}+{QUESTION}"
        ),
        output_lengths=f"{OUTPUT} tokens (ignore_eos)",
        concurrency=(
            f"open loop, Poisson: paid sessions {SESSION_RATE}/s ({CALLS} chained calls, "
            f"{THINK_S} s tool time), free {FREE_RATE}/s, doc {DOC_RATE}/s"
        ),
        warmup="none (cold cache at t=0, the same for every arm)",
        duration=f"{doc['duration_s']:.0f} s of simulated arrivals per run, then drained",
        sampling={"temperature": "n/a (simulated)", "max_tokens": OUTPUT, "ignore_eos": True},
        extra={
            "rerun": "python -m benchmarks.eviction_policies"
            + (" --quick" if doc.get("quick") else ""),
            "capacities_blocks": list(CAPACITIES),
            "block_size_tokens": 128,
            "arms": [
                {"name": n, "policy": p, "weights_idle_size_recompute_priority": w}
                for n, p, w in ARMS
            ],
            "tenants": {"paid": PAID_TENANTS, "free": FREE_TENANTS, "doc": DOC_TENANTS},
            "wall_s": doc.get("wall_s"),
        },
    )


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"eviction-policies-{doc['metadata']['date'][:10]}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    caps = [str(c) for c in doc["capacities"]]
    xs = [int(c) for c in caps]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    panels = [
        (0, 0, None, "hit_rate", "hit rate, all prompt tokens"),
        (0, 1, "paid", "hit_rate", "hit rate, paid (agent sessions)"),
        (0, 2, "free", "hit_rate", "hit rate, free"),
        (1, 0, "paid", "ttft_p95_s", "TTFT p95 (s), paid"),
        (1, 1, "free", "ttft_p95_s", "TTFT p95 (s), free"),
        (1, 2, "doc", "ttft_p95_s", "TTFT p95 (s), one-off documents"),
    ]
    for row, col, cls, key, title in panels:
        ax = axes[row][col]
        for name in doc["runs"]:
            runs = [doc["runs"][name][c] for c in caps]
            ys = [(r if cls is None else r[cls])[key] for r in runs]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, caps)
        ax.set_title(title)
        ax.set_xlabel("prefix cache (128-token blocks)")
        if key == "ttft_p95_s":
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Eviction policies, one simulated engine, virtual time (same seeded traffic)")
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=100)
    plt.close(fig)
    Path(f"{stem}.md").write_text("\n".join(report_lines(doc, stem.name)))
    return Path(f"{stem}.md")


def report_lines(doc: dict[str, Any], stem: str) -> list[str]:
    meta = doc["metadata"]
    offered = doc["offered"]
    lines = [
        "# KV-cache eviction policies on the simulated engine (virtual time)",
        "",
        f"`{meta['rerun']}` — issue 32, experiment 6 (seed 003 §3.4). One calibrated "
        "simulated engine (SmolLM2-135M on the vLLM CPU engine: 1.5 ms per uncached prompt "
        "token, no chunked prefill, 128-token blocks); only its prefix cache's victim choice "
        f"differs between arms. {doc['duration_s']:.0f} s of seeded arrivals per run: "
        f"{offered['paid']} paid agent calls ({PAID_TENANTS} tenants, {PAID_SYSTEM}-token "
        f"system prompts, sessions of {CALLS} chained calls over a growing context), "
        f"{offered['free']} free requests ({FREE_TENANTS} tenants, {FREE_SYSTEM}-token system "
        f"prompt + {FREE_BODY} distinct tokens), {offered['doc']} one-off {DOC}-token "
        f"documents; {OUTPUT} tokens out. Every tenant has its own cache salt. Simulated "
        "numbers: the engine model, not a GPU. Busy windows (the quarter of "
        f"{WINDOW_S:.0f}-s windows with the most prompt tokens offered, the same for every "
        f"arm) start at {', '.join(f'{t:.0f}' for t in doc['busy_windows_start_s'])} s.",
        "",
        "Policies (app/engine/simulated_eviction.py): every eviction frees ONE tail block "
        "of the chain the policy picks (vLLM frees tail-first; a shortened chain still hits "
        "on its prefix). `lru`: least recently used tail (vLLM). `largest_first`: tail of "
        "the longest chain. `cheapest_recompute_first`: tail of the chain cheapest to "
        "prefill again (linear prefill model: the shortest). `paid_first`: LRU among free-"
        "tier chains, a paid chain only when none is left. `weighted`: highest "
        "w_idle·idle + w_size·size + w_rc·(1−recompute) + w_prio·(1−priority), each term "
        "min-max normalised over the current tails; weights as (idle, size, recompute⁻¹, "
        "priority⁻¹).",
        "",
    ]
    lines += doc.get("findings", [])
    for cap in doc["capacities"]:
        lines += [
            "", f"## Prefix cache {cap} blocks ({cap * 128} tokens)", "",
            "| policy | hit all | hit paid | hit free | hit paid / free in busy windows "
            "(requests) | TTFT p50/p95 paid (s) | TTFT p50/p95 free (s) | "
            "TTFT p50/p95 doc (s) | evictions | engine busy |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for name, by_cap in doc["runs"].items():
            r = by_cap[str(cap)]
            cells = [f"{_f(r[c]['ttft_p50_s'])} / {_f(r[c]['ttft_p95_s'])}" for c in CLASSES]
            p, f = r["paid"], r["free"]
            busy = (
                f"{_f(p['busy_hit_rate'])} / {_f(f['busy_hit_rate'])} "
                f"({p['busy_requests']}; {f['busy_requests']})"
            )
            lines.append(
                f"| {name} | {_f(r['hit_rate'], 3)} | {_f(p['hit_rate'], 3)} | "
                f"{_f(f['hit_rate'], 3)} | {busy} | {' | '.join(cells)} | {r['evictions']} | "
                f"{_f(r['busy_share'])} |"
            )
    lines += ["", f"![hit rate and TTFT p95 per class vs capacity]({stem}.png)", "",
              "## Metadata", "", "```json", json.dumps(meta, indent=1), "```", ""]  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a third of the duration")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    a = parser.parse_args()
    started = time.monotonic()
    doc = run(a.quick)
    doc["quick"] = a.quick
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["metadata"] = metadata(doc)
    doc["findings"] = findings(doc)
    print(f"wrote {write(doc, a.out)}")


if __name__ == "__main__":
    main()
