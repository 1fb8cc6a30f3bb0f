"""`make run`'s default as a profile chosen by measurement (issue 32, item 5): dtype and
engine settings of the embedded SmolLM2 on the vLLM CPU engine, quality and speed.

    .venv/bin/python -m benchmarks.default_dtype [--quick] [--systems a,b,...]

One server at a time (the box has 2 cores), each started, asked the graded question set
(``benchmarks.quality_set``: greedy, 24 tokens, chat template), warmed up, loaded with
closed loops at concurrency 1 and 8 (64-token prompts, 32 output tokens, ``ignore_eos``;
``benchmarks.serving_compare``'s prompts, loads and load generator), and stopped:

- ``vllm-defaults``: ``vllm serve`` with vLLM's defaults (the checkpoint's bfloat16,
  torch.compile, 8192-token window, vLLM's batch sizes) and only what the CPU needs: the
  KV budget of make run's config;
- ``switchyard``: `make run`'s default, ``switchyard serve`` on serve_configs/local.yaml
  (``dtype: auto``, no LoRA, HAProxy in front; ``benchmarks.serving_tax``'s command);
- ``vllm-equal``: bare vLLM given make run's engine settings (what Switchyard's builder
  passes vLLM for local.yaml's SmolLM2 on this node: dtype, eager, window, KV, batch);
- ``vllm-equal-bf16``: the same in bfloat16 (the dtype alone, eager);
- ``vllm-defaults-fp32``: vLLM's defaults in float32 (the dtype alone, compiled).

Report: docs/benchmarks/default-profile-<date>[-quick].{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.bench.metrics import summarize
from app.bench.prompts import PromptFactory
from app.bench.records import RequestSpec
from benchmarks import quality_set
from benchmarks.report_files import write_report
from benchmarks.serving_lib import (
    MODEL_ID,
    OUT_DIR,
    REPO,
    WARMUP_REQUESTS,
    WARMUP_SEED,
    ChatTemplateCounter,
    Load,
    Server,
    _sigterm_as_exit,
    chat_requests,
    environment,
    loads,
    make_server,
    prepared_model_dir,
    run_load,
)
from benchmarks.serving_tax import stop, switchyard_server

LOCAL_YAML = REPO / "serve_configs" / "local.yaml"
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
METRICS = ("ttft", "itl", "e2e")
# Goals of issue 32 item 5: make run's default against `vllm serve`'s defaults.
GOAL_E2E_C1 = 1.15  # E2E p50 at concurrency 1, at most this multiple
GOAL_TOKS_C8 = 0.90  # output tokens/s at concurrency 8, at least this multiple


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    vllm_flags: tuple[str, ...] | None  # bare vLLM's flags; None: Switchyard (make run)


def make_run_engine() -> dict[str, Any]:
    """The vLLM engine arguments Switchyard's builder gives local.yaml's SmolLM2 here."""
    from app.builders import engine_config
    from app.config import AppArgs
    from app.engine.vllm_engine import VLLMEngineConfig, engine_args
    from app.settings import load_settings

    config = yaml.safe_load(LOCAL_YAML.read_text())
    args = AppArgs.model_validate(config["applications"][0]["args"])
    spec = next(m for m in args.models if m.id == MODEL_ID)
    engine = engine_config(spec, load_settings())
    assert isinstance(engine, VLLMEngineConfig)
    got = engine_args(engine)
    keys = "dtype max_model_len kv_cache_memory_bytes max_num_seqs enforce_eager"
    return {k: got.get(k) for k in (*keys.split(), "enable_prefix_caching", "enable_lora")}


def arms(engine: dict[str, Any]) -> dict[str, Arm]:
    kv = ("--kv-cache-memory-bytes", str(engine["kv_cache_memory_bytes"]))
    equal = (
        *kv,
        "--max-model-len",
        str(engine["max_model_len"]),
        "--max-num-seqs",
        str(engine["max_num_seqs"]),
        *(("--enforce-eager",) if engine["enforce_eager"] else ()),
        *(() if engine["enable_prefix_caching"] else ("--no-enable-prefix-caching",)),
    )
    if engine["enable_lora"]:
        raise SystemExit("local.yaml's SmolLM2 has a lora: block; this compares the base")
    return {
        a.name: a
        for a in (
            Arm("vllm-defaults", "vllm serve, vLLM's defaults (+ KV budget)", kv),
            Arm("switchyard", "make run's default (Switchyard, local.yaml)", None),
            Arm(
                "vllm-equal",
                f"bare vLLM, make run's settings ({engine['dtype']})",
                (*equal, "--dtype", engine["dtype"]),
            ),
            Arm(
                "vllm-equal-bf16",
                "bare vLLM, make run's settings in bfloat16",
                (*equal, "--dtype", "bfloat16"),
            ),
            Arm(
                "vllm-defaults-fp32", "vllm serve defaults in float32", (*kv, "--dtype", "float32")
            ),
        )
    }


def start(arm: Arm, model_dir: Path, log_dir: Path, haproxy: bool) -> Server:
    if arm.vllm_flags is None:
        server = switchyard_server(log_dir, haproxy=haproxy)
    else:  # serving_compare's bare vLLM command, its engine flags replaced by the arm's
        server = make_server("vllm", model_dir, log_dir)
        head = server.cmd[: server.cmd.index("--served-model-name") + 2]
        port = server.cmd[server.cmd.index("--host") :]
        server.cmd = [*head, *arm.vllm_flags, *port]
        server.name, server.log_path = arm.name, log_dir / f"{arm.name}.log"
    server.start()
    return server


def engine_seen(log: Path) -> dict[str, str]:
    """dtype and eager mode of the chat model's engine, as vLLM logged its config."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    line = next((ln for ln in text.splitlines() if "with config:" in ln and "smollm2" in ln), "")
    found = (re.search(rf"{k}=([\w.]+)", line) for k in ("dtype", "enforce_eager"))
    return {k: m.group(1) for k, m in zip(("dtype", "enforce_eager"), found, strict=True) if m}


