"""LoRA adapters on the real vLLM CPU engine: what serving adapters costs the base, what
mixing 1, 4 and 16 adapters costs, and how long a cold load takes per adapter size.

    .venv/bin/python -m benchmarks.adapters_cpu [--quick] [--out DIR]

Engine: the embedded SmolLM2-135M-Instruct as serve_configs/local.yaml serves it
(float32, 1 GiB KV cache, 32 sequences), in-process through ``VLLMEngine``, one engine
at a time on this machine's CPUs. Two engines up side by side, one running at a time:
LoRA off, and LoRA on (``max_loras`` 4, ``max_cpu_loras`` 16, ``max_lora_rank`` 16).

Load: closed loop, ``CONCURRENCY`` streams, ``PROMPT`` distinct random prompt tokens
(no prefix-cache hits), ``OUTPUT`` tokens out (greedy, EOS ignored). Arms: the base on
the LoRA-off engine; on the LoRA-on engine the base, then 1, 4 and 16 adapters active
(requests spread round-robin over them; all loaded before the arm, so no cold load is
timed there). All five arms run ``ROUNDS`` times interleaved; figures pool the rounds.
Reported as ratios to the base on the LoRA-off engine (same run).

Cold loads: random-weight adapters (``app.models.lora``) of three sizes — rank 8 and 16
on q_proj/v_proj, rank 16 on all seven linear modules — each size ``COLD_REPEATS``
distinct adapters, each loaded by its first request: the engine's own load time
(``add_lora``) and that request's TTFT against a warm request's.

Writes adapters-cpu-<date>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.metadata import collect_metadata
from app.bench.metrics import percentile
from app.engine.lora import LoraSettings
from app.engine.protocol import Adapter, GenerationRequest, SamplingOptions
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.models.lora import build_random_lora
from benchmarks.serving_lib import prepared_model_dir

CONCURRENCY = 8
PROMPT, OUTPUT = 128, 64
ROUNDS = 2
ACTIVE = (0, 1, 4, 16)  # adapters active in an arm (0: the base alone)
COLD_REPEATS = 3
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SIZES = {
    "r8-qv": (8, ("q_proj", "v_proj")),
    "r16-qv": (16, ("q_proj", "v_proj")),
    "r16-all": (16, ALL_LINEAR),
}
LORA = LoraSettings(max_loras=4, max_cpu_loras=16, max_lora_rank=16)
NAME = "SmolLM2-135M-Instruct"


@dataclass
class Arm:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def figures(self) -> dict[str, Any]:
        return {
            "requests": len(self.ttft),
            "throughput_tok_s": self.tokens / self.seconds if self.seconds else 0.0,
            "ttft_p50_s": percentile(self.ttft, 50),
            "ttft_p90_s": percentile(self.ttft, 90),
        }


def engine(model_dir: Path, lora: LoraSettings | None) -> VLLMEngine:
    return VLLMEngine(
        VLLMEngineConfig(
            model_path=model_dir,
            served_name=NAME,
            dtype="float32",
            max_model_len=2048,
            kv_cache_memory_bytes=1024**3,
            max_num_seqs=32,
            lora=lora,
        )
    )


def prompts(n: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(1000, 40000) for _ in range(PROMPT)) for _ in range(n)]


async def one(
    eng: VLLMEngine,
    rid: str,
    ids: tuple[int, ...],
    adapter: Adapter | None,
    max_tokens: int = OUTPUT,
) -> tuple[float, int, float | None]:
    """(TTFT, output tokens, the engine's adapter load seconds) of one request."""
    sampling = SamplingOptions(temperature=0.0, ignore_eos=True)
    start, ttft, tokens, load = time.perf_counter(), None, 0, None
    async for d in eng.generate(GenerationRequest(rid, ids, sampling, max_tokens, adapter=adapter)):
        if d.adapter_load_s is not None:
            load = d.adapter_load_s
        if d.num_new_tokens and ttft is None:
            ttft = time.perf_counter() - start
        tokens += d.num_new_tokens
    assert ttft is not None
    return ttft, tokens, load


async def closed_loop(
    eng: VLLMEngine, arm: Arm, jobs: Sequence[tuple[str, tuple[int, ...], Adapter | None]]
) -> None:
    queue = list(reversed(jobs))

    async def user() -> None:
        while queue:
            rid, ids, adapter = queue.pop()
            ttft, tokens, _ = await one(eng, rid, ids, adapter)
            arm.ttft.append(ttft)
            arm.tokens += tokens

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(CONCURRENCY)))
    arm.seconds += time.perf_counter() - started


