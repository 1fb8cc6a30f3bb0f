"""The serving tax: CPU per streamed token outside the engine, bare vLLM's OpenAI server
vs Switchyard as `make run` serves it, side by side in one run.

    python -m benchmarks.serving_tax [--rounds 2] [--prompts 48] [--concurrency 16] [--haproxy]
                                     [--haproxy-only] [--limits]

Both servers run at once (an idle engine costs nothing), with the same engine settings
(serve_configs/local.yaml's: SmolLM2 in float32, LoRA slots, 2048-token window, 1 GiB
of KV, 32 sequences): bare vLLM as ``python -m vllm.entrypoints.openai.api_server``,
Switchyard as ``switchyard serve`` on local.yaml (its embedding model included, idle).
The client is vLLM's own benchmark client (``vllm.benchmarks.serve``, in a process of its
own): 64-token random prompts, 128-token streams with ``ignore_eos``, a closed loop at
``--concurrency``. The arms run in alternating order each round (a drift of this
machine's speed hits every arm alike):

- ``vllm``: bare vLLM's server;
- ``proxy``: Switchyard through Ray Serve's HTTP proxy (the port `make run` prints);
- ``direct``: Switchyard through the ingress replica's own HTTP port (Ray Serve's direct
  ingress, on in the throughput-optimized mode; what a load balancer in front of the
  replicas hits);
- ``haproxy`` (``--haproxy``, a second phase: its own Ray instance): Switchyard exactly as
  `make run` runs it, Ray Serve's HAProxy data plane on the HTTP port forwarding to the
  ingress replica's own port;
- ``limits`` (``--limits``): the same server, each request with a key carrying every
  limit (rpm, tpm, concurrency, daily and monthly tokens and USD) at its tenant, team,
  user and on the key, set far above the load (the store: SQLite, as local.yaml).

Each process's CPU seconds (utime + stime from /proc) over each measured window are
grouped by role: ``engine`` (vLLM's EngineCore/Worker processes of the chat model),
``path`` (bare: the API server; Switchyard: ingress, proxy and the chat model's
LLMServer replica — it hosts vLLM's AsyncLLM front end, as the API server does),
``control`` (everything else of the server: Ray's controller, GCS, raylet, dashboard,
agents, the model router, the idle embedding model's replica and engine, the
driver). Divided by the tokens streamed in the window. Afterwards a concurrency-1 run
per arm (ITL: every token its own event) and an idle window (no traffic) per server.
Writes docs/benchmarks/serving-tax-<date>.md/.json/.png.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import yaml

from app.cli.serve import RAY_ENV
from benchmarks import scaffold
from benchmarks.serving_lib import (
    KV_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_ID,
    REPO,
    Server,
    _free_port,
    environment,
    prepared_model_dir,
)

PROMPT_TOKENS, OUTPUT_TOKENS = 64, 128
IDLE_S = 30.0
TICKS = os.sysconf("SC_CLK_TCK")
CLIENT = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)


def log(message: str) -> None:
    print(f"[serving-tax] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes
def _cpu(proc: psutil.Process) -> float:
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _title(proc: psutil.Process) -> str:
    return " ".join(proc.cmdline())


def role(proc: psutil.Process, chat_replicas: set[int], arm: str = "") -> tuple[str, str]:
    """(group, name) of one process of a server while ``arm`` is measured: Ray's HTTP
    proxy is on the path only of the ``proxy`` arm (elsewhere it idles beside it)."""
    title, comm = _title(proc), proc.name()
    is_engine = "EngineCor" in comm or "VLLM::Worker" in comm or "EngineCore" in title
    if is_engine:
        parents = {p.pid for p in proc.parents()}
        if chat_replicas and not parents & chat_replicas:
            return "control", "idle engine (embedding)"
        return "engine", "engine"
    if "vllm.entrypoints.openai.api_server" in title:
        return "path", "api server"
    if "OpenAiIngress" in title:
        return "path", "ingress"
    if comm == "haproxy":
        return "path", "haproxy"
    if "ProxyActor" in title:
        return ("path" if arm == "proxy" else "control"), "ray http proxy"
    if proc.pid in chat_replicas:
        return "path", "llm replica"
    if "ServeReplica" in title and "LLMServer" in title:
        return "control", "idle replica (embedding)"
    for part, name in (("ServeController", "controller"), ("gcs_server", "gcs"),
                       ("raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
                       ("runtime_env/agent", "runtime-env agent"),
                       ("dashboard/dashboard.py", "dashboard"), ("log_monitor", "log monitor"),
                       ("monitor.py", "autoscaler monitor"), ("ModelRouter", "router"),
                       ("switchyard serve", "driver")):  # fmt: skip
        if part in title:
            return "control", name
    return "control", "other: " + (Path(title.split()[0]).name if title else comm)[:40]


def server_procs(server: Server) -> list[psutil.Process]:
    """Every live process of a server: its process session (Ray's included), and the
    sessions its direct children lead (`switchyard serve`'s supervisor starts the
    serving process, Ray's driver, in a session of its own)."""
    assert server.proc is not None
    sessions = {server.proc.pid}
    with contextlib.suppress(psutil.Error):
        sessions |= {c.pid for c in psutil.Process(server.proc.pid).children()}
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) in sessions:
                out.append(proc)
    return out


def chat_replica_pids(procs: list[psutil.Process]) -> set[int]:
    found = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            title = _title(proc)
            if "ServeReplica" in title and "LLMServer" in title and "MiniLM" not in title:
                found.add(proc.pid)
    return found


class Meter:
    """CPU seconds of a server's processes, by (group, name), over a window."""

    def __init__(self, server: Server, arm: str = "") -> None:
        self.server, self.arm = server, arm
        self.start: dict[int, float] = {}
        self.procs: dict[int, psutil.Process] = {}

    def __enter__(self) -> Meter:
        self.started = time.monotonic()
        for proc in server_procs(self.server):
            with contextlib.suppress(psutil.Error, OSError):
                self.start[proc.pid] = _cpu(proc)
                self.procs[proc.pid] = proc
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.started
        self.cpu: dict[str, float] = defaultdict(float)
        procs = server_procs(self.server)
        chat = chat_replica_pids(procs)
        for proc in procs:
            with contextlib.suppress(psutil.Error, OSError):
                group, name = role(proc, chat, self.arm)
                self.cpu[f"{group}/{name}"] += _cpu(proc) - self.start.get(proc.pid, 0.0)


# --------------------------------------------------------------------------- servers
def vllm_server(model_dir: Path, log_dir: Path) -> Server:
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", MODEL_ID, "--dtype", "float32",
           "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(KV_BYTES),
           "--max-num-seqs", str(MAX_NUM_SEQS), "--enforce-eager", "--enable-lora",
           "--max-loras", "4", "--max-cpu-loras", "8", "--max-lora-rank", "16",
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return Server("vllm", cmd, port, log_dir, _env(log_dir))


def switchyard_server(
    log_dir: Path, haproxy: bool = False, tree: Path = REPO, name: str | None = None
) -> Server:
    """`make run`'s command on local.yaml, on a free port: with ``haproxy`` exactly as
    `make run` runs it (Ray Serve's HAProxy data plane in front of the ingress replicas),
    else with Ray Serve's Python HTTP proxy there instead. ``tree``: the checkout whose
    code and local.yaml it runs (another commit's worktree for ``--old``)."""
    name = name or ("haproxy" if haproxy else "switchyard")
    port = _free_port()
    config = yaml.safe_load((tree / "serve_configs" / "local.yaml").read_text())
    config["http_options"]["port"] = port
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [str(Path(sys.executable).parent / "switchyard"), "serve", str(path)]
    env = {**_env(log_dir), **RAY_ENV}  # as `switchyard serve` sets it: HAProxy on
    if tree != REPO:  # its code first on every process's path (Ray's workers inherit it)
        env["PYTHONPATH"] = str(tree)
    if not haproxy:
        env["RAY_SERVE_ENABLE_HA_PROXY"] = "0"
    return Server(name, cmd, port, log_dir, env, cwd=tree)


def _env(log_dir: Path) -> dict[str, str]:
    return {**os.environ, "VLLM_CACHE_ROOT": str(log_dir / "vllm-cache"),
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}  # fmt: skip


def direct_port(server: Server) -> int:
    """The HTTP port the ingress replica listens on itself (direct ingress)."""
    for proc in server_procs(server):
        with contextlib.suppress(psutil.Error):
            if "OpenAiIngress" not in _title(proc):
                continue
            listening = [c.laddr.port for c in proc.net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN]  # fmt: skip
            ports = sorted(p for p in listening if 30000 <= p < 31000)
            if ports:
                return ports[0]
    raise RuntimeError("no direct-ingress port on the ingress replica")


# --------------------------------------------------------------------------- the client
def bench(url: str, model_dir: Path, concurrency: int, prompts: int, seed: int, out: Path,
          meter: Meter | None = None, *, output_tokens: int = OUTPUT_TOKENS,
          rate: float | None = None, api_key: str | None = None) -> Any:  # fmt: skip
    """One run of vLLM's benchmark client; its result JSON. ``meter`` measures the main
    run only: from the client's "Starting main benchmark run" to its results (not its
    start-up nor its one-request test run). ``rate``: Poisson arrivals at that many
    requests per second (the client's ``--request-rate``), ``concurrency`` then a cap.
    ``api_key``: sent as the bearer key (the client reads ``OPENAI_API_KEY``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", CLIENT, "--backend", "openai-chat", "--base-url", url,
           "--endpoint", "/v1/chat/completions", "--model", MODEL_ID,
           "--tokenizer", str(model_dir), "--dataset-name", "random",
           "--random-input-len", str(PROMPT_TOKENS), "--random-output-len", str(output_tokens),
           "--ignore-eos", "--max-concurrency", str(concurrency), "--num-prompts", str(prompts),
           "--seed", str(seed), "--disable-tqdm", "--save-result",
           "--result-dir", str(out.parent), "--result-filename", out.name,
           "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99"]  # fmt: skip
    if rate is not None:
        cmd += ["--request-rate", f"{rate:.4f}"]
    env = _env(out.parent)
    if api_key is not None:
        env["OPENAI_API_KEY"] = api_key
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    assert proc.stdout is not None
    lines, state = [], "before"
    for line in proc.stdout:
        lines.append(line)
        if meter is not None and state == "before" and "Starting main benchmark run" in line:
            meter.__enter__()
            state = "measuring"
        elif meter is not None and state == "measuring" and "Successful requests" in line:
            meter.__exit__()
            state = "done"
    if proc.wait() != 0 or state == "measuring":
        raise RuntimeError("benchmark client failed:\n" + "".join(lines[-60:]))
    return json.loads(out.read_text())


SUMMARY = ("completed", "failed", "total_output_tokens", "duration", "output_throughput",
           "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms",
           "median_e2el_ms")  # fmt: skip


def measured(arm: str, a: Arm, model_dir: Path, args: argparse.Namespace, seed: int,
             out: Path) -> dict[str, Any]:  # fmt: skip
    meter = Meter(a.server, arm)
    result = bench(a.url, model_dir, args.concurrency, args.prompts, seed, out, meter,
                   api_key=a.key)  # fmt: skip
    tokens = int(result["total_output_tokens"])
    groups: dict[str, float] = defaultdict(float)
    for key, seconds in meter.cpu.items():
        groups[key.split("/")[0]] += seconds
    return {
        **{k: result.get(k) for k in SUMMARY},
        "cpu_s": dict(meter.cpu),
        "us_per_token": {k: 1e6 * v / tokens for k, v in meter.cpu.items()},
        "group_us_per_token": {k: 1e6 * v / tokens for k, v in groups.items()},
    }


def profile(arm: str, a: Arm, model_dir: Path, args: argparse.Namespace,
            work: Path) -> dict[str, Any]:  # fmt: skip
    """py-spy samples of the path processes over one more (unmeasured) window, of the
    thread holding the GIL only (Python's own work; C code that released the GIL is not
    seen): the functions where each spends that time, by share of samples (inclusive
    and self)."""
    spy = str(Path(sys.executable).parent / "py-spy")
    procs = server_procs(a.server)
    chat = chat_replica_pids(procs)
    targets = {
        name: p.pid for p in procs for group, name in [role(p, chat, arm)] if group == "path"
    }
    recorders = {}
    for name, pid in targets.items():
        out = work / f"profile-{name.replace(' ', '-')}.txt"
        cmd = [spy, "record", "--gil", "--nonblocking", "--format", "raw", "--rate", "50",
               "--pid", str(pid), "-o", str(out)]  # fmt: skip
        recorders[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL), out)  # fmt: skip
    time.sleep(1.0)
    bench(a.url, model_dir, args.concurrency, args.prompts, 55, work / "profiled.json",
          api_key=a.key)  # fmt: skip
    tops: dict[str, Any] = {}
    for name, (rec, out) in recorders.items():
        rec.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            rec.wait(timeout=60)
        tops[name] = top_functions(out.read_text() if out.exists() else "")
    return tops


def top_functions(raw: str, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: the ``n`` functions with the largest inclusive
    and self shares of the samples."""
    inclusive: dict[str, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (")[0] for f in stack.split(";")]
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    if not total:
        return {"inclusive": [], "self": []}

    def best(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]]

    return {"inclusive": best(inclusive), "self": best(own)}


class Arm(NamedTuple):
    server: Server
    url: str
    key: str | None = None  # the bearer key its requests carry (None: anonymous)


def _arms(servers: dict[str, Server], limits_key: str | None = None) -> dict[str, Arm]:
    arms = {"vllm": Arm(servers["vllm"], servers["vllm"].base_url)}
    if "switchyard" in servers:
        sw = servers["switchyard"]
        arms["proxy"] = Arm(sw, sw.base_url)
        arms["direct"] = Arm(sw, f"http://127.0.0.1:{direct_port(sw)}")
    if "old" in servers:
        arms["old"] = Arm(servers["old"], servers["old"].base_url)
    if "haproxy" in servers:
        arms["haproxy"] = Arm(servers["haproxy"], servers["haproxy"].base_url)
        if limits_key is not None:  # the same server, each request with a limited key
            arms["limits"] = Arm(servers["haproxy"], servers["haproxy"].base_url, limits_key)
    return arms


def phase(servers: dict[str, Server], args: argparse.Namespace, model_dir: Path, work: Path,
          tag: str, limits_key: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The started ``servers``' arms: warm-up, alternating measured rounds at
    ``--concurrency``, a concurrency-1 run per arm, an idle window per server."""
    arms = _arms(servers, limits_key)
    for name, a in arms.items():
        log(f"warm-up {name} ({a.url})")
        warm = work / f"warm-{tag}{name}.json"
        bench(a.url, model_dir, args.concurrency, args.concurrency, 1, warm, api_key=a.key)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            log(f"round {r + 1}/{args.rounds}: {name}, concurrency {args.concurrency}")
            got = measured(name, arms[name], model_dir, args, 100 + r,
                           work / f"{tag}r{r}-{name}.json")  # fmt: skip
            log(f"  {got['output_throughput']:.1f} tok/s, path "
                f"{got['group_us_per_token'].get('path', 0):.0f} us/token")  # fmt: skip
            rounds.append({"round": r, "arm": name, **got})
    single: dict[str, Any] = {}
    for name, a in arms.items():
        log(f"concurrency 1: {name}")
        res = bench(a.url, model_dir, 1, args.single_prompts, 7,
                    work / f"{tag}c1-{name}.json", api_key=a.key)  # fmt: skip
        single[name] = {k: res.get(k) for k in SUMMARY}
    profiles: dict[str, Any] = {}
    if args.profile:
        for name in ("direct", "haproxy", "limits"):
            if name in arms:
                log(f"profiling the path of {name}")
                profiles[name] = profile(name, arms[name], model_dir, args, work)
    log(f"idle window {IDLE_S:.0f}s")
    meters = {name: Meter(server) for name, server in servers.items()}
    for meter in meters.values():
        meter.__enter__()
    time.sleep(IDLE_S)
    idle = {}
    for name, meter in meters.items():
        meter.__exit__()
        outside = sum(v for k, v in meter.cpu.items() if not k.startswith("engine/"))
        idle[name] = {"core_share_outside_engine": outside / IDLE_S, "cpu_s": dict(meter.cpu)}
    return {"rounds": rounds, "concurrency_1": single, "idle": idle, "profiles": profiles}


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Phase 1: bare vLLM, Switchyard through the proxy and direct. Phase 2
    (``--haproxy``): bare vLLM again and Switchyard with Ray's HAProxy data plane (its
    own Ray instance, so the first Switchyard stops first)."""
    model_dir = prepared_model_dir()
    vllm = vllm_server(model_dir, work)
    plan: list[dict[str, Server]] = []
    if not args.haproxy_only:
        plan.append({"vllm": vllm, "switchyard": switchyard_server(work)})
    limits_key = None
    if args.haproxy or args.haproxy_only or args.limits:
        haproxy = switchyard_server(work, haproxy=True)
        if args.limits:
            state_url = f"sqlite:///{work / 'limits-state.db'}"
            haproxy.env["SWITCHYARD_STATE_URL"] = state_url
            limits_key = limited_key(state_url)
        plan.append({"vllm": vllm, "haproxy": haproxy})
    if args.old:
        tree = work / "old-tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), args.old],
                       cwd=REPO, check=True)  # fmt: skip
        plan.append({"vllm": vllm, "old": switchyard_server(work, True, tree, "old")})
    phases = []
    try:
        for i, servers in enumerate(plan):
            for server in servers.values():
                if server.proc is None:
                    log(f"starting {server.name}")
                    server.start()
                    log(f"{server.name} ready in {server.wait_ready(900):.0f}s")
            key = limits_key if "haproxy" in servers else None
            phases.append(phase(servers, args, model_dir, work, f"p{i}-", key))
            for name, server in servers.items():
                if name != "vllm":
                    stop(server)
    finally:
        for servers in plan:
            for server in servers.values():
                stop(server)
        if args.old:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "old-tree")],
                           cwd=REPO, check=False)  # fmt: skip
    return phases