def figures(records: list[Any]) -> dict[str, Any]:
    s = summarize(records)
    out: dict[str, Any] = {"requests": s["requests"], "errors": s["failed"]}
    for m in METRICS:
        out |= {f"{m}_p50": s[f"{m}_s"]["p50"], f"{m}_p95": s[f"{m}_s"]["p95"]}
    out["output_tok_per_s"] = s["output_throughput"] if s["duration_s"] > 0 else None
    return out


def bench_arm(
    arm: Arm,
    model_dir: Path,
    log_dir: Path,
    plan: list[Load],
    requests: dict[str, list[RequestSpec]],
    warmup: list[RequestSpec],
    haproxy: bool,
) -> dict[str, Any]:
    result: dict[str, Any] = {"label": arm.label, "loads": {}}
    print(f"== {arm.name}: {arm.label}", flush=True)
    server = start(arm, model_dir, log_dir, haproxy)
    result["command"] = server.cmd
    try:
        result["ready_s"] = round(server.wait_ready(600.0), 1)
        print(f"   ready in {result['ready_s']} s; the question set", flush=True)
        t0 = time.monotonic()
        result["engine_seen"] = engine_seen(server.log_path)
        result["quality"] = quality_set.ask(server.base_url, MODEL_ID)
        result["score"] = quality_set.score(result["quality"])
        n_ok = sum(r["correct"] for r in result["quality"])
        print(f"   quality {n_ok}/{len(result['quality'])} ({time.monotonic() - t0:.0f} s)")
        asyncio.run(
            run_load(arm.name, server.base_url, Load("warmup", "closed", 4, len(warmup), 0), warmup)
        )
        for load in plan:
            load_avg = round(os.getloadavg()[0], 2)
            recs = asyncio.run(run_load(arm.name, server.base_url, load, requests[load.name]))
            agg = {**figures(recs), "loadavg_1m_before": load_avg}
            result["loads"][load.name] = {"aggregate": agg, "records": [r.to_json() for r in recs]}
            print(
                f"   {load.name}: e2e p50 {_ms(agg['e2e_p50'])}, itl p50 {_ms(agg['itl_p50'])},"
                f" {_f(agg['output_tok_per_s'], 1)} tok/s, errors {agg['errors']}",
                flush=True,
            )
    except Exception as exc:  # recorded; the next arm still runs
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"   FAILED: {result['error']} (log {server.log_path})", flush=True)
    finally:
        stop(server)  # and what outlived its process group (Ray workers, HAProxy)
    return result


