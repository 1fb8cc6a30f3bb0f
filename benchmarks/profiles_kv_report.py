"""Report of ``benchmarks.profiles_kv``: goals, the five experiments' tables, a plot.

Rules (stated here so a reader can check them against the JSON):

- Goodput at the p95 SLO (throughput goal): for each baseline load the requests/s of the
  requests whose E2E is within the throughput profile's ``e2e_p95_ms``, counted only
  where that load's E2E p95 meets it; an arm's goodput is its best such load.
- Interactive goal: TTFT p95 of the ``poisson70`` load (Poisson at 70 % of the default
  arm's c32 requests/s), interactive / default.
- Long-context goal: short requests' TTFT p95 in t3 over t1's TTFT p95 (solo), per arm.
- The knee of the KV sweep (t3): the smallest budget with no preemption whose prefix
  hit rate is within KNEE_HIT of the largest budget's.
- "Higher hit rate, worse p95" (experiment 5): every pair of t3 arms where one has a
  prefix hit rate at least HIT_MARGIN higher and a short-request TTFT p95 at least
  P95_MARGIN× the other's.

    .venv/bin/python -m benchmarks.profiles_kv_report docs/benchmarks/profiles-kv-DATE.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from app.profiles.catalog import CATALOGUE
from benchmarks.report_files import write_report

GOAL_GOODPUT, GOAL_INTERACTIVE, GOAL_LONG = 1.3, 0.7, 1.2
KNEE_HIT, HIT_MARGIN, P95_MARGIN = 0.05, 0.02, 1.10
MIB = 1024**2
CHUNK_ARMS = ("lc-nochunk", "long_context", "lc-chunk128", "default")


def _load(doc: dict[str, Any], arm: str, key: str) -> dict[str, Any] | None:
    entry = doc["arms"].get(arm, {}).get("loads", {}).get(key)
    return entry if isinstance(entry, dict) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def goodput(doc: dict[str, Any], arm: str) -> float | None:
    slo_ms = CATALOGUE["throughput"].slo.e2e_p95_ms
    assert slo_ms is not None
    best: float | None = None
    for key, entry in doc["arms"].get(arm, {}).get("loads", {}).items():
        if not key.startswith("c"):
            continue
        a = entry["all"]
        if a["e2e_p95"] is None or a["e2e_p95"] * 1000 > slo_ms or not a["req_per_s"]:
            continue
        good = sum(ms <= slo_ms for ms in a["e2e_all_ms"]) / max(a["requests"], 1)
        rate = a["req_per_s"] * good
        best = rate if best is None else max(best, rate)
    return best


def short_ratio(doc: dict[str, Any], arm: str) -> tuple[float | None, float | None, float | None]:
    t1, t3 = _load(doc, arm, "t1"), _load(doc, arm, "t3")
    solo = t1["all"]["ttft_p95"] if t1 else None
    mixed = t3["short"]["ttft_p95"] if t3 and "short" in t3 else None
    return solo, mixed, _ratio(mixed, solo)


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    g_t, g_d = goodput(doc, "throughput"), goodput(doc, "default")
    out.append(
        {
            "goal": "throughput: goodput at its p95 SLO / default's",
            "limit": f">= {GOAL_GOODPUT}",
            "value": _ratio(g_t, g_d),
            "detail": f"{_f(g_t, 3)} / {_f(g_d, 3)} req/s",
            "met": (r := _ratio(g_t, g_d)) is not None and r >= GOAL_GOODPUT,
        }
    )
    pi, pd = _load(doc, "interactive", "poisson70"), _load(doc, "default", "poisson70")
    ti = pi["all"]["ttft_p95"] if pi else None
    td = pd["all"]["ttft_p95"] if pd else None
    r = _ratio(ti, td)
    out.append(
        {
            "goal": "interactive: TTFT p95 at 70 % of default's capacity / default's",
            "limit": f"<= {GOAL_INTERACTIVE}",
            "value": r,
            "detail": f"{_ms(ti)} / {_ms(td)}",
            "met": r is not None and r <= GOAL_INTERACTIVE,
        }
    )
    solo, mixed, r = short_ratio(doc, "long_context")
    _, _, rd = short_ratio(doc, "default")
    out.append(
        {
            "goal": "long_context: short TTFT p95 under t3 / solo (t1)",
            "limit": f"<= {GOAL_LONG}",
            "value": r,
            "detail": f"{_ms(mixed)} / {_ms(solo)}; default's ratio {_f(rd)}",
            "met": r is not None and r <= GOAL_LONG,
        }
    )
    return out


def sweep(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for arm, res in doc["arms"].items():
        t3 = _load(doc, arm, "t3")
        if t3 is None or not (arm.startswith("lc-kv") or arm == "long_context"):
            continue
        e = t3["engine_metrics"]
        rows.append(
            {
                "arm": arm,
                "kv_mib": res["engine"]["kv_cache_memory_bytes"] / MIB,
                "window": res["engine"]["max_model_len"],
                "hit": e.get("prefix_hit_rate"),
                "preemptions": e.get("preemptions"),
                "kv_max": e.get("kv_usage_max"),
                "waiting_max": e.get("waiting_max"),
                "ttft_p95": t3["all"]["ttft_p95"],
                "short_ttft_p95": t3.get("short", {}).get("ttft_p95"),
                "long_ttft_p95": t3.get("long_doc", {}).get("ttft_p95"),
            }
        )
    rows.sort(key=lambda r: r["kv_mib"])
    return rows


def knee(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not rows or rows[-1]["hit"] is None:
        return None
    top = rows[-1]["hit"]
    for row in rows:
        if row["preemptions"] == 0 and row["hit"] is not None and row["hit"] >= top - KNEE_HIT:
            return row
    return None


def hit_vs_p95(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pts = []
    for arm in doc["arms"]:
        t3 = _load(doc, arm, "t3")
        if t3 and t3["engine_metrics"].get("prefix_hit_rate") is not None and "short" in t3:
            pts.append((arm, t3["engine_metrics"]["prefix_hit_rate"], t3["short"]["ttft_p95"]))
    return [
        {"higher_hit": a, "hit": ha, "p95": pa, "vs": b, "vs_hit": hb, "vs_p95": pb}
        for a, ha, pa in pts
        for b, hb, pb in pts
        if a != b and pa and pb and ha >= hb + HIT_MARGIN and pa >= pb * P95_MARGIN
    ]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _f(v: float | None, d: int = 2) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def markdown(doc: dict[str, Any], image: str) -> str:
    env = doc["environment"]
    model = env.get("model", {})
    lines = [
        f"# Serving profiles on the vLLM CPU engine ({env['date']})",
        "",
        f"Commit `{env['git_commit']}`; {env['cpu_model']}, {env['cpu_count']} cores, "
        f"{env['ram_gib']} GiB; python {env['python']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f". Model {model.get('id')} (sha256 `{model.get('sha256')}`). "
        f"Run: `{doc['command']}`, {doc.get('elapsed_s', 0) // 60} min. Re-run: "
        "`.venv/bin/python -m benchmarks.profiles_kv` (rules: the module docstrings of "
        "benchmarks/profiles_kv.py and benchmarks/profiles_kv_report.py).",
        "",
    ]
    if doc.get("reading"):
        lines += ["**Reading (written after the run, from its numbers).** " + doc["reading"], ""]
    lines += [
        f"![profiles]({image})",
        "",
        "## Goals (ratios on the same engine, one run)",
        "",
        "| goal | limit | value | detail | met |",
        "|---|---|---|---|---|",
    ]
    for g in doc.get("goals", []):
        lines.append(
            f"| {g['goal']} | {g['limit']} | {_f(g['value'])} | {g['detail']} | "
            f"{'yes' if g['met'] else 'no'} |"
        )
    lines += [
        "",
        "## Arms (vLLM's arguments; resolved by Switchyard's builder for the profiles)",
        "",
    ]
    for arm, res in doc["arms"].items():
        err = f" — **failed: {res['error']}**" if res.get("error") else ""
        lines.append(
            f"- `{arm}` ({res['label']}, ready in {res.get('ready_s')} s): "
            f"`{json.dumps(res['engine'], sort_keys=True)}`{err}"
        )
    lines += [
        "",
        "## 1. Baseline table (seed 003 §0.4; 64 in / 32 out, closed loops, two runs)",
        "",
        "| engine | model | precision | concurrency | in/out | run | TTFT p50/p95 ms "
        "| ITL p50/p95 ms "
        "| tok/s | memory (KV budget; RSS) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, res in doc["arms"].items():
        for key, e in res.get("loads", {}).items():
            if not key.startswith("c"):
                continue
            a, conc = e["all"], key.split("-")[0][1:]
            kv = res["engine"].get("kv_cache_memory_bytes", 0) / 1024**3
            lines.append(
                f"| vLLM CPU, `{arm}` | SmolLM2-135M-Instruct | {res['engine'].get('dtype')} "
                f"| {conc} | 64/32 | {key[-1]} | {_ms(a['ttft_p50'])} / {_ms(a['ttft_p95'])} "
                f"| {_ms(a['itl_p50'])} / {_ms(a['itl_p95'])} | {_f(a['output_tok_per_s'], 1)} "
                f"| {kv:.2f} GiB; {e.get('rss_gib')} GiB |"
            )
    lines += [
        "",
        "## 2. Three traffics (seed 003 §3.3), concurrency 8",
        "",
        "| arm | traffic | requests | TTFT p50/p95/p99 ms | short TTFT p95 | long TTFT p95 "
        "| KV usage mean/max | prefix hit | preemptions | waiting mean/max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, res in doc["arms"].items():
        for t in ("t1", "t2", "t3"):
            e = res.get("loads", {}).get(t)
            if not e:
                continue
            a, m = e["all"], e["engine_metrics"]
            lines.append(
                f"| `{arm}` | {t} | {a['requests']} | "
                f"{_ms(a['ttft_p50'])} / {_ms(a['ttft_p95'])} / "
                f"{_ms(a['ttft_p99'])} | {_ms(e.get('short', a)['ttft_p95'])} | "
                f"{_ms(e.get('long_doc', {}).get('ttft_p95'))} | {_pct(m.get('kv_usage_mean'))} / "
                f"{_pct(m.get('kv_usage_max'))} | {_pct(m.get('prefix_hit_rate'))} | "
                f"{m.get('preemptions')} | "
                f"{_f(m.get('waiting_mean'), 1)} / {m.get('waiting_max')} |"
            )
    rows, k = sweep(doc), knee(sweep(doc))
    lines += [
        "",
        "## 3. Where the cache runs out (t3, KV budget sweep)",
        "",
        "| KV budget MiB | window | prefix hit | preemptions | KV max "
        "| TTFT p95 all / short / long ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mark = " **knee**" if k is not None and r["arm"] == k["arm"] else ""
        lines.append(
            f"| {r['kv_mib']:.0f}{mark} | {r['window']} | {_pct(r['hit'])} | {r['preemptions']} | "
            f"{_pct(r['kv_max'])} | {_ms(r['ttft_p95'])} / {_ms(r['short_ttft_p95'])} / "
            f"{_ms(r['long_ttft_p95'])} |"
        )
    lines += [
        "",
        "## 4. Chunked prefill off / on, long-prefill threshold 512 / 128 (t3)",
        "",
        "| arm | short TTFT p95 ms | short ITL p95 ms | long TTFT p95 ms | short TTFT p95 t3/t1 |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm in CHUNK_ARMS:
        t3 = _load(doc, arm, "t3")
        if t3:
            s = t3.get("short", {})
            lines.append(
                f"| `{arm}` | {_ms(s.get('ttft_p95'))} | {_ms(s.get('itl_p95'))} | "
                f"{_ms(t3.get('long_doc', {}).get('ttft_p95'))} | {_f(short_ratio(doc, arm)[2])} |"
            )
    pairs = hit_vs_p95(doc)
    lines += ["", "## 5. Higher prefix-hit rate, worse p95 (t3 arms)", ""]
    lines += [
        f"- `{p['higher_hit']}` hit {_pct(p['hit'])}, short TTFT p95 {_ms(p['p95'])} ms vs "
        f"`{p['vs']}` hit {_pct(p['vs_hit'])}, {_ms(p['vs_p95'])} ms"
        for p in pairs
    ] or [
        f"- no pair of t3 arms with a hit rate ≥ {HIT_MARGIN:.0%} higher and a p95 "
        f"≥ {P95_MARGIN}× worse"
    ]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(13, 9))
    for arm, res in doc["arms"].items():  # 1: baseline
        pts = sorted(
            (int(k.split("-")[0][1:]), v["all"]["output_tok_per_s"] or 0)
            for k, v in res.get("loads", {}).items()
            if k.startswith("c")
        )
        if pts:
            ax[0][0].plot([p[0] for p in pts], [p[1] for p in pts], "o", label=arm)
    ax[0][0].set(
        xscale="log", xlabel="concurrency", ylabel="output tok/s", title="1. baseline (both runs)"
    )
    ax[0][0].legend(fontsize=8)
    names = [
        (a, t) for a in ("default", "long_context") for t in ("t1", "t2", "t3") if _load(doc, a, t)
    ]
    for i, (a, t) in enumerate(names):  # 2: traffics
        e = _load(doc, a, t)
        assert e is not None
        vals = [e["all"][f"ttft_{p}"] or 0 for p in ("p50", "p95", "p99")]
        ax[0][1].bar([i - 0.25, i, i + 0.25], vals, width=0.25, color=["C0", "C1", "C2"])
    ax[0][1].set_xticks(range(len(names)), [f"{a}\n{t}" for a, t in names], fontsize=8)
    for color, label in zip(("C0", "C1", "C2"), ("p50", "p95", "p99"), strict=True):
        ax[0][1].bar([0], [0], color=color, label=f"TTFT {label}")
    ax[0][1].legend(fontsize=8)
    ax[0][1].set(ylabel="TTFT s", title="2. three traffics, concurrency 8")
    rows, k = sweep(doc), knee(sweep(doc))  # 3: sweep
    if rows:
        x = [r["kv_mib"] for r in rows]
        ax[1][0].plot(x, [r["short_ttft_p95"] or 0 for r in rows], "o-", label="short TTFT p95 (s)")
        ax[1][0].plot(x, [r["ttft_p95"] or 0 for r in rows], "s-", label="all TTFT p95 (s)")
        twin = ax[1][0].twinx()
        twin.plot(x, [r["hit"] or 0 for r in rows], "^--", color="C2", label="prefix hit rate")
        twin.plot(
            x,
            [(r["preemptions"] or 0) / 100 for r in rows],
            "v:",
            color="C3",
            label="preemptions / 100",
        )
        twin.legend(loc="upper center", fontsize=8)
        if k is not None:
            ax[1][0].axvline(k["kv_mib"], color="grey", ls="--", label="knee")
        ax[1][0].set(xscale="log", xlabel="KV budget MiB", title="3. t3 against the KV budget")
        ax[1][0].legend(loc="upper right", fontsize=8)
    arms4 = [a for a in CHUNK_ARMS if _load(doc, a, "t3")]
    for i, a in enumerate(arms4):  # 4: chunked
        s = (_load(doc, a, "t3") or {}).get("short", {})
        ax[1][1].bar(
            [i - 0.2, i + 0.2],
            [s.get("ttft_p95") or 0, s.get("itl_p95") or 0],
            width=0.4,
            color=["C0", "C1"],
        )
    ax[1][1].set_xticks(range(len(arms4)), arms4)
    ax[1][1].bar([0], [0], color="C0", label="short TTFT p95")
    ax[1][1].bar([0], [0], color="C1", label="short ITL p95")
    ax[1][1].legend(fontsize=8)
    ax[1][1].set(ylabel="s", title="4. short requests in t3: chunked prefill")
    fig.suptitle(
        f"profiles_kv {doc['environment']['date']} {doc['environment']['git_commit'][:10]}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def scrub(doc: dict[str, Any]) -> dict[str, Any]:
    """No machine paths in a report: the home directory as ``~``, the log dir named."""
    doc["command"] = re.sub(r"--log-dir \S+", "--log-dir <log-dir>", doc["command"])
    text = json.dumps(doc, default=str).replace(str(Path.home()), "~")
    return dict(json.loads(text))


def write(doc: dict[str, Any], out: Path, stem: str) -> None:
    doc = scrub(doc)
    doc["goals"] = goals(doc)
    doc["sweep"], doc["knee"], doc["hit_vs_p95"] = sweep(doc), knee(sweep(doc)), hit_vs_p95(doc)
    out.mkdir(parents=True, exist_ok=True)
    plot(doc, out / f"{stem}.png")
    write_report(out, stem, doc, markdown(doc, f"{stem}.png"))
    print(f"wrote {out / stem}.md", flush=True)


if __name__ == "__main__":  # re-render: REPORT.json [READING.md: the reading, after the run]
    source = Path(sys.argv[1])
    data = json.loads(source.read_text())
    if len(sys.argv) > 2:
        data["reading"] = Path(sys.argv[2]).read_text().strip()
    write(data, source.parent, source.stem)
