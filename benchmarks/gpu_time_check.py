"""GPU-time attribution on the real vLLM CPU engine with the embedded model: do the
requests' charges add up to the engine's own busy time, and does a prompt served from
the prefix cache cost less than the same prompt cold? (issue 33).

Rule. One in-process ``VLLMEngine`` of the embedded SmolLM2-135M (float32, batch 8,
512 MiB of KV cache; Switchyard's metered scheduler, ``app.engine.vllm_gpu_time``).
After one warm-up request: 16 requests at once (prompts of 32/64/256/512 random token
ids, 8/32/64 output tokens, ignore_eos, seed 0) — the sum of their deltas'
``gpu_seconds`` against the growth of the engine's ``busy_seconds_total`` (vLLM's own
iteration details) over the same window; then one 512-token prompt twice (cold, then
from the prefix cache), 8 output tokens each.

    python -m benchmarks.gpu_time_check

writes docs/benchmarks/gpu-time-cpu.{json,md}.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

from app.bench.metadata import collect_metadata
from app.builders import resolve_source
from app.engine.protocol import GenerationDelta, GenerationRequest, SamplingOptions
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.settings import load_settings

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


async def measure() -> dict[str, Any]:
    path = resolve_source("embedded:smollm2", load_settings())
    config = VLLMEngineConfig(model_path=path, served_name="smollm2", max_model_len=2048,
                              kv_cache_memory_bytes=512 * 1024**2, max_num_seqs=8,
                              dtype="float32")  # fmt: skip
    engine = VLLMEngine(config)
    await engine.start()

    async def one(rid: str, ids: list[int], n: int) -> list[GenerationDelta]:
        sampling = SamplingOptions(temperature=0.0, ignore_eos=True)
        return [d async for d in engine.generate(GenerationRequest(rid, tuple(ids), sampling, n))]

    def charged(deltas: list[GenerationDelta]) -> float:
        return sum(d.gpu_seconds or 0.0 for d in deltas)

    try:
        await one("warm-up", list(range(100, 140)), 4)
        await asyncio.sleep(0.5)  # the warm-up's last stats reach the logger
        rng = random.Random(0)
        requests = [
            (f"r{i}", [rng.randrange(200, 40000) for _ in range(rng.choice([32, 64, 256, 512]))],
             rng.choice([8, 32, 64]))
            for i in range(16)
        ]  # fmt: skip
        before = engine.stats().busy_seconds_total
        outs = await asyncio.gather(*(one(*r) for r in requests))
        await asyncio.sleep(0.5)
        busy = engine.stats().busy_seconds_total - before
        charges = [charged(o) for o in outs]
        document = [3000 + (j * 7) % 20000 for j in range(512)]
        cold = await one("cold", document, 8)
        warm = await one("warm", document, 8)
    finally:
        engine.close()
    return {
        "command": "python -m benchmarks.gpu_time_check",
        "metadata": collect_metadata(
            model_info={"id": "SmolLM2-135M-Instruct"},
            engine="vllm",
            engine_version=None,
            dataset="random token ids",
            input_lengths="32/64/256/512; one 512-token prompt twice",
            output_lengths="8/32/64; 8",
            concurrency="16 at once (batch 8); then one at a time",
            warmup="one request",
            duration="until done",
            sampling={"temperature": 0.0, "ignore_eos": True},
        ),
        "concurrent": {
            "requests": len(requests),
            "prompt_tokens": [len(r[1]) for r in requests],
            "output_tokens": [r[2] for r in requests],
            "engine_busy_s": busy,
            "attributed_s": sum(charges),
            "ratio": sum(charges) / busy,
            "per_request_s": charges,
        },
        "prefix_cache": {
            "prompt_tokens": len(document),
            "cold_s": charged(cold),
            "cold_cached_tokens": cold[0].cached_prompt_tokens,
            "warm_s": charged(warm),
            "warm_cached_tokens": warm[0].cached_prompt_tokens,
            "warm_over_cold": charged(warm) / charged(cold),
        },
    }


def markdown(doc: dict[str, Any]) -> str:
    c, p, m = doc["concurrent"], doc["prefix_cache"], doc["metadata"]
    return "\n".join([
        "# GPU-time attribution on the vLLM CPU engine",
        "",
        f"Command: `{doc['command']}`; commit {m.get('git_commit')}; {m.get('date')}; "
        f"{m.get('cpu')}; SmolLM2-135M-Instruct, float32. Rule: `benchmarks/gpu_time_check.py`.",
        "",
        "| check | measured |",
        "|---|---|",
        f"| {c['requests']} requests at once: Σ charges / vLLM's busy time | "
        f"{c['attributed_s']:.3f} s / {c['engine_busy_s']:.3f} s = **{c['ratio']:.4f}** |",
        f"| {p['prompt_tokens']}-token prompt, cold (cached {p['cold_cached_tokens']}) | "
        f"{p['cold_s']:.3f} s |",
        f"| the same, from the prefix cache (cached {p['warm_cached_tokens']}) | "
        f"{p['warm_s']:.3f} s (**{p['warm_over_cold']:.2f}×** cold) |",
        "",
    ])


def main() -> None:
    doc = asyncio.run(measure())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu-time-cpu.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (OUT / "gpu-time-cpu.md").write_text(markdown(doc))
    sys.stdout.write(markdown(doc))


if __name__ == "__main__":
    main()
