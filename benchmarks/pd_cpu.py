"""A prefill/decode pair of real vLLM CPU engines joined by NixlConnector (UCX over host
memory), against the same engine serving whole: identical greedy output, the KV the
decode engine reports receiving, and what the hand-off costs by prompt length.

    .venv/bin/python -m benchmarks.pd_cpu [--quick] [--out DIR]

Engines: the embedded SmolLM2-135M-Instruct as serve_configs/local.yaml serves it
(float32, 512 MiB KV cache), in-process through ``VLLMEngine``: a prefill engine and a
decode engine, both ``kv_both`` with the connector, one request at a time. For each
prompt length in ``LENGTHS`` (distinct random token ids, no cache hits) and each of
``ROUNDS`` rounds: the unified reference (the whole request on the decode engine), then
the same length remotely: ``Engine.prefill`` on the prefill engine, ``generate`` with
the hand-off on the decode engine. ``OUTPUT`` tokens out, greedy, EOS ignored.

Measured: the outputs' equality (after the pair, the same prompt runs whole on the
prefill engine, from the KV it computed, so the comparison isolates the transfer and the
decode engine; tests/integration/test_disaggregation.py compares against a separate
unified engine); TTFT whole vs remote (prefill leg + the
decode leg's first token); the decode engine's connector counters per transfer
(bytes, seconds: NIXL's own telemetry); bytes per token and the effective bandwidth,
which calibrate the simulated transfer model (app/engine/simulated_transfer.py).
Writes pd-cpu-<date>.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from app.bench.metadata import collect_metadata
from app.engine.kv_transfer import KvConnector
from app.engine.protocol import GenerationDelta, GenerationRequest, KvHandoff, SamplingOptions
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.serving.llm_server import free_port
from benchmarks.serving_lib import prepared_model_dir

NAME = "SmolLM2-135M-Instruct"
LENGTHS = (128, 512, 1024, 1536)
OUTPUT = 16
ROUNDS = 3


def engine(model_dir: Path, role: str) -> VLLMEngine:
    config = VLLMEngineConfig(model_path=model_dir, served_name=NAME, dtype="float32",
                              max_model_len=2048, kv_cache_memory_bytes=512 * 1024**2,
                              max_num_seqs=8, kv_connector=KvConnector(),
                              pd_role=role)  # type: ignore[arg-type]  # fmt: skip
    return VLLMEngine(config, side_channel=("127.0.0.1", free_port()))


def request(rid: str, ids: tuple[int, ...], handoff: KvHandoff | None = None) -> GenerationRequest:
    return GenerationRequest(rid, ids, SamplingOptions(temperature=0.0, ignore_eos=True),
                             OUTPUT, handoff=handoff)  # fmt: skip


async def timed(e: VLLMEngine, r: GenerationRequest) -> tuple[str, float, float]:
    """(text, seconds to the first token, seconds to the end)."""
    start, first = time.monotonic(), None
    deltas: list[GenerationDelta] = []
    async for d in e.generate(r):
        if first is None and d.num_new_tokens:
            first = time.monotonic() - start
        deltas.append(d)
    assert first is not None
    return "".join(d.text for d in deltas), first, time.monotonic() - start


async def counters(e: VLLMEngine) -> dict[str, float]:
    await asyncio.sleep(0.3)  # the scheduler's stats of the last step arrive after it
    return dict(e.stats().extra)


async def run(model_dir: Path, quick: bool) -> dict[str, Any]:
    lengths = LENGTHS[:2] if quick else LENGTHS
    rounds = 1 if quick else ROUNDS
    p, d = engine(model_dir, "prefill"), engine(model_dir, "decode")
    await p.start()
    await d.start()
    rng = random.Random(5)
    rows: list[dict[str, Any]] = []
    try:
        for i in range(rounds):
            for n in lengths:
                whole = tuple(rng.randrange(1000, 40000) for _ in range(n))
                ids = tuple(rng.randrange(1000, 40000) for _ in range(n))
                _, local_ttft, _ = await timed(d, request(f"u{i}-{n}", whole))
                before = await counters(d)
                started = time.monotonic()
                handoff = await p.prefill(request(f"p{i}-{n}", ids))
                prefill_s = time.monotonic() - started
                text, first, _ = await timed(d, request(f"d{i}-{n}", ids, handoff))
                after = await counters(d)
                # The reference: the same prompt whole on the prefill engine, from the KV
                # it computed itself (its cache), without the transfer.
                reference, _, _ = await timed(p, request(f"ref{i}-{n}", ids))
                row = {
                    "round": i, "tokens": n, "equal": text == reference,
                    "local_ttft_s": local_ttft, "prefill_s": prefill_s,
                    "decode_first_s": first, "remote_ttft_s": prefill_s + first,
                    "prefill_cached": handoff.cached_prompt_tokens,
                    "transfers": after["kv_transfers_total"] - before["kv_transfers_total"],
                    "bytes": after["kv_transfer_bytes_total"] - before["kv_transfer_bytes_total"],
                    "transfer_s": after["kv_transfer_seconds_total"]
                    - before["kv_transfer_seconds_total"],
                }  # fmt: skip
                rows.append(row)
                print(f"[pd-cpu] round {i} {n} tokens: equal {row['equal']}, TTFT local "
                      f"{local_ttft:.3f}s remote {row['remote_ttft_s']:.3f}s, transfer "
                      f"{row['bytes'] / 1e6:.1f} MB in {row['transfer_s'] * 1e3:.1f} ms",
                      flush=True)  # fmt: skip
    finally:
        p.close()
        d.close()
    return {"benchmark": "pd-cpu", "lengths": list(lengths), "rounds": rounds,
            "output_tokens": OUTPUT, "rows": rows, "summary": summary(rows, lengths)}  # fmt: skip


def summary(rows: list[dict[str, Any]], lengths: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"all_equal": all(r["equal"] for r in rows), "by_length": {}}
    for n in lengths:
        rs = [r for r in rows if r["tokens"] == n]
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("local_ttft_s", "prefill_s", "decode_first_s", "remote_ttft_s", "bytes",
                "transfer_s", "transfers")}  # fmt: skip
        med["bytes_per_token"] = med["bytes"] / n
        med["remote_over_local_ttft"] = med["remote_ttft_s"] / med["local_ttft_s"]
        out["by_length"][str(n)] = med
    # Transfer model: seconds = base + bytes / bandwidth, least squares over every row.
    xs = [r["bytes"] for r in rows if r["transfers"]]
    ys = [r["transfer_s"] for r in rows if r["transfers"]]
    if len(set(xs)) >= 2:
        slope, base = statistics.linear_regression(xs, ys)
        out["transfer_bytes_per_s"] = 1 / slope if slope > 0 else None
        out["transfer_base_s"] = max(0.0, base)
    return out


def write(doc: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"pd-cpu-{doc['date'][:10]}"
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1))
    s = doc["summary"]
    ns = [int(n) for n in s["by_length"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = (
        ("local_ttft_s", "whole on one engine"),
        ("remote_ttft_s", "P/D pair"),
        ("prefill_s", "prefill leg"),
        ("decode_first_s", "decode leg, first token"),
    )
    for key, label in series:
        axes[0].plot(ns, [s["by_length"][str(n)][key] for n in ns], "o-", label=label)
    axes[0].set_title("TTFT (s, median) by prompt tokens")
    axes[0].legend(fontsize=8)
    axes[1].plot(ns, [s["by_length"][str(n)]["transfer_s"] * 1e3 for n in ns], "o-")
    axes[1].set_title("NIXL transfer (ms, decode engine's counters)")
    for ax in axes:
        ax.set_xlabel("prompt tokens")
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    bw = s.get("transfer_bytes_per_s")
    lines = [
        "# A prefill/decode pair on the vLLM CPU engine (NixlConnector over UCX, host memory)",
        "",
        f"`python -m benchmarks.pd_cpu` — {NAME} (float32), a prefill engine and a decode "
        f"engine in one process, one request at a time, {doc['rounds']} rounds, {OUTPUT} "
        f"tokens out, greedy. Wall time {doc['wall_s']:.0f} s. Metadata in the JSON file.",
        "",
        f"- Greedy outputs of the pair equal the whole request's on every prompt: "
        f"**{s['all_equal']}**.",
        f"- Transfer model fitted on the decode engine's NIXL counters: "
        f"{bw / 1e9 if bw else float('nan'):.2f} GB/s, base "
        f"{s.get('transfer_base_s', float('nan')) * 1e3:.2f} ms per transfer.",
        "",
        "| prompt tokens | TTFT whole (s) | TTFT P/D (s) | P/D ÷ whole | prefill leg (s) | "
        "decode first token (s) | KV moved (MB) | bytes/token | transfer (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        r = s["by_length"][str(n)]
        lines.append(
            f"| {n} | {r['local_ttft_s']:.3f} | {r['remote_ttft_s']:.3f} | "
            f"{r['remote_over_local_ttft']:.2f} | {r['prefill_s']:.3f} | "
            f"{r['decode_first_s']:.3f} | {r['bytes'] / 1e6:.2f} | {r['bytes_per_token']:.0f} | "
            f"{r['transfer_s'] * 1e3:.2f} |"
        )
    lines += ["", f"![TTFT and transfer time]({stem.name}.png)", ""]
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
    doc = asyncio.run(run(model_dir, a.quick))
    doc["wall_s"] = time.monotonic() - started
    doc["date"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    doc["metadata"] = collect_metadata(
        model_info={"id": NAME, "root": model_dir.name},
        engine="vllm (CPU) + NixlConnector (nixl 1.3.2, UCX)",
        engine_version=vllm.__version__,
        dataset="random token ids (seeded)",
        input_lengths=", ".join(str(n) for n in doc["lengths"]),
        output_lengths=f"{OUTPUT} tokens",
        concurrency="1",
        warmup="none (each length's first request is in the figures' rounds)",
        duration=f"{doc['rounds']} rounds",
        sampling={"temperature": 0.0, "ignore_eos": True},
        extra={"simulated": False, "kv_buffer_device": "cpu"},
    )
    print(f"wrote {write(doc, a.out)}")


if __name__ == "__main__":
    main()
