"""The operating-system processes behind a deployed LLMServer, for tests that kill or
freeze an engine."""

from __future__ import annotations

import time

import psutil


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


def engine_core_pids(app: str, deployment: str = "LLMServer", wait_s: float = 10.0) -> list[int]:
    """The vLLM engine-core processes under the replicas of ``app``'s deployments whose
    name starts with ``deployment``: looked for under every process carrying the
    replica's title (``ray::ServeReplica:<app>:<deployment>``; a forked child carries it
    too until it renames itself), for up to ``wait_s``. Each process is checked on its
    own: one child that exits or turns zombie while we look does not hide the others."""
    title = f"ServeReplica:{app}:{deployment}"
    deadline = time.monotonic() + wait_s
    while True:
        found: set[int] = set()
        for proc in psutil.process_iter(["cmdline"]):
            if title not in " ".join(proc.info["cmdline"] or ()):
                continue
            found.update(p.pid for p in _descendants(proc) if _is_engine_core(p))
        if found or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.5)


def describe(app: str, deployment: str = "LLMServer") -> str:
    """Every process under the replicas' titles, for a failure message."""
    title = f"ServeReplica:{app}:{deployment}"
    lines = []
    for proc in psutil.process_iter(["cmdline"]):
        if title not in " ".join(proc.info["cmdline"] or ()):
            continue
        for p in _descendants(proc):
            try:
                lines.append(f"{p.pid} {p.status()} {p.name()!r} {' '.join(p.cmdline())[:80]!r}")
            except psutil.Error as e:
                lines.append(f"{p.pid} {type(e).__name__}")
    return "; ".join(lines) or f"no process titled {title}"
