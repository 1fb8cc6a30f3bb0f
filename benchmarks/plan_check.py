"""Does a plan hold? ``switchyard plan``'s replica count re-measured with the load
generator at the planned rate (issue 33).

Rule. Plan the shipped mix's ``chat`` class alone (benchmarks/mixes/cpu-chat.yaml: 64
prompt and 32 output tokens) from the shipped CPU profile reports, at an offered rate
``R = utilisation × k`` where ``k`` is the capacity the plan gives one replica of the
point it picks (the lower of its closed-loop goodput and the Poisson rate within the
SLO, ``app.cost.queueing``; found by planning once at a tiny rate, then again at R: the
second plan must need exactly one serving replica, and is the plan checked). Serve that
replica — the embedded model on vLLM with the chosen profile's shipped file, the
chosen knob value and the point's concurrency as ``max_ongoing_requests``, on a local
Ray as ``switchyard profile tune`` does — and measure, side by side on the same
replica: (1) a closed loop at the point's concurrency (the capacity the plan read,
re-measured today: the box's speed drifts between days) and (2) the load generator's
open loop, Poisson at R. The plan holds when (2)'s TTFT and ITL p95 are within the
SLO and its error rate within the report's budget. The plan's spare replica (N+1) is
for failures, not load: it is not served.

Parameters: --utilisation 1.0 (the plan's own limit), --slo ttft_p95=1500,itl_p95=150,
warm-up 10 s, steady state 600 s for the open loop (at the CPU's low planned rate,
~45 requests for a p95) and 60 s for the closed loop, seed 0.

    python -m benchmarks.plan_check [--utilisation 1.0] [--duration-s 600]

writes docs/benchmarks/plan-check-cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.bench import metrics
from app.bench.plan_input import load_reports
from app.bench.run import BenchConfig, execute
from app.bench.specs import FixedSpec
from app.bench.tune import VllmTarget
from app.cli.plan import load_mix, parse_objective
from app.config import ModelSpec
from app.cost.mix import Mix
from app.cost.plan import Plan, Pricing, plan, select_hardware
from app.settings import load_settings
from benchmarks.report_files import write_report

ROOT = Path(__file__).resolve().parents[1]
REPORTS = sorted((ROOT / "docs" / "benchmarks").glob("profile-tune-*.json"))
MIX = ROOT / "benchmarks" / "mixes" / "cpu-chat.yaml"
PROFILE_FILES = {"interactive": "profiles/interactive-cpu.yaml",
                 "throughput": "profiles/throughput-cpu.yaml"}  # fmt: skip


def chat_only(mix: Mix) -> Mix:
    chat = next(c for c in mix.classes if c.name == "chat")
    return Mix.model_validate({"classes": [chat.model_dump() | {"share": 1.0}]})


def planned(rps: float, mix: Mix, slo: str) -> Plan:
    curves, _ = select_hardware([c for c, _ in load_reports(REPORTS)], None)
    return plan(rps, mix, parse_objective(slo), curves, Pricing(gpu_hourly=0.10))


def _p95_ms(summary: dict[str, Any], key: str) -> float | None:
    d = summary.get(key) or {}
    return None if d.get("p95") is None else d["p95"] * 1000


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    mix = chat_only(load_mix(MIX))
    first = planned(0.01, mix, args.slo).classes[0].chosen
    rate = args.utilisation * first.capacity
    checked = planned(rate, mix, args.slo)
    chosen = checked.classes[0].chosen
    assert chosen.replicas_needed == 1, "the plan at R must need one serving replica"
    objective = parse_objective(args.slo)
    slo = metrics.SLO(
        ttft_s=objective.ttft_p95_ms / 1000 if objective.ttft_p95_ms else None,
        tpot_s=objective.itl_p95_ms / 1000 if objective.itl_p95_ms else None,
    )
    spec = ModelSpec.model_validate(
        {
            "id": "plan-check",
            "engine": "vllm",
            "source": "embedded:smollm2",
            "profile": {"name": chosen.profile, "file": PROFILE_FILES[chosen.profile]},
            chosen.knob: chosen.value,
            "max_ongoing_requests": chosen.concurrency,
        }
    )
    target = VllmTarget("embedded:smollm2", "auto", load_settings())
    workload = FixedSpec(input_tokens=64, output_tokens=32)
    common: dict[str, Any] = {
        "model": spec.id, "workload": workload, "tokenizer": target.tokenizer(), "slo": slo,
        "seed": 0, "engine": "vllm", "ready_timeout_s": 600, "warmup_s": args.warmup_s,
    }  # fmt: skip
    runs: dict[str, Any] = {}
    try:
        async with target.pool(spec) as url:
            print(f"replica ready; closed loop at c={chosen.concurrency}", file=sys.stderr)
            closed = BenchConfig(base_url=url, mode="closed", concurrency=chosen.concurrency,
                                 duration_s=args.closed_s, **common)  # fmt: skip
            runs["closed"] = await execute(closed)
            print(f"open loop, Poisson at {rate:.3f} req/s", file=sys.stderr)
            opened = BenchConfig(base_url=url, mode="open", rate=rate, arrival="poisson",
                                 duration_s=args.duration_s, **common)  # fmt: skip
            runs["open"] = await execute(opened)
    finally:
        await target.close()
    figures = {
        name: {
            "requests": r["summary"]["requests"],
            "error_rate": r["summary"]["error_rate"],
            "goodput": r["summary"]["goodput"],
            "completed_per_s": r["summary"]["request_throughput"],
            "ttft_p95_ms": _p95_ms(r["summary"], "ttft_s"),
            "itl_p95_ms": _p95_ms(r["summary"], "itl_s"),
            "e2e_p95_ms": _p95_ms(r["summary"], "e2e_s"),
        }
        for name, r in runs.items()
    }
    o = figures["open"]
    holds = (
        o["error_rate"] <= 0.01
        and (objective.ttft_p95_ms is None or (o["ttft_p95_ms"] or 0) <= objective.ttft_p95_ms)
        and (objective.itl_p95_ms is None or (o["itl_p95_ms"] or 0) <= objective.itl_p95_ms)
    )
    return {
        "command": "python -m benchmarks.plan_check " + " ".join(sys.argv[1:]),
        "metadata": runs["open"]["metadata"],
        "slo": objective.model_dump(),
        "utilisation": args.utilisation,
        "rate": rate,
        "plan": asdict(checked.classes[0].chosen),
        "figures": figures,
        "holds": holds,
        "records": {name: r["records"] for name, r in runs.items()},
    }


def markdown(doc: dict[str, Any]) -> str:
    p, f, m = doc["plan"], doc["figures"], doc["metadata"]

    def row(name: str) -> str:
        x = f[name]
        return (f"| {name} | {x['requests']} | {x['completed_per_s']:.3f} | "
                f"{x['goodput'] or 0:.3f} | {x['error_rate']:.1%} | {x['ttft_p95_ms']:.0f} | "
                f"{x['itl_p95_ms']:.0f} | {x['e2e_p95_ms']:.0f} |")  # fmt: skip

    return "\n".join(
        [
            "# Plan check on CPU: the plan's replica count re-measured at the planned rate",
            "",
            f"Command: `{doc['command']}`; commit {m.get('git_commit')}; {m.get('date')}; "
            f"{m.get('cpu')}; model {m.get('model_id')}. Rule: `benchmarks/plan_check.py`.",
            "",
            f"Plan (`switchyard plan`, chat class, SLO {doc['slo']}): {p['profile']} "
            f"{p['knob']}={p['value']} at concurrency {p['concurrency']}: closed-loop goodput "
            f"{p['goodput']:.3f} req/s, Poisson rate within the SLO {p['queue_rate']:.3f} "
            f"req/s, capacity {p['capacity']:.3f} req/s per replica → offered "
            f"{doc['rate']:.3f} req/s ({doc['utilisation']:.0%} of it): "
            f"{p['replicas_needed']} serving replica + "
            f"{p['replicas'] - p['replicas_needed']} spare, planned utilisation "
            f"{p['utilisation']:.0%}.",
            "",
            "| load | requests | completed/s | goodput/s | errors | TTFT p95 ms | "
            "ITL p95 ms | E2E p95 ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            row("closed"),
            row("open"),
            "",
            f"**The plan {'holds' if doc['holds'] else 'does not hold'}** at the planned "
            "rate (open loop: TTFT and ITL p95 within the SLO, errors within 1 %).",
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--utilisation", type=float, default=1.0)
    ap.add_argument("--slo", default="ttft_p95=1500,itl_p95=150")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--closed-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--stem", default="plan-check-cpu")
    args = ap.parse_args()
    doc = asyncio.run(measure(args))
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, args.stem, doc, markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