# --------------------------------------------------------------------------- report
def _agg(results: dict[str, Any], arm: str, load: str) -> dict[str, Any]:
    return results.get(arm, {}).get("loads", {}).get(load, {}).get("aggregate", {})


def ratio(results: dict[str, Any], num: str, den: str, load: str, key: str) -> float | None:
    a, b = _agg(results, num, load).get(key), _agg(results, den, load).get(key)
    return a / b if a is not None and b else None


# (name, numerator arm, denominator arm, what the ratio isolates)
COMPARISONS = (
    (
        "goal: make run default / vllm serve defaults",
        "switchyard",
        "vllm-defaults",
        "everything: gateway + engine settings",
    ),
    ("equal settings: make run default / bare vLLM", "switchyard", "vllm-equal", "the gateway"),
    ("dtype, eager: bf16 / fp32", "vllm-equal-bf16", "vllm-equal", "the dtype alone"),
    ("dtype, compiled: bf16 / fp32", "vllm-defaults", "vllm-defaults-fp32", "the dtype alone"),
    (
        "engine settings at fp32: make run's / vLLM's",
        "vllm-equal",
        "vllm-defaults-fp32",
        "eager vs torch.compile, window, batch sizes",
    ),
)


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for metric, load, limit, above in (
        ("e2e_p50", "concurrency-1", GOAL_E2E_C1, False),
        ("output_tok_per_s", "concurrency-8", GOAL_TOKS_C8, True),
    ):
        r = ratio(results, "switchyard", "vllm-defaults", load, metric)
        ok = None if r is None else (r >= limit if above else r <= limit)
        margin = None if r is None else (r / limit - 1) * 100
        row = dict(metric=metric, load=load, limit=limit, at_least=above, ratio=r, met=ok)
        rows.append({**row, "margin_pct": margin})
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