def _progress(msg: str) -> None:
    print(f"[adapters-cpu] {msg}", flush=True)


async def run(model_dir: Path, root: Path, quick: bool) -> dict[str, Any]:
    n = 16 if quick else 32
    rounds = 1 if quick else ROUNDS
    rid = itertools.count()
    adapters = [
        Adapter(f"{NAME}:a{i}", str(build_random_lora(root / f"a{i}", model_dir, seed=i)))
        for i in range(max(ACTIVE))
    ]
    cold: dict[str, list[dict[str, float]]] = {size: [] for size in SIZES}
    _progress("engines with LoRA off and on: starting (both stay up, one runs at a time)")
    off, on = engine(model_dir, None), engine(model_dir, LORA)
    try:
        for eng in (off, on):
            await eng.start()
            await closed_loop(eng, Arm(), [(f"w{next(rid)}", p, None) for p in prompts(8, 1)])
        for size, (rank, targets) in SIZES.items():
            for k in range(COLD_REPEATS if not quick else 1):
                path = build_random_lora(
                    root / f"{size}-{k}", model_dir, seed=1000 + k, rank=rank, targets=targets
                )
                adapter = Adapter(f"{NAME}:{size}-{k}", str(path))
                ids = prompts(1, 500 + k)[0]
                ttft_cold, _, load = await one(on, f"c{next(rid)}", ids, adapter, 1)
                ttft_warm, _, again = await one(on, f"c{next(rid)}", ids[::-1], adapter, 1)
                assert load is not None and again is None
                mb = (path / "adapter_model.safetensors").stat().st_size / 1e6
                cold[size].append(
                    {
                        "load_s": load,
                        "ttft_cold_s": ttft_cold,
                        "ttft_warm_s": ttft_warm,
                        "size_mb": mb,
                    }
                )
            _progress(
                f"cold load {size}: "
                f"{statistics.median(c['load_s'] for c in cold[size]) * 1000:.0f} ms"
            )
        for a in adapters:  # all held before the arms: no cold load in them
            await one(on, f"p{next(rid)}", prompts(1, 7)[0], a, 1)
        arms: dict[str, Arm] = {"base, LoRA off": Arm(), **{_arm(k): Arm() for k in ACTIVE}}
        for r in range(rounds):
            for name, eng, k in [("base, LoRA off", off, 0), *((_arm(k), on, k) for k in ACTIVE)]:
                ps = prompts(n, 200 + r)
                cycle: Iterator[Adapter | None] = (
                    itertools.cycle(adapters[:k]) if k else itertools.repeat(None)
                )
                jobs = [(f"r{next(rid)}", p, next(cycle)) for p in ps]
                await closed_loop(eng, arms[name], jobs)
                _progress(
                    f"{name}, round {r + 1}: {arms[name].figures()['throughput_tok_s']:.1f} tok/s"
                )
        held = on.stats().adapters
    finally:
        off.close()
        on.close()
    base = arms["base, LoRA off"].figures()
    figures = {}
    for name, arm in arms.items():
        f = arm.figures()
        f["throughput_ratio"] = f["throughput_tok_s"] / base["throughput_tok_s"]
        f["ttft_p50_ratio"] = f["ttft_p50_s"] / base["ttft_p50_s"]
        figures[name] = f
    return {
        "arms": figures,
        "cold": cold,
        "held_at_end": len(held),
        "rounds": rounds,
        "requests_per_round": n,
    }


