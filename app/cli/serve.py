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
processes it starts gets the throughput-optimized mode and the proxy guard unless the
caller set them.
"""

from __future__ import annotations

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
    signal.signal(signal.SIGTERM, _interrupt)
    run.main(args=[str(config)], prog_name="switchyard serve", standalone_mode=True)
