"""The operating-system processes behind a deployed LLMServer, for tests that kill or
freeze an engine."""

from __future__ import annotations

import contextlib
import time

import psutil


def engine_core_pids(app: str, deployment: str = "LLMServer", wait_s: float = 10.0) -> list[int]:
    """The vLLM engine-core processes under the replicas of ``app``'s deployments whose
    name starts with ``deployment``: looked for under every process carrying the
    replica's title (``ray::ServeReplica:<app>:<deployment>``; a forked child carries it
    too until it renames itself; ``comm`` holds 15 characters: ``VLLM::EngineCor``), for
    up to ``wait_s``."""
    title = f"ServeReplica:{app}:{deployment}"
    deadline = time.monotonic() + wait_s
    while True:
        found: set[int] = set()
        for proc in psutil.process_iter(["cmdline"]):
            if title not in " ".join(proc.info["cmdline"] or ()):
                continue
            with contextlib.suppress(psutil.Error):
                for child in [proc, *proc.children(recursive=True)]:
                    if "EngineCor" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                        found.add(child.pid)
        if found or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.5)
