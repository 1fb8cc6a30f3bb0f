"""What the layer-1 benchmarks share (``benchmarks.layer1`` in process,
``benchmarks.layer1_http`` over HTTP, ``benchmarks.bench_switchyard``): the model, the
prompt and the limits they use, and the pure helpers that summarise a run — so the two
halves of the layer-1 run import this module and not each other."""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from app.bench.metrics import percentile

MODEL = "sim"
MESSAGES = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
)
MAX_TOKENS = 16
CONTEXT = 2048
# Large enough never to refuse: every check runs, none bites.
BIG_LIMITS: dict[str, Any] = {
    "rpm": 10**9,
    "tpm": 10**12,
    "max_concurrent": 10**6,
    "daily_tokens": 10**12,
    "daily_usd": 1e9,
}
PRICING = {"input_per_1m": 0.15, "output_per_1m": 0.6}
PHASES = ("identify", "plan+tokenize", "admit", "settle", "total")
BLOCK = 100
SPIKE_MS = 2.5
TICKS = (0.1, 0.2, 0.3, 0.5, 1, 2, 3, 5, 10, 15, 20, 30, 50, 100)
_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------- pure helpers
def summarize(seconds: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50/p90/p99/p99.9, mean and max in milliseconds (linear-interpolated percentiles)."""
    ms = [s * 1000.0 for s in seconds]
    out: dict[str, float | int | None] = {"n": len(ms)}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99_9", 99.9)):
        out[f"{name}_ms"] = percentile(ms, q)
    out["mean_ms"] = sum(ms) / len(ms) if ms else None
    out["max_ms"] = max(ms) if ms else None
    return out


def per_second(offsets: Sequence[float], seconds: int) -> list[int]:
    """How many of ``offsets`` (s from the start) fall into each whole second 0..seconds-1."""
    counts = [0] * seconds
    for t in offsets:
        i = math.floor(t)
        if 0 <= i < seconds:
            counts[i] += 1
    return counts


def rate_window(counts: Sequence[int], window_s: int, limit_per_min: int) -> dict[str, Any]:
    """Admitted over the last ``window_s`` seconds against what ``limit_per_min`` allows."""
    admitted = sum(counts[-window_s:]) if window_s else 0
    expected = limit_per_min * window_s / 60.0
    return {
        "window_s": window_s,
        "admitted": admitted,
        "expected": expected,
        "per_minute": admitted * 60.0 / window_s if window_s else None,
        "error_pct": 100.0 * (admitted - expected) / expected if expected else None,
    }


def budget_accuracy(
    records: Sequence[dict[str, Any]], budget: int, min_output: int, max_tokens: int
) -> dict[str, Any]:
    """From ledger records: billed tokens, overshoot (billed - budget), unused budget,
    whether the unused part could still have held one request (a false refusal), and
    how many completions the budget cut below ``max_tokens``."""
    billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)
    prompt = max((r["prompt_tokens"] for r in records), default=0)
    per_ingress = Counter(str(r.get("ingress")) for r in records)
    unused = budget - billed
    return {
        "budget": budget,
        "billed": billed,
        "overshoot": billed - budget,
        "unused": unused,
        "smallest_request": prompt + min_output,
        "false_refusal": unused >= prompt + min_output,
        "records": len(records),
        "capped": sum(r["completion_tokens"] < max_tokens for r in records),
        "per_ingress": dict(sorted(per_ingress.items())),
    }


def spikes(samples_ms: Sequence[float], threshold_ms: float) -> dict[str, Any]:
    """Samples above ``threshold_ms``: how many, and the median distance (in requests)
    between consecutive ones — a steady distance means a periodic cost."""
    at = [i for i, v in enumerate(samples_ms) if v > threshold_ms]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    return {"count": len(at), "median_gap": statistics.median(gaps) if gaps else None}
