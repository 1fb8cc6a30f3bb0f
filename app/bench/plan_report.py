"""``switchyard plan``'s files: the plan (``app.cost.plan``) with the source reports'
metadata, as JSON and Markdown, and the few lines it prints."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.cost.plan import Plan


def document(
    plan: Plan, reports: list[dict[str, Any]], left_out: list[str], command: str
) -> dict[str, Any]:
    """The plan as JSON-ready data; ``reports``: one entry per report used."""
    return {
        "command": command,
        "rps": plan.rps,
        "pricing": asdict(plan.pricing),
        "reports": reports,
        "reports_left_out": left_out,
        "classes": [
            {
                "name": c.name,
                "share": c.share,
                "rps": c.rps,
                "slo": c.slo.model_dump(exclude_none=True),
                "chosen": asdict(c.chosen),
                "candidates": [asdict(x) for x in c.candidates],
                "not_covering": list(c.not_covering),
                "rejected": list(c.rejected),
            }
            for c in plan.classes
        ],
        "total": {
            "replicas": plan.replicas,
            "gpus": plan.gpus,
            "monthly_cost": plan.monthly_cost,
            "utilisation": plan.utilisation,
        },
    }


def _point(c: dict[str, Any]) -> str:
    return f"{c['profile']} {c['knob']}={c['value']} c={c['concurrency']}"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _row(c: dict[str, Any]) -> str:
    return (
        f"| {_point(c)} | {c['source']} | {c['goodput']:.3f} | {_rate(c['queue_rate'])} | "
        f"{c['capacity']:.3f} | "
        f"{'yes' if c['conservative'] else 'no'} | {c['replicas_needed']} | {c['replicas']} | "
        f"{c['gpus']} | ${c['monthly_cost']:,.2f} | {c['utilisation']:.0%} |"
    )


def summary(doc: dict[str, Any]) -> list[str]:
    """One line per class and one for the total."""
    lines = []
    for c in doc["classes"]:
        x = c["chosen"]
        lines.append(
            f"{c['name']}: {c['rps']:g} req/s → {_point(x)} ({x['capacity']:.3f} req/s each): "
            f"{x['replicas_needed']}+{x['replicas'] - x['replicas_needed']} replicas, "
            f"{x['gpus']} GPUs, ${x['monthly_cost']:,.2f}/month, utilisation {x['utilisation']:.0%}"
        )
    t = doc["total"]
    lines.append(
        f"total: {t['replicas']} replicas, {t['gpus']} GPUs, ${t['monthly_cost']:,.2f}/month, "
        f"utilisation {t['utilisation']:.0%}"
    )
    return lines


def markdown(doc: dict[str, Any]) -> str:
    p = doc["pricing"]
    lines = [
        f"# Capacity plan for {doc['rps']:g} req/s",
        "",
        f"Command: `{doc['command']}`. ${p['gpu_hourly']}/GPU-hour, "
        f"{p['gpus_per_replica']} GPU(s) per replica, {p['spare_replicas']} spare replica(s) "
        "per class (N+1), 730 hours/month. A replica's capacity: the lower of its closed-loop "
        "goodput and the Poisson arrival rate whose queueing still meets the TTFT (else E2E) "
        "limit at p95 (`app/cost/queueing.py`). Utilisation: offered req/s / (replicas "
        "needed × goodput), spares excluded. Rule: `app/cost/plan.py`.",
        "",
        "Measured curves:",
        "",
    ]
    for r in doc["reports"]:
        lines.append(
            f"- `{r['source']}`: profile {r['profile']} on {r['hardware']}, "
            f"commit {r.get('commit') or '-'}, {r.get('date') or '-'}"
        )
    lines += [f"- left out (hardware): {x}" for x in doc["reports_left_out"]]
    lines += ["", "## Plan", "", *(f"- {line}" for line in summary(doc))]
    for c in doc["classes"]:
        slo = ", ".join(f"{k}={v:g}" for k, v in c["slo"].items())
        lines += [
            "",
            f"## {c['name']} ({c['share']:.0%} of the traffic, {c['rps']:g} req/s; SLO {slo})",
            "",
            "| point | report | goodput req/s | Poisson rate within SLO | capacity | goodput "
            "counted under an SLO at least as strict | replicas needed | replicas (N+1) | GPUs "
            "| $/month | utilisation |",
            "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
            *(_row(x) for x in c["candidates"]),
        ]
        lines.append("")
        lines += [f"- not covering: {x}" for x in c["not_covering"]]
        lines += [f"- no candidate: {x}" for x in c["rejected"]]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(markdown(doc))
    return paths
