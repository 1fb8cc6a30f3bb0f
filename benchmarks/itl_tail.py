"""Where the inter-token tail goes: every token's arrival at concurrency 1, bare vLLM
against Switchyard as `make run` serves it (HAProxy in front of the ingress), side by
side in one run, with the same engine settings (``benchmarks.serving_tax``'s servers),
and the CPU of every Switchyard process sampled while the tokens stream.

Rule. Each arm streams ``--requests`` chat completions of ``--tokens`` tokens one after
another (``ignore_eos``; every token is its own SSE event), ``--rounds`` rounds in
alternating order. A token's gap is the time from the previous content chunk of the
same stream. A *stall* is a gap longer than ``STALL_X`` × the arm's median gap. For the
stalls of each arm the report gives: the gap percentiles and the ratio to bare vLLM;
how periodic the stalls are for each candidate period P (the mean resultant length R
of their end times' phases t mod P: 1 = every stall at the same phase, ~0 = none, with
the periods of Switchyard's and Ray's periodic work as candidates); and where a long
gap is first seen: each server's own ITL histograms, differenced over the arm
(``itl_buckets``), count the gaps the engine already had (vLLM's, at the replica) and
those the ingress saw (Switchyard's).

After the rounds, one more pass per server runs with a CPU sampler (every
``SAMPLE_S``, per process of the server, grouped as ``benchmarks.serving_tax.role``
groups them): each process's share of a core during that pass's stalls against its
share over the pass, the processes that burn CPU while the tokens wait. The sampler
reads /proc for every process of the server (about 35 for Switchyard, 3 for bare
vLLM) and so perturbs what it watches (it tripled Switchyard's p99 in one run):
its passes are reported apart ("(sampled)") and never enter the ratios.

Both servers run at once, as in ``serving_tax`` (the idle one's background work is
part of what the other shares the box with: on 2 cores, which is the point).

Usage: python -m benchmarks.itl_tail [--requests 12] [--tokens 128] [--rounds 2] [--tag T]
writes docs/benchmarks/itl-tail-<date>[-T].json/.md/.png.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from app.stats import percentile
from benchmarks import scaffold
from benchmarks.serving_lib import (
    MODEL_ID,
    Server,
    environment,
    prepared_model_dir,
)
from benchmarks.serving_tax import (
    _cpu,
    chat_replica_pids,
    role,
    server_procs,
    stop,
    switchyard_server,
    vllm_server,
)

STALL_X = 2.0  # a gap over this × the arm's median gap is a stall
SAMPLE_S = 0.05  # CPU sampler period
# Candidate periods (s): Ray Serve's control loop (0.1 as shipped), replica metrics
# (0.5), the engine-stats publisher (2, app.serving.engine_metrics), the route snapshot
# refresh (5, route_refresh_s), Ray's metrics export (10).
PERIODS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)


def log(message: str) -> None:
    print(f"[itl-tail] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Sampler:
    """CPU seconds of each process of ``server`` every ``SAMPLE_S``, in a thread."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        procs = server_procs(self.server)
        chat = chat_replica_pids(procs)
        names: dict[int, str] = {}
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                group, name = role(proc, chat, "haproxy")
                names[proc.pid] = f"{group}/{name}"
        while not self._stop.wait(SAMPLE_S):
            now = time.monotonic()
            cpu: dict[str, float] = defaultdict(float)
            for proc in procs:
                with contextlib.suppress(psutil.Error, OSError):
                    cpu[names[proc.pid]] += _cpu(proc)
            self.samples.append((now, dict(cpu)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def shares(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """Each process name's share of one core over the sample intervals that overlap
        ``windows`` (all intervals when ``windows`` is empty)."""
        used: dict[str, float] = defaultdict(float)
        seconds = 0.0
        for (t0, a), (t1, b) in zip(self.samples, self.samples[1:], strict=False):
            if t1 - t0 > 10 * SAMPLE_S:  # between two rounds' samplers
                continue
            if windows and not any(s < t1 and t0 < e for s, e in windows):
                continue
            seconds += t1 - t0
            for name, value in b.items():
                used[name] += value - a.get(name, value)
        return {k: v / seconds for k, v in sorted(used.items())} if seconds else {}


def stream_gaps(url: str, tokens: int, request: int) -> list[tuple[float, float]]:
    """(arrival time, gap) of every content chunk after the first of one stream."""
    body = {"model": MODEL_ID, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0.0, "messages": [{"role": "user", "content":
            f"Request {request}: tell a long story about a freight train."}]}  # fmt: skip
    out: list[tuple[float, float]] = []
    last: float | None = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if not choices[0].get("delta", {}).get("content"):
                continue
            now = time.monotonic()
            if last is not None:
                out.append((now, now - last))
            last = now
    return out


def resultant(times: list[float], period: float) -> float:
    """Mean resultant length of the phases of ``times`` modulo ``period`` (0..1)."""
    if not times:
        return 0.0
    c = sum(math.cos(2 * math.pi * t / period) for t in times)
    s = sum(math.sin(2 * math.pi * t / period) for t in times)
    return math.hypot(c, s) / len(times)


# Where a stall is first seen, from the servers' own ITL histograms (GET /metrics),
# differenced over each arm: vLLM's engine-side ``vllm:inter_token_latency_seconds``
# (measured as the replica's output processor receives each token; Ray's export is
# seconds behind, hence METRICS_WAIT_S) and Switchyard's ingress-side
# ``switchyard_inter_token_latency_seconds``. A gap counted by the client but not by the
# engine arose after the engine; one the engine counts too arose at or before it.
METRICS_WAIT_S = 12.0
SHORT = 0.01  # and gaps at or under this (s): bunched tokens, at the nearest bucket ≤
OVER = (0.3, 1.0)  # report gaps over these (s), at each histogram's nearest bucket ≥


def itl_buckets(url: str) -> dict[str, dict[float, float]]:
    """``parse_itl`` of ``url``/metrics ({} when the page cannot be read)."""
    try:
        return parse_itl(httpx.get(url + "/metrics", timeout=30).text)
    except httpx.HTTPError:
        return {}


def parse_itl(text: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts of each ITL histogram in a Prometheus page, summed over
    its label sets, by side: ``engine`` (a vLLM family), ``ingress`` (Switchyard's)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.endswith("inter_token_latency_seconds"):
            continue
        side = out.setdefault("engine" if "vllm" in family.name else "ingress", {})
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                side[le] = side.get(le, 0.0) + sample.value
    return out


def over_counts(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
                ) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per side: the arm's gap count; for each threshold of OVER, how many of its gaps
    exceeded the histogram's nearest bucket bound at or above it; and how many were at
    most the nearest bound at or under SHORT (bunched tokens)."""
    out: dict[str, dict[str, float]] = {}
    for side, buckets in after.items():
        diff = {le: v - before.get(side, {}).get(le, 0.0) for le, v in buckets.items()}
        total = diff.get(math.inf, 0.0)
        row = {"gaps": total}
        for x in OVER:
            bound = min(le for le in diff if le >= x)
            row[f">{x:g}s"] = total - diff[bound]
            row[f"bound_{x:g}"] = bound
        short = max((le for le in diff if le <= SHORT), default=None)
        row["short"] = diff[short] if short is not None else math.nan
        row["bound_short"] = short if short is not None else math.nan
        out[side] = row
    return out


def summarize(gaps: list[tuple[float, float]], sampler: Sampler | None) -> dict[str, Any]:
    values = [g for _, g in gaps]
    median = statistics.median(values)
    stalls = [(t, g) for t, g in gaps if g > STALL_X * median]
    out: dict[str, Any] = {
        "tokens": len(values),
        **{f"p{q:g}_ms": (percentile(values, q) or 0.0) * 1e3 for q in (50, 90, 99, 99.9)},
        "max_ms": max(values) * 1e3,
        "stalls": len(stalls),
        "stall_excess_s": sum(g - median for _, g in stalls),
        "periodicity": {f"{p:g}": resultant([t for t, _ in stalls], p) for p in PERIODS},
        "top": [round(g * 1e3, 1) for _, g in sorted(stalls, key=lambda x: -x[1])[:10]],
        **{f">{x:g}s": sum(v > x for v in values) for x in OVER},
        "short": sum(v <= SHORT for v in values),
    }
    if sampler is not None:
        windows = [(t - g, t) for t, g in stalls]
        out["cpu_share_all"] = sampler.shares([])
        out["cpu_share_stalls"] = sampler.shares(windows) if windows else {}
    return out


def plot(gaps: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for arm, rows in gaps.items():
        t0 = rows[0][0] if rows else 0.0
        ax.scatter([t - t0 for t, _ in rows], [g * 1e3 for _, g in rows], s=4, label=arm)
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the arm's measured window")
    ax.set_ylabel("inter-token gap (ms)")
    ax.set_title("Every token's gap at concurrency 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(doc: dict[str, Any], image: str) -> str:
    arms = doc["arms"]
    lines = [f"# Inter-token tail at concurrency 1 — {doc['stamp']}", "",
             f"`{doc['command']}`; {doc['params']['requests']} streams of "
             f"{doc['params']['tokens']} tokens per arm and round, {doc['params']['rounds']} "
             "rounds in alternating order; both servers up at once (module docstring of "
             "`benchmarks/itl_tail.py`); a \"(sampled)\" row is the extra pass under the CPU "
             "sampler, its ratio against bare vLLM's sampled pass.", "", f"![gaps]({image})", "",
             "| arm | tokens | p50 ms | p90 ms | p99 ms (× bare) | p99.9 ms | max ms | stalls "
             "| stall excess s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, a in arms.items():
        bare = arms[arm.replace("switchyard", "vllm")]["p99_ms"]
        lines.append(
            f"| {arm} | {a['tokens']} | {a['p50_ms']:.1f} | {a['p90_ms']:.1f} | "
            f"{a['p99_ms']:.1f} ({a['p99_ms'] / bare:.2f}×) | {a['p99.9_ms']:.1f} | "
            f"{a['max_ms']:.1f} | {a['stalls']} | {a['stall_excess_s']:.2f} |"
        )
    lines += ["", f"Periodicity of the stalls (mean resultant length R of their phases; "
              f"1 = all at one phase; {len(PERIODS)} candidate periods):", "",
              "| arm | " + " | ".join(f"{p:g} s" for p in PERIODS) + " |",
              "|---|" + "---|" * len(PERIODS)]  # fmt: skip
    for arm, a in arms.items():
        lines.append(f"| {arm} | " + " | ".join(f"{v:.2f}" for v in a["periodicity"].values())
                     + " |")  # fmt: skip
    lines += ["", "Where the long gaps are first seen: the client's count against the "
              "servers' own ITL histograms over the same arm (engine: vLLM's, as the "
              "replica's output processor gets each token; ingress: Switchyard's; a "
              "histogram counts over its nearest bucket bound ≥ the threshold):", "",
              "| arm | where | gaps | " + " | ".join(f"> {x:g} s" for x in OVER)
              + f" | ≤ {SHORT * 1e3:g} ms (bunched) |",
              "|---|---|---|" + "---|" * (len(OVER) + 1)]  # fmt: skip
    for arm, a in arms.items():
        lines.append(f"| {arm} | client | {a['tokens']} | "
                     + " | ".join(str(a[f">{x:g}s"]) for x in OVER)
                     + f" | {a.get('short', '-')} |")  # fmt: skip
        for side, row in a["sides"].items():
            cells = " | ".join(f"{row[f'>{x:g}s']:.0f} (> {row[f'bound_{x:g}']:g})"
                               for x in OVER)  # fmt: skip
            short = row.get("short", math.nan)
            shown = "-" if math.isnan(short) else f"{short:.0f} (≤ {row['bound_short']:g})"
            lines.append(f"| {arm} | {side} | {row['gaps']:.0f} | {cells} | {shown} |")
    for arm, a in arms.items():
        if "cpu_share_all" not in a:
            continue
        lines += ["", f"{arm}'s processes, share of one core: over the whole arm and "
                  "during its stalls:", "", "| process | whole arm | during stalls | × |",
                  "|---|---|---|---|"]  # fmt: skip
        rows = sorted(a["cpu_share_all"].items(), key=lambda kv: -kv[1])
        for name, whole in rows:
            during = a["cpu_share_stalls"].get(name)
            ratio = f"{during / whole:.1f}" if during is not None and whole > 0 else "-"
            shown = f"{during:.3f}" if during is not None else "-"
            lines.append(f"| {name} | {whole:.3f} | {shown} | {ratio} |")
    lines += ["", "```", json.dumps(doc["meta"], indent=1, default=str)[:4000], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model_dir = prepared_model_dir()
    gaps: dict[str, list[tuple[float, float]]] = defaultdict(list)
    samplers: dict[str, list[Sampler]] = defaultdict(list)
    sides: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)

    def measure(arm: str, server: Server, sample: bool) -> None:
        """``args.requests`` streams on ``server`` into ``arm``'s rows."""
        log(f"{arm}: {args.requests} streams")
        url = server.base_url
        before = itl_buckets(url)
        with Sampler(server) if sample else contextlib.nullcontext() as sampler:
            for i in range(args.requests):
                gaps[arm] += stream_gaps(url, args.tokens, i)
        if sampler is not None:
            samplers[arm].append(sampler)
        time.sleep(METRICS_WAIT_S)
        for side, row in over_counts(before, itl_buckets(url)).items():
            kept = sides[arm].setdefault(side, {})
            for key, value in row.items():
                kept[key] = value if key.startswith("bound") else kept.get(key, 0.0) + value

    with tempfile.TemporaryDirectory(prefix="itl-tail-") as tmp:
        servers = {"vllm": vllm_server(model_dir, Path(tmp)),
                   "switchyard": switchyard_server(Path(tmp), haproxy=True)}  # fmt: skip
        try:
            for server in servers.values():
                server.start()
            for name, server in servers.items():
                log(f"{name}: ready after {server.wait_ready():.0f} s")
                for i in range(2):  # warm-up
                    stream_gaps(server.base_url, 16, 1000 + i)
            for r in range(args.rounds):
                order = ("vllm", "switchyard") if r % 2 == 0 else ("switchyard", "vllm")
                for arm in order:
                    log(f"round {r + 1}/{args.rounds}")
                    measure(arm, servers[arm], sample=False)
            for arm in ("vllm", "switchyard"):  # the CPU attribution: a pass of its own
                measure(f"{arm} (sampled)", servers[arm], sample=True)
        finally:
            for server in servers.values():
                stop(server)
    arms = {}
    for arm, rows in gaps.items():
        merged = None
        if samplers[arm]:
            merged = Sampler.__new__(Sampler)
            merged.samples = [s for sm in samplers[arm] for s in sm.samples]
        arms[arm] = summarize(rows, merged) | {"sides": sides[arm]}
    stem = scaffold.stem("itl-tail", args, datetime.now(UTC).date().isoformat())
    stamp = stem.removeprefix("itl-tail-")
    doc = {
        "stamp": stamp,
        "command": scaffold.command("itl_tail"),
        "params": vars(args)
        | {"out": scaffold.shown(args.out), "stall_x": STALL_X, "sample_s": SAMPLE_S},
        "meta": environment(model_dir),
        "arms": arms,
    }
    text = markdown(doc, f"{stem}.png")
    shown = {arm: gaps[arm] for arm in ("vllm", "switchyard")}
    scaffold.finish(args, stem, doc, text, lambda png: plot(shown, png))
    print(text)


if __name__ == "__main__":
    main()
