"""``switchyard cost``'s files: the sheet (``app.cost.sheet``) with the source report's
metadata and the price dates, as JSON, Markdown and a plot of $/1M tokens against
utilisation with each API's blended price as a line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _usd(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"${v:,.{digits}f}"


def _n(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def markdown(doc: dict[str, Any], image: str) -> str:
    s, u, t = doc["sheet"], doc["sheet"]["unit_costs"], doc["sheet"]["throughput"]
    i = s["inputs"]
    retry = "not measured" if t["retry_overhead"] is None else t["retry_overhead"]
    lines = [
        f"# Cost of `{doc['report']}` ({doc['run']})",
        "",
        f"Source report: `{doc['report']}`, run `{doc['run']}`; measured on: "
        f"{doc.get('measured_on') or 'see the report'}; commit {doc.get('commit') or '-'}. "
        f"Prices dated {', '.join(s['price_dates'])}. Command: `{doc['command']}`.",
        "",
        f"Instance ${i['hourly']}/h × {i['gpus']}, average utilisation {i['utilisation']:.0%}, "
        f"labour {_usd(i['labour_monthly'], 0)}/month, prompt-token weight {i['input_weight']} "
        "(engine time of one prompt token relative to one output token).",
        "",
        f"![cost]({image})",
        "",
        "## Unit costs",
        "",
        "| measured | value |",
        "|---|---|",
        f"| tokens/s in / out (one instance) | {_n(t['input_tokens_per_s'], 1)} / "
        f"{_n(t['output_tokens_per_s'], 1)} |",
        f"| success rate | {t['success_rate']:.1%} |",
        f"| retry overhead | {retry} |",
        f"| effective tokens/hour in / out | {_n(u['effective_input_tokens_per_hour'])} / "
        f"{_n(u['effective_output_tokens_per_hour'])} |",
        f"| $/1M tokens (all) | {_usd(u['per_1m_tokens'])} |",
        f"| $/1M input / output | {_usd(u['per_1m_input'])} / {_usd(u['per_1m_output'])} |",
        f"| $/request | {_usd(u['per_request'], 6)} |",
        "",
        "## $/request per workload class",
        "",
        "| class | requests | success | tokens in / out per request | $/request |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {c['name']} | {c['requests']} | {c['success_rate']:.1%} | "
            f"{_n(c['input_tokens_per_request'], 1)} / {_n(c['output_tokens_per_request'], 1)}"
            f" | {_usd(c['per_request'], 6)} |"
            for c in s.get("classes", [])
        ),
        "",
        "## Break-even against each API price",
        "",
        "| API | dated | blended $/1M | average tok/s to break even | capacity needed at "
        "utilisation | requests/month | measured capacity reaches it |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in s["break_even"]:
        lines.append(
            f"| {r['price']} | {r['date']} | {_usd(r['api_per_1m_blended'])} | "
            f"{_n(r['break_even_avg_tokens_per_s'])} | {_n(r['break_even_capacity_tokens_per_s'])}"
            f" | {_n(r['break_even_requests_per_month'])} | {'yes' if r['reachable'] else 'no'} |"
        )
    lines += [
        "",
        "## Monthly cost by scenario, traffic and case (seed 003 §11.4)",
        "",
        "| traffic | case | scenario | requests | instances | utilisation | cost | "
        "$/request | margin | quality | SLO met |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in s["monthly"]:
        util = "-" if m["utilisation"] is None else f"{m['utilisation']:.0%}"
        margin = None if m["revenue"] is None else m["revenue"] - m["cost"]
        lines.append(
            f"| {m['traffic']} | {m['case']} | {m['scenario']} | {_n(m['requests'])} | "
            f"{m['instances'] if m['instances'] is not None else '-'} | {util} | "
            f"{_usd(m['cost'], 2)} | {_usd(m['cost'] / m['requests'], 6)} | {_usd(margin, 2)} | "
            f"{_n(m.get('quality'), 2)} | {_share(m.get('slo_met'))} |"
        )
    lines += ["", "Hidden costs per case (seed 003 §11.3):", ""]
    for case, h in s["hidden_costs"].items():
        lines.append(f"- {case}: " + ", ".join(f"{k} {v}" for k, v in h.items()))
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = doc["sheet"]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(s["curve"]["utilisation"], s["curve"]["per_1m_tokens"], "o-", label="self-served")
    for i, r in enumerate(s["break_even"]):
        label = f"{r['price']} ({r['date']})"
        ax.axhline(r["api_per_1m_blended"], ls="--", lw=1, color=f"C{i + 1}", label=label)
    ax.set(
        xlabel="average utilisation",
        ylabel="$ per 1M tokens (workload's output share)",
        yscale="log",
        title=f"cost of {doc['run']}",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(doc: dict[str, Any], out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths[1].write_text(markdown(doc, paths[2].name))
    plot(doc, paths[2])
    return paths