# Every limit a key can carry, at its tenant, team, user and on the key itself, each set
# far above what a run asks for: every request pays every check, none is refused.
LIMITS = ["--rpm", "1000000", "--tpm", "1000000000", "--max-concurrent", "10000",
          "--daily-tokens", "1000000000000", "--monthly-tokens", "1000000000000",
          "--daily-usd", "1000000", "--monthly-usd", "1000000"]  # fmt: skip


def limited_key(state_url: str) -> str:
    """A key of tenant ``bench`` (team ``t``, user ``u``) carrying the full limit set at
    every scope, written to ``state_url`` with Switchyard's own CLI."""
    exe = str(Path(sys.executable).parent / "switchyard")
    url = ["--state-url", state_url]

    def cli(*argv: str) -> str:
        done = subprocess.run([exe, *argv, *url], cwd=REPO, capture_output=True, text=True,
                              check=True)  # fmt: skip
        return done.stdout.strip()

    cli("tenants", "create", "bench", *LIMITS)
    cli("limits", "set", "--tenant", "bench", "--team", "t", *LIMITS)
    cli("limits", "set", "--tenant", "bench", "--user", "u", *LIMITS)
    return cli("keys", "create", "--tenant", "bench", "--team", "t", "--user", "u",
               "--name", "serving-tax", *LIMITS).splitlines()[-1]  # fmt: skip


