# An evaluation's score and its report.
#
# Rule. A set's score is the share of its items that pass; the overall score is the
# share over all items graded. Each score comes with its Wilson score interval at 95 %
# (z = 1.96), which stays inside [0, 1] and is honest for small sets and scores near 0
# or 1. The failures are counted by class (``graders.FAILURES``).
#
# Parameters: ``Z`` (1.96).
"""``summarise(results)`` → the scores; ``write(...)`` → markdown, JSON and a plot."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.eval.graders import FAILURES
from app.eval.runner import Result

Z = 1.96


def wilson(passed: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of ``passed`` successes in ``n`` trials."""
    if n == 0:
        return (0.0, 1.0)
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def score(results: Sequence[Result]) -> dict[str, Any]:
    n = len(results)
    passed = sum(1 for r in results if r.verdict.ok)
    low, high = wilson(passed, n)
    failures = Counter(r.verdict.failure for r in results if r.verdict.failure is not None)
    return {
        "n": n,
        "passed": passed,
        "score": passed / n if n else 0.0,
        "ci95": [low, high],
        "failures": {f: failures.get(f, 0) for f in FAILURES},
    }


def summarise(results: Sequence[Result]) -> dict[str, Any]:
    """Scores per set (in the order met) and overall."""
    layers = list(dict.fromkeys(r.layer for r in results))
    return {
        "sets": {layer: score([r for r in results if r.layer == layer]) for layer in layers},
        "overall": score(results),
    }


def document(results: Sequence[Result], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: what was run (``meta``), the scores and every item's verdict."""
    items = [
        {
            "set": r.layer,
            "id": r.item,
            "kind": r.kind,
            "ok": r.verdict.ok,
            "failure": r.verdict.failure,
            "detail": r.verdict.detail,
            "answer": asdict(r.answer),
            "seconds": round(r.seconds, 3),
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
        }
        for r in results
    ]
    return {"meta": meta, **summarise(results), "items": items}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def markdown(doc: dict[str, Any], plot: str | None) -> str:
    meta = doc["meta"]
    lines = [
        f"# Evaluation of `{meta['model']}`",
        "",
        f"`{meta['command']}` on {meta['date']}, Switchyard {meta['git_commit']}. Sets: "
        + ", ".join(meta["sets"])
        + f". Greedy, not streamed, {meta['concurrency']} at once.",
        "",
        "| set | items | passed | score | 95 % interval (Wilson) | " + " | ".join(FAILURES) + " |",
        "|---|---|---|---|---|" + "---|" * len(FAILURES),
    ]
    rows = [*doc["sets"].items(), ("overall", doc["overall"])]
    for name, s in rows:
        low, high = s["ci95"]
        fails = " | ".join(str(s["failures"][f]) for f in FAILURES)
        lines.append(
            f"| {name} | {s['n']} | {s['passed']} | {_pct(s['score'])} | "
            f"{_pct(low)} – {_pct(high)} | {fails} |"
        )
    failed = [i for i in doc["items"] if not i["ok"]][:20]
    if failed:
        lines += ["", "First failures:", "", "| item | class | why |", "|---|---|---|"]
        lines += [f"| {i['id']} | {i['failure']} | {i['detail'][:120]} |" for i in failed]
    if plot:
        lines += ["", f"![scores and failures]({plot})"]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> bool:
    """Scores with their intervals, and the failures by class, per set (False without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(doc["sets"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    scores = [doc["sets"][n]["score"] for n in names]
    low = [s - doc["sets"][n]["ci95"][0] for s, n in zip(scores, names, strict=True)]
    high = [doc["sets"][n]["ci95"][1] - s for s, n in zip(scores, names, strict=True)]
    left.bar(names, scores, yerr=[low, high], capsize=6, color="#4c72b0")
    left.set_ylim(0, 1)
    left.set_title("score (bars: 95 % Wilson interval)")
    bottom = [0] * len(names)
    for f in FAILURES:
        counts = [doc["sets"][n]["failures"][f] for n in names]
        if any(counts):
            right.bar(names, counts, bottom=bottom, label=f)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    right.set_title("failures by class")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(doc: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.json``, ``<stem>.md`` and, with matplotlib, ``<stem>.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{stem}.png"
    drawn = plot(doc, png)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    paths[1].write_text(markdown(doc, png.name if drawn else None))
    return paths + ([png] if drawn else [])
