"""Per-hop cost of two commits side by side in one run: ``benchmarks.hops`` for each,
in alternating order (A B A B …), so a drift of this machine's speed hits both alike.

Both arms run this tree's ``benchmarks/hops.py`` (and the percentile of
``app/stats.py``) against their own ``app`` package: each commit is checked out in a
temporary worktree, the measuring code copied in, and ``python -m benchmarks.hops``
run there in a process of its own (its own Ray instance). The report gives each row's
p50, p99 and mean per arm (the mean of its rounds) and the ratio new/old.

Usage: python -m benchmarks.hops_compare --old COMMIT [--new HEAD] [--rounds 2] [--n 300]
writes docs/benchmarks/hops-compare-<date>[-TAG].json/.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.bench.metadata import cpu_info, git_commit
from benchmarks import scaffold

ROOT = Path(__file__).resolve().parents[1]
# The same measuring script in both trees (with what it imports that older trees lack).
COPIED = (
    "benchmarks/hops.py",
    "benchmarks/scaffold.py",
    "benchmarks/report_files.py",
    "app/stats.py",
)
STATS = ("p50_ms", "p99_ms", "mean_ms")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def _checkout(commit: str, into: Path) -> Path:
    _git("worktree", "add", "--detach", "-q", str(into), commit)
    for rel in COPIED:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, into / rel)
    return into


def _run(tree: Path, n: int, out: Path) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "benchmarks.hops", "--n", str(n), "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    (report,) = out.glob("hops-*.json")
    summary: dict[str, dict[str, float]] = json.loads(report.read_text())["summary"]
    report.unlink()
    return summary


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=300)
    a = parser.parse_args()
    arms = {"old": _git("rev-parse", "--short", a.old), "new": _git("rev-parse", "--short", a.new)}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {arm: _checkout(commit, Path(tmp) / arm) for arm, commit in arms.items()}
        try:
            for r in range(a.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for arm in order:
                    print(f"round {r + 1}/{a.rounds}: {arm} ({arms[arm]})", flush=True)
                    runs[arm].append(_run(trees[arm], a.n, Path(tmp) / f"out-{arm}"))
        finally:
            for tree in trees.values():
                _git("worktree", "remove", "--force", str(tree))
    rows: dict[str, dict[str, Any]] = {}
    for row in runs["old"][0]:
        rows[row] = {}
        for arm in ("old", "new"):
            rows[row][arm] = {s: statistics.mean(x[row][s] for x in runs[arm]) for s in STATS}
        rows[row]["ratio"] = {s: rows[row]["new"][s] / rows[row]["old"][s] for s in STATS}
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(ROOT),  # "+dirty" when the tree was not clean
        "cpu": cpu_info(),
        "arms": arms,
        "rounds": a.rounds,
        "n_per_row": a.n,
        "cores": os.cpu_count(),
        "ray_serve_env": {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")},
        "command": scaffold.command("hops_compare"),
    }
    stem = scaffold.stem("hops-compare", a, meta["date"])
    stamp = stem.removeprefix("hops-compare-")
    lines = [f"# Per-hop cost, {arms['old']} (old) against {arms['new']} (new) — {stamp}", "",
             f"`{meta['command']}`: {a.rounds} rounds in alternating order, {a.n} sequential "
             "requests per row and round, zero-latency simulated engine (`benchmarks/hops.py`).",
             "", "```", json.dumps(meta, indent=2), "```", "",
             "| path | old p50 ms | new p50 ms | p50 new/old | old p99 ms | new p99 ms | "
             "p99 new/old | mean new/old |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row, v in rows.items():
        o, n, q = v["old"], v["new"], v["ratio"]
        lines.append(
            f"| {row} | {o['p50_ms']:.2f} | {n['p50_ms']:.2f} | {q['p50_ms']:.3f} | "
            f"{o['p99_ms']:.2f} | {n['p99_ms']:.2f} | {q['p99_ms']:.3f} | {q['mean_ms']:.3f} |"
        )
    scaffold.finish(a, stem, {"meta": meta, "rows": rows, "runs": runs}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