def stop(server: Server) -> None:
    """Stop a server and whatever of its session outlived its process group (Ray's
    workers are in groups of their own; an HAProxy child whose manager died first)."""
    procs = server_procs(server) if server.proc is not None else []
    server.stop()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


# --------------------------------------------------------------------------- report
def _mean(rows: list[dict[str, Any]], arm: str, pick: Any) -> float:
    vals = [pick(r) for r in rows if r["arm"] == arm]
    return sum(vals) / len(vals) if vals else float("nan")


ARMS = ["vllm", "proxy", "direct", "old", "haproxy", "limits"]


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """One phase's means by arm."""
    rows = result["rounds"]
    arms = sorted({r["arm"] for r in rows}, key=ARMS.index)
    out: dict[str, Any] = {}
    for arm in arms:
        names = sorted({k for r in rows if r["arm"] == arm for k in r["us_per_token"]})
        out[arm] = {
            "tok_s": _mean(rows, arm, lambda r: r["output_throughput"]),
            "groups": {
                g: _mean(rows, arm, lambda r, g=g: r["group_us_per_token"].get(g, 0.0))
                for g in ("path", "control", "engine")
            },
            "processes": {
                n: _mean(rows, arm, lambda r, n=n: r["us_per_token"].get(n, 0.0)) for n in names
            },
            "itl_p50_ms": _mean(rows, arm, lambda r: r["median_itl_ms"]),
            "failed": sum(r["failed"] for r in rows if r["arm"] == arm),
        }
    return out


