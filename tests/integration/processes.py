"""The operating-system processes behind a deployed LLMServer, for tests that kill or
freeze an engine."""

from __future__ import annotations

import time

import psutil
import ray


def _is_engine_core(proc: psutil.Process) -> bool:
    """vLLM's engine-core process: ``comm`` holds 15 characters (``VLLM::EngineCor``);
    a zombie or a process that is gone is not one."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return "EngineCor" in proc.name() or "EngineCore" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _replicas(app: str, deployment: str) -> list[psutil.Process]:
    """The replica processes of ``app``'s deployments whose name starts with
    ``deployment``: the live actors Ray's GCS knows by class name
    (``ServeReplica:<app>:<deployment>``), and every process carrying that title (a
    forked child carries it too until it renames itself)."""
    title = f"ServeReplica:{app}:{deployment}"
    pids: set[int] = set()
    if ray.is_initialized():
        for actor in ray._private.state.actors().values():
            if actor["State"] == "ALIVE" and str(actor["ActorClassName"]).startswith(title):
                pids.add(int(actor["Pid"]))
    for proc in psutil.process_iter(["cmdline"]):
        if title in " ".join(proc.info["cmdline"] or ()):
            pids.add(proc.pid)
    procs = []
    for pid in sorted(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def engine_core_pids(app: str, deployment: str = "LLMServer", wait_s: float = 10.0) -> list[int]:
    """The vLLM engine-core processes under the replicas of ``app``'s deployments whose
    name starts with ``deployment``, looked for for up to ``wait_s``. Each process is
    checked on its own: one child that exits or turns zombie while we look does not hide
    the others."""
    deadline = time.monotonic() + wait_s
    while True:
        found: set[int] = set()
        for proc in _replicas(app, deployment):
            found.update(p.pid for p in _descendants(proc) if _is_engine_core(p))
        if found or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.5)


def engine_processes(app: str, deployment: str = "LLMServer", wait_s: float = 10.0) -> list[int]:
    """``engine_core_pids``, or, where vLLM's title is not visible (CI saw the engine
    core still named ``python … spawn_main`` twice), the replicas' multiprocessing
    children other than the resource tracker: the engine core is among them."""
    pids = engine_core_pids(app, deployment, wait_s)
    if pids:
        return pids
    found: set[int] = set()
    for proc in _replicas(app, deployment):
        for child in _descendants(proc)[1:]:
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    found.add(child.pid)
            except psutil.Error:
                continue
    return sorted(found)


def _ancestry(proc: psutil.Process) -> str:
    chain = []
    try:
        for p in [proc, *proc.parents()][:6]:
            chain.append(f"{p.pid} {' '.join(p.cmdline())[:60]!r}")
    except psutil.Error as e:
        chain.append(type(e).__name__)
    return " <- ".join(chain)


def describe(app: str, deployment: str = "LLMServer") -> str:
    """Every process under the replicas, and every engine-core process on the machine
    with its parents, for a failure message."""
    lines = []
    for proc in _replicas(app, deployment):
        for p in _descendants(proc):
            try:
                lines.append(f"{p.pid} {p.status()} {p.name()!r} {' '.join(p.cmdline())[:80]!r}")
            except psutil.Error as e:
                lines.append(f"{p.pid} {type(e).__name__}")
    if not lines:
        lines.append(f"no replica of {app}:{deployment}")
    cores = [p for p in psutil.process_iter() if _is_engine_core(p)]
    lines += [f"engine core {_ancestry(p)}" for p in cores] or ["no engine-core process at all"]
    return "; ".join(lines)


def stacks(app: str, limit: int = 20000) -> str:
    """Python stacks of every process under ``app``'s replicas (py-spy, without pausing
    them), for the failure message of a request that stalled."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = []
    for proc in _replicas(app, ""):
        for p in _descendants(proc):
            try:
                done = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(p.pid)],
                                      capture_output=True, text=True, timeout=30)  # fmt: skip
                out.append(f"--- {p.pid} {p.name()}\n{done.stdout or done.stderr}")
            except (psutil.Error, OSError, subprocess.SubprocessError) as e:
                out.append(f"--- {p.pid} {type(e).__name__}")
    return "\n".join(out)[-limit:]
