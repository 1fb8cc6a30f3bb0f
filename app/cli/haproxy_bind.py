"""Serve's HAProxy with its stats page and Prometheus exporter on loopback only.

Ray 2.60's HAProxy template binds them on every interface (``listen stats`` →
``bind *:<RAY_SERVE_HAPROXY_STATS_PORT>``, ``frontend prometheus`` →
``bind :<RAY_SERVE_HAPROXY_METRICS_PORT>``) and has no knob for their address; the API
frontend follows ``http_options.host``. Ray's supported knob is the binary it runs,
``RAY_SERVE_HAPROXY_BINARY_PATH``: ``switchyard serve`` points it at a small shell
wrapper that rewrites exactly those two bind lines of the config file Ray has just
written (``-f FILE``) to ``127.0.0.1`` and then ``exec``s the real binary with the same
arguments — same pid, same command line after the exec, so Serve's start, reload
(``-sf``) and process checks work as before. ``tests/unit/test_cli_haproxy_bind.py``
renders Ray's own template through it, so a Ray upgrade that changes those lines fails
there instead of silently exposing the ports again.
"""

from __future__ import annotations

import shlex
from pathlib import Path

WRAPPER_NAME = "haproxy"

_SCRIPT = """#!/bin/sh
# Written by switchyard serve (app/cli/haproxy_bind.py): Serve's HAProxy with its stats
# and metrics listeners on 127.0.0.1 instead of every interface.
cfg=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ]; then cfg="$arg"; fi
  prev="$arg"
done
if [ -n "$cfg" ] && [ -f "$cfg" ]; then
  sed -i -E 's/^([[:space:]]*bind )\\*?:({ports})[[:space:]]*$/\\1127.0.0.1:\\2/' "$cfg"
fi
exec {binary} "$@"
"""


def real_haproxy() -> str:
    """The binary Serve would run without the wrapper (Ray's own resolution)."""
    from ray.serve._private.haproxy import get_haproxy_binary

    return get_haproxy_binary()


def write_wrapper(directory: Path, binary: str, ports: tuple[int, ...]) -> Path:
    """An executable wrapper in ``directory`` (the caller's private directory)."""
    path = directory / WRAPPER_NAME
    alternatives = "|".join(str(int(p)) for p in ports)
    path.write_text(_SCRIPT.format(ports=alternatives, binary=shlex.quote(binary)))
    path.chmod(0o700)
    return path