def _f(v: float | None, d: int = 2) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = doc["results"]
    names = [a for a in res if "error" not in res[a]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (
        ("E2E p50, concurrency 1 (ms)", "concurrency-1", "e2e_p50", 1e3),
        ("output tok/s, concurrency 8", "concurrency-8", "output_tok_per_s", 1.0),
    )
    for ax, (title, load, key, scale) in zip(axes, panels, strict=False):
        ax.bar(names, [(_agg(res, a, load).get(key) or 0) * scale for a in names])
        ax.set_title(title)
    axes[2].bar(names, [res[a].get("score", 0) * 100 for a in names])
    axes[2].set_title(f"question set: % correct of {len(quality_set.QUESTIONS)}")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any], image: str) -> str:
    env, res, eng = doc["environment"], doc["results"], doc["make_run_engine"]
    plan = [ld["name"] for ld in doc["loads"]]
    quick = " --quick" if doc["quick"] else ""
    loads_text = ", ".join(f"{ld['name']} ({ld['requests']} requests)" for ld in doc["loads"])
    lines = [
        f"# `make run`'s default profile, measured ({env['date']})",
        "",
        f"Commit `{env['git_commit']}`; {env['cpu_model']}, {env['cpu_count']} cores, "
        f"{env['ram_gib']} GiB; ISA flags {doc['isa_flags'] or 'none of ' + str(ISA_FLAGS)}; "
        f"`dtype: auto` here → **{doc['auto_dtype']}**; python {env['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + ". "
        f"Model {MODEL_ID} (sha256 `{(env.get('model') or {}).get('sha256')}`). "
        f"Loads: {loads_text}"
        f"{' (--quick: shorter loads)' if doc['quick'] else ''}; 64-token prompts (chat "
        "template included), 32 output tokens (ignore_eos), greedy, streamed; one server at "
        "a time, in the order of the tables. make run's engine (what Switchyard's builder "
        f"passes vLLM for local.yaml's SmolLM2 here): `{eng}`.",
        "",
        f"This run: `{doc.get('command', '')}`. Re-run: "
        f"`.venv/bin/python -m benchmarks.default_dtype{quick}`"
        " (30-70 min on 2 cores: the bf16 arms are slow where bf16 is emulated; `--systems`"
        " picks arms, `--requests C1,C8` shortens the loads).",
        "",
        "## Goals (make run's default / `vllm serve` defaults)",
        "",
        "| goal | ratio | met | margin |",
        "|---|---|---|---|",
    ]
    for g in doc["goals"]:
        sign = "≥" if g["at_least"] else "≤"
        met = {True: "yes", False: "**no**", None: "not measured"}[g["met"]]
        lines.append(
            f"| {g['metric']} at {g['load']} {sign} {g['limit']:.2f}× | "
            f"{_f(g['ratio'])}× | {met} | {_f(g['margin_pct'], 1)} % |"
        )
    lines += [
        "",
        "## Ratios, side by side (p50 / p95; tok/s)",
        "",
        "| comparison | isolates | load | TTFT | ITL | E2E | output tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, num, den, what in COMPARISONS:
        for load in plan:
            cells = [
                f"{_f(ratio(res, num, den, load, f'{m}_p50'))} / "
                f"{_f(ratio(res, num, den, load, f'{m}_p95'))}"
                for m in METRICS
            ]
            toks = _f(ratio(res, num, den, load, "output_tok_per_s"))
            lines.append(
                f"| {name} (`{num}` / `{den}`) | {what} | {load} | "
                + " | ".join(cells)
                + f" | {toks} |"
            )
    lines += [
        "",
        "## Per arm (ms; tok/s)",
        "",
        "| arm | load | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 | E2E p50 | E2E p95 "
        "| tok/s | errors | load avg before |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in res.items():
        if "error" in r:
            lines.append(f"| `{arm}` | FAILED: {r['error']} |" + " |" * 9)
        for load in plan:
            a = _agg(res, arm, load)
            if a:
                lines.append(
                    f"| `{arm}` | {load} | "
                    + " | ".join(_ms(a[f"{m}_{p}"]) for m in METRICS for p in ("p50", "p95"))
                    + f" | {_f(a['output_tok_per_s'], 1)} | {a['errors']} | "
                    f"{a.get('loadavg_1m_before', '-')} |"
                )
    lines += [
        "",
        f"## Quality: {len(quality_set.QUESTIONS)} questions, greedy, "
        f"{quality_set.MAX_TOKENS} tokens, normalised whole-word match",
        "",
        "| arm | label | engine (vLLM's log) | correct | score |",
        "|---|---|---|---|---|",
    ]
    for arm, r in res.items():
        if "quality" in r:
            n = sum(q["correct"] for q in r["quality"])
            seen = ", ".join(f"{k}={v}" for k, v in r.get("engine_seen", {}).items()) or "-"
            lines.append(
                f"| `{arm}` | {r['label']} | {seen} | {n}/{len(r['quality'])} | {r['score']:.2f} |"
            )
    for name, pair in doc["dtype_differences"].items():
        lines += ["", f"Questions answered differently, {name}:", ""]
        lines += [
            f"- {d['prompt']} fp32 {'✓' if d['a_correct'] else '✗'} "
            f"{d['a']!r} / bf16 {'✓' if d['b_correct'] else '✗'} {d['b']!r}"
            for d in pair
        ] or ["- none: identical answers"]
    lines += [
        "",
        "Per-question answers of every arm, per-request records and each arm's command: the JSON.",
        "",
        f"![default profile]({image})",
        "",
    ]
    return "\n".join(lines)


def write(doc: dict[str, Any], out: Path, stem: str) -> None:
    """The report of the arms run so far (written after every arm)."""
    res = doc["results"]
    doc["goals"], doc["dtype_differences"] = goals(res), {}
    for label, fp32, bf16 in (
        ("eager (vllm-equal vs vllm-equal-bf16)", "vllm-equal", "vllm-equal-bf16"),
        ("compiled (vllm-defaults-fp32 vs vllm-defaults)", "vllm-defaults-fp32", "vllm-defaults"),
    ):
        if "quality" in res.get(fp32, {}) and "quality" in res.get(bf16, {}):
            diff = quality_set.differing(res[fp32]["quality"], res[bf16]["quality"])
            doc["dtype_differences"][label] = diff
    out.mkdir(parents=True, exist_ok=True)
    plot(doc, out / f"{stem}.png")
    write_report(out, stem, doc, markdown(doc, f"{stem}.png"))
    print(f"wrote {out / stem}.md ({', '.join(res)})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per load")
    parser.add_argument("--requests", default=None, help="C1,C8: requests of each load")
    parser.add_argument("--warmup", type=int, default=WARMUP_REQUESTS, help="warm-up requests")
    parser.add_argument("--systems", default=None, help="comma-separated arms (default: all)")
    parser.add_argument(
        "--python-proxy",
        action="store_true",
        help="Switchyard behind Ray's Python proxy instead of HAProxy",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="server logs and vLLM's cache (torch.compile's): reuse one to skip compiling again",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    from app.engine.cpu_dtype import auto_dtype, cpu_flags

    engine = make_run_engine()
    all_arms = arms(engine)
    names = args.systems.split(",") if args.systems else list(all_arms)
    model_dir = prepared_model_dir()
    plan = [ld for ld in loads(args.quick) if ld.kind == "closed"]
    if args.requests:
        counts = [int(n) for n in args.requests.split(",")]
        plan = [
            Load(ld.name, ld.kind, ld.value, n, ld.prompt_seed)
            for ld, n in zip(plan, counts, strict=True)
        ]
    short = args.quick or bool(args.requests)
    factory = PromptFactory(ChatTemplateCounter.from_path(model_dir))
    requests = {ld.name: chat_requests(factory, ld.requests, ld.prompt_seed) for ld in plan}
    warmup = chat_requests(factory, args.warmup, WARMUP_SEED)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="switchyard-default-dtype-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"arms {names}; loads {[(ld.name, ld.requests) for ld in plan]}; logs {log_dir}")
    doc: dict[str, Any] = {
        "environment": environment(model_dir),
        "isa_flags": sorted(set(ISA_FLAGS) & cpu_flags()),
        "auto_dtype": auto_dtype(),
        "make_run_engine": engine,
        "quick": short,
        "command": " ".join(["python -m benchmarks.default_dtype", *sys.argv[1:]]),
        "warmup_requests": args.warmup,
        "loads": [ld.__dict__ for ld in plan],
        "results": {},
        "comparisons": [
            {"name": c[0], "numerator": c[1], "denominator": c[2]} for c in COMPARISONS
        ],
    }
    stem = f"default-profile-{dt.date.today().isoformat()}" + ("-quick" if short else "")
    with _sigterm_as_exit():
        for name in names:
            doc["results"][name] = bench_arm(
                all_arms[name],
                model_dir,
                log_dir,
                plan,
                requests,
                warmup,
                haproxy=not args.python_proxy,
            )
            write(doc, args.out, stem)
    for g in doc["goals"]:
        print(
            f"goal {g['metric']} {g['load']}: {_f(g['ratio'])}x (limit {g['limit']}) met={g['met']}"
        )


if __name__ == "__main__":
    main()
