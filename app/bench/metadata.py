"""What a published benchmark result must say about where and how it was measured.

``collect_metadata`` returns the fields a public benchmark report needs (seed 003 §12,
``REQUIRED_FIELDS``, in that order), then any ``extra`` fields, then ``generator`` (the
tool, its version, Python and the platform; never the host name or anything else that
identifies the machine). Every probe (``git``, ``nvidia-smi``, ``/proc``) runs with a
timeout and never fails the run: what cannot be found reads ``"unknown"`` or, for a GPU
that is not there, ``"none"`` and a count of 0. Only NVIDIA GPUs are detected.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

REQUIRED_FIELDS: tuple[str, ...] = (
    "date",
    "git_commit",
    "model_id",
    "model_revision",
    "engine",
    "engine_version",
    "container_image",
    "gpu",
    "gpu_count",
    "driver",
    "cuda_or_rocm",
    "cpu",
    "ram",
    "prompt_dataset",
    "input_length_distribution",
    "output_length_distribution",
    "concurrency",
    "warmup",
    "duration",
    "sampling_parameters",
)
UNKNOWN = "unknown"
TIMEOUT_S = 5.0


def _run(cmd: Sequence[str], cwd: Path | None = None) -> str | None:
    """stdout of ``cmd`` (stripped), or None when it is missing, fails or times out."""
    try:
        done = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(cwd: Path | None = None) -> str:
    """``HEAD`` of the repository at ``cwd`` (default: the current directory), with
    ``+dirty`` when ``git status --porcelain`` lists anything; ``unknown`` outside one."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd)
    if not commit:
        return UNKNOWN
    status = _run(["git", "status", "--porcelain"], cwd)
    return commit + ("+dirty" if status else "")


def gpu_info() -> dict[str, Any]:
    """``gpu``, ``gpu_count``, ``driver``, ``cuda_or_rocm`` from ``nvidia-smi``."""
    none: dict[str, Any] = {"gpu": "none", "gpu_count": 0, "driver": "none", "cuda_or_rocm": "none"}
    if shutil.which("nvidia-smi") is None:
        return none
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    rows = [[p.strip() for p in line.split(",")] for line in (out or "").splitlines() if line]
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        return none
    names = list(dict.fromkeys(r[0] for r in rows))
    drivers = list(dict.fromkeys(r[1] for r in rows))
    match = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"]) or "")
    return {
        "gpu": ", ".join(names),
        "gpu_count": len(rows),
        "driver": ", ".join(drivers),
        "cuda_or_rocm": f"CUDA {match.group(1)}" if match else UNKNOWN,
    }


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """CPU model name and logical core count, e.g. ``AMD EPYC 7B13 (16 logical cores)``."""
    model = ""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.split(":", 1)[0].strip() in ("model name", "Model", "cpu model"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    model = model or platform.processor() or UNKNOWN
    return f"{model} ({os.cpu_count() or 0} logical cores)"


def ram_info(meminfo: Path = Path("/proc/meminfo")) -> str:
    """Total memory from ``MemTotal`` in GiB, e.g. ``125.8 GiB``."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return UNKNOWN


def _package_version() -> str:
    try:
        return importlib_metadata.version("switchyard")
    except importlib_metadata.PackageNotFoundError:
        return UNKNOWN


def collect_metadata(
    *,
    model_info: dict[str, Any] | None,
    engine: str | None,
    engine_version: str | None,
    dataset: str,
    input_lengths: str,
    output_lengths: str,
    concurrency: str,
    warmup: str,
    duration: str,
    sampling: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every ``REQUIRED_FIELDS`` entry in order, then ``extra``, then ``generator``.

    ``model_info`` is the served model's entry (e.g. from ``/v1/models``): its ``id``,
    and its ``revision`` or else ``root`` as the revision. ``extra`` may not redefine a
    required field (``ValueError``)."""
    info = model_info or {}
    clash = sorted(set(extra or {}) & {*REQUIRED_FIELDS, "generator"})
    if clash:
        raise ValueError(f"extra metadata may not redefine {', '.join(clash)}")
    out: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "model_id": str(info.get("id") or UNKNOWN),
        "model_revision": str(info.get("revision") or info.get("root") or UNKNOWN),
        "engine": engine or UNKNOWN,
        "engine_version": engine_version or UNKNOWN,
        "container_image": os.environ.get("CONTAINER_IMAGE") or "none (bare host)",
        **gpu_info(),
        "cpu": cpu_info(),
        "ram": ram_info(),
        "prompt_dataset": dataset,
        "input_length_distribution": input_lengths,
        "output_length_distribution": output_lengths,
        "concurrency": concurrency,
        "warmup": warmup,
        "duration": duration,
        "sampling_parameters": dict(sampling),
    }
    out.update(extra or {})
    out["generator"] = {
        "tool": "switchyard bench",
        "version": _package_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    return out