def _arm(k: int) -> str:
    return "base, LoRA on" if k == 0 else f"{k} adapter{'s' if k > 1 else ''}"


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"adapters-cpu-{doc['metadata']['date'][:10]}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    names = list(doc["arms"])
    rows = [doc["arms"][n] for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].bar(names, [r["throughput_ratio"] for r in rows])
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_title("throughput ÷ base with LoRA off")
    axes[1].bar(
        [j - 0.2 for j in range(len(names))], [r["ttft_p50_s"] for r in rows], 0.4, label="p50"
    )
    axes[1].bar(
        [j + 0.2 for j in range(len(names))], [r["ttft_p90_s"] for r in rows], 0.4, label="p90"
    )
    axes[1].set_xticks(range(len(names)), names)
    axes[1].set_title("TTFT (s)")
    axes[1].legend()
    for size, runs in doc["cold"].items():
        axes[2].scatter(
            [r["size_mb"] for r in runs], [r["load_s"] * 1000 for r in runs], label=size
        )
    axes[2].set_xlabel("adapter file (MB)")
    axes[2].set_title("cold load (ms, engine add_lora)")
    axes[2].legend()
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    m = doc["metadata"]
    lines = [
        "# LoRA adapters on the vLLM CPU engine",
        "",
        f"`python -m benchmarks.adapters_cpu` — {m['model_id']} on vLLM {m['engine_version']} "
        f"(CPU, float32, 1 GiB KV), {m['cpu']}, {m['date']}, commit {m['git_commit'][:12]}. "
        f"Closed loop, {CONCURRENCY} streams, {PROMPT} distinct prompt tokens, {OUTPUT} out "
        f"(greedy, EOS ignored), {doc['requests_per_round']} requests per arm and round, "
        f"{doc['rounds']} interleaved rounds over both engines (LoRA on: "
        f"max_loras {LORA.max_loras}, max_cpu_loras {LORA.max_cpu_loras}, max_lora_rank "
        f"{LORA.max_lora_rank}). Random-weight adapters (app.models.lora), rank 8 on "
        "q_proj/v_proj, all loaded before the arms. Wall time "
        f"{doc['wall_s']:.0f} s.",
        "",
        "| arm | throughput (tok/s) | ÷ base, LoRA off | TTFT p50 (s) | TTFT p90 (s) |",
        "|---|---|---|---|---|",
    ]
    for name, r in doc["arms"].items():
        lines.append(
            f"| {name} | {r['throughput_tok_s']:.1f} | {r['throughput_ratio']:.2f} | "
            f"{r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} |"
        )
    lines += [
        "",
        "Cold loads (each a distinct adapter's first request, one at a time):",
        "",
        "| adapter | file (MB) | load median (ms) | load max (ms) | TTFT cold (ms) | "
        "TTFT warm (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for size, runs in doc["cold"].items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(
            f"| {size} | {med['size_mb']:.1f} | {med['load_s'] * 1000:.0f} | "
            f"{max(r['load_s'] for r in runs) * 1000:.0f} | "
            f"{med['ttft_cold_s'] * 1000:.0f} | {med['ttft_warm_s'] * 1000:.0f} |"
        )
    lines += ["", f"![throughput, TTFT, cold loads]({stem.name}.png)", ""]
    Path(f"{stem}.md").write_text("\n".join(lines))
    return Path(f"{stem}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    a = parser.parse_args()
    import vllm

    started = time.monotonic()
    model_dir = prepared_model_dir()
    with tempfile.TemporaryDirectory(prefix="adapters-") as tmp:
        doc = asyncio.run(run(model_dir, Path(tmp), a.quick))
    doc["wall_s"] = time.monotonic() - started
    doc["metadata"] = collect_metadata(
        model_info={"id": NAME, "root": model_dir.name},
        engine="vllm (CPU)",
        engine_version=vllm.__version__,
        dataset="random token ids (seeded)",
        input_lengths=f"{PROMPT} tokens",
        output_lengths=f"{OUTPUT} tokens",
        concurrency=f"closed loop, {CONCURRENCY}",
        warmup="8 requests per engine",
        duration=f"{doc['rounds']} rounds × {doc['requests_per_round']} requests per arm",
        sampling={"temperature": 0.0, "ignore_eos": True},
        extra={"lora": LORA.model_dump(), "simulated": False},
    )
    print(f"wrote {write(doc, a.out)}")


if __name__ == "__main__":
    main()