def plot(phases: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, path_us, control_us = [], [], []
    for i, s in enumerate(phases):
        for arm, a in s.items():
            labels.append(f"{arm}\n(phase {i + 1})")
            path_us.append(a["groups"]["path"])
            control_us.append(a["groups"]["control"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(labels, path_us, label="path", color="tab:red")
    ax.bar(labels, control_us, bottom=path_us, label="control plane", color="tab:gray")
    ax.set_ylabel("CPU µs per streamed token (outside the engine)")
    ax.set_title("Serving tax: CPU per token outside the engine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _phase_report(i: int, s: dict[str, Any], res: dict[str, Any]) -> list[str]:
    bare = s["vllm"]["groups"]["path"]
    lines = [
        f"## Phase {i + 1}: " + ", ".join(s), "",
        "| arm | output tok/s (× bare) | path µs/token (× bare) | control µs/token | "
        "path+control (× bare path) | engine µs/token | ITL p50 ms | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for arm, a in s.items():
        g = a["groups"]
        lines.append(
            f"| {arm} | {a['tok_s']:.1f} ({a['tok_s'] / s['vllm']['tok_s']:.2f}×) | "
            f"{g['path']:.0f} ({g['path'] / bare:.2f}×) | {g['control']:.0f} | "
            f"{g['path'] + g['control']:.0f} ({(g['path'] + g['control']) / bare:.2f}×) | "
            f"{g['engine']:.0f} | {a['itl_p50_ms']:.1f} | {a['failed']} |"
        )
    lines += ["", "Per process (µs per token, mean of rounds):", "",
              "| arm | process | µs/token |", "|---|---|---|"]  # fmt: skip
    for arm, a in s.items():
        for name, v in sorted(a["processes"].items(), key=lambda kv: -kv[1]):
            if v >= 0.5:
                lines.append(f"| {arm} | {name} | {v:.0f} |")
    lines += ["", "Concurrency 1 (every token its own event):", "",
              "| arm | ITL p50 ms | ITL p99 ms | TTFT p50 ms | tok/s |",
              "|---|---|---|---|---|"]  # fmt: skip
    for arm, r in res["concurrency_1"].items():
        lines.append(f"| {arm} | {r['median_itl_ms']:.2f} | {r['p99_itl_ms']:.2f} | "
                     f"{r['median_ttft_ms']:.1f} | {r['output_throughput']:.1f} |")  # fmt: skip
    lines += ["", f"Idle ({IDLE_S:.0f} s, no traffic), share of one core outside the engines:",
              "", "| server | share |", "|---|---|"]  # fmt: skip
    for name, r in res["idle"].items():
        lines.append(f"| {name} | {100 * r['core_share_outside_engine']:.1f} % |")
    for arm, by_process in res.get("profiles", {}).items():
        lines += ["", f"Where the path of `{arm}` spends its Python time (py-spy `--gil`: "
                  "share of the samples in which a thread of the process held the GIL, "
                  "one more window at the same load; self time):", ""]  # fmt: skip
        for name, top in by_process.items():
            shares = "; ".join(f"`{fn}` {100 * x:.0f} %" for fn, x in top["self"][:10])
            lines += [f"*{name}* — self: {shares}", ""]
    return [*lines, ""]


def report(doc: dict[str, Any], date: str) -> str:
    lines = [
        f"# Serving tax — {date}", "",
        "CPU per streamed token outside the engine, bare vLLM vs Switchyard, one run "
        "(`python -m benchmarks.serving_tax " + doc["argv"] + "`). Load: vLLM's benchmark "
        f"client, concurrency {doc['concurrency']}, {PROMPT_TOKENS}-token random prompts, "
        f"{OUTPUT_TOKENS}-token streams with ignore_eos, {doc['prompts']} requests per "
        f"window, {doc['rounds']} rounds per phase in alternating order. *path*: bare "
        "vLLM's API server; Switchyard's ingress, proxy (Ray's HTTP proxy or HAProxy) and "
        "the chat model's LLMServer replica. *control*: everything else of the server "
        "process tree.", "",
        "![CPU per token](" + doc["image"] + ")", "",
    ]  # fmt: skip
    for i, (s, res) in enumerate(zip(doc["summary"], doc["result"], strict=True)):
        lines += _phase_report(i, s, res)
    lines += ["## Environment", "", "```json", json.dumps(doc["environment"], indent=1),
              "```", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = scaffold.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--single-prompts", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the py-spy window")  # fmt: skip
    parser.add_argument("--haproxy", action="store_true",
                        help="a second phase with Ray Serve's HAProxy data plane")  # fmt: skip
    parser.add_argument("--haproxy-only", action="store_true",
                        help="the HAProxy phase alone (no Ray-proxy / direct phase)")  # fmt: skip
    parser.add_argument("--old", default="",
                        help="a last phase: Switchyard at this commit (a git worktree), "
                             "HAProxy as make run, against the same bare vLLM")  # fmt: skip
    parser.add_argument("--limits", action="store_true",
                        help="in the HAProxy phase, an arm whose requests carry a key with "
                             "every limit at every scope (SQLite state)")  # fmt: skip
    args = parser.parse_args()
    date = dt.date.today().isoformat()
    stem = scaffold.stem("serving-tax", args, date)
    work = Path(tempfile.mkdtemp(prefix="serving-tax-"))  # servers' logs: kept on failure
    result = run(args, work)
    shutil.rmtree(work, ignore_errors=True)
    doc = {"argv": " ".join(sys.argv[1:]), "date": date, "rounds": args.rounds,
           "prompts": args.prompts, "concurrency": args.concurrency,
           "environment": environment(prepared_model_dir()), "result": result,
           "summary": [summary(p) for p in result], "image": f"{stem}.png"}  # fmt: skip
    scaffold.finish(args, stem, doc, report(doc, date), lambda png: plot(doc["summary"], png))


if __name__ == "__main__":
    main()
