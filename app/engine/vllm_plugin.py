"""A vLLM general plugin (entry point ``vllm.general_plugins``), run by vLLM in every
process it starts — the engine core and each worker — before any model code. It does
two things.

Engine processes end with their parent: vLLM's engine core and workers are
``multiprocessing`` children of the replica (and of each other). When the replica is
killed outright (``ray stop --force``, an OOM kill), nothing tells them, and they
lived on holding memory. In such a child the plugin sets Linux's parent-death signal
(``PR_SET_PDEATHSIG``) to SIGKILL, so each dies with the process that started it.

On x86 CPUs with AMX (Sapphire Rapids and later), vLLM's CPU attention picks its AMX
kernels for bf16 models, but nothing asks Linux for the AMX tile state first: the
first forward pass that reaches that kernel before a oneDNN AMX matmul did (a short
prompt, say) kills the worker with SIGILL. Linux grants AMX per process on request
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``), which ``torch.cpu._init_amx`` does; this plugin
makes that request. Elsewhere (no AMX, GPU builds) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def setup_process() -> None:
    """The plugin's entry point."""
    die_with_parent()
    request_amx()


def die_with_parent() -> bool:
    """In a ``multiprocessing`` child on Linux: SIGKILL when the parent dies. Returns
    whether it was set."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError) as exc:
        log.warning("could not set the parent-death signal: %r", exc)
        return False
    if os.getppid() != parent.pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def request_amx() -> None:
    try:
        import torch

        if torch.cpu._is_amx_tile_supported() and not torch.cpu._init_amx():
            log.warning("AMX is supported but the kernel refused the AMX tile state")
    except Exception as exc:  # never break engine start-up over this
        log.warning("could not request AMX permission: %r", exc)
