"""The router deployment: owner of the model-selection state.

It serves versioned ``RouteTable`` snapshots to the gateways, which decide locally (no
hop per request). Hot reload: when the table was built from a routes file, every
``table()`` call (gateways poll every ``route_refresh_s``) first checks the file's
modification time and size at most once per ``check_every_s``; a changed, valid file
becomes the next version, an invalid one is logged and the current table kept. Ray
Serve's ``user_config: {routes: {...}}`` reloads the same way (``reconfigure``).
In-flight requests keep the decision they were made with.

The routes file is read where this replica runs (on Kubernetes, a ConfigMap mounted on
the worker that hosts it), not where the application was built: the router loads it
at start, as version ``table.version + 1``, and the gateways take their first snapshot
from the router, never from the builder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.loopback import bind_replica_grpc_to_loopback
from app.routing.measured import resolve
from app.routing.spec import RoutesFileError, RoutesSpec, describe, load_routes
from app.routing.table import RouteDecision, RouteRequest, RouteTable, check_local_pools

log = logging.getLogger(__name__)


class ModelRouter:
    """Deployment class; ``app.builders`` wraps it with ``serve.deployment``."""

    def __init__(
        self, table: RouteTable, routes_file: str | None = None, check_every_s: float = 1.0
    ) -> None:
        bind_replica_grpc_to_loopback()
        self._table = table
        self._file = Path(routes_file) if routes_file else None
        self._check_every_s = check_every_s
        self._checked_at = time.monotonic()
        self._signature = self._stat()
        self.last_error: str | None = None
        if self._file is not None:  # on this replica's node; a bad file fails the start
            self._install(load_routes(self._file))

    def _stat(self) -> tuple[int, int] | None:
        if self._file is None:
            return None
        try:
            st = self._file.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _install(self, spec: RoutesSpec) -> None:
        check_local_pools(spec, self._table.local)
        self._table = RouteTable(self._table.version + 1, spec, self._table.local)
        self.last_error = None
        log.info("routes reloaded: version %d", self._table.version)

    def _maybe_reload(self) -> None:
        if self._file is None or time.monotonic() - self._checked_at < self._check_every_s:
            return
        self._checked_at = time.monotonic()
        signature = self._stat()
        if signature is None or signature == self._signature:
            return
        self._signature = signature
        try:
            self._install(load_routes(self._file))
        except (RoutesFileError, ValueError) as exc:
            self.last_error = str(exc)
            log.error("routes file not reloaded, keeping version %d: %s", self._table.version, exc)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Ray Serve ``user_config`` hook: ``{"routes": <routes spec>}``."""
        if "routes" not in user_config:
            return
        try:
            routes = resolve(user_config["routes"], Path.cwd())  # measured qualities
            self._install(RoutesSpec.model_validate(routes))
        except (ValidationError, ValueError) as exc:
            detail = describe(exc) if isinstance(exc, ValidationError) else str(exc)
            self.last_error = detail
            log.error(
                "user_config routes rejected, keeping version %d: %s", self._table.version, detail
            )

    def table(self, known_version: int = -1) -> RouteTable | None:
        """The current table, or None when the caller already has this version."""
        self._maybe_reload()
        return None if known_version == self._table.version else self._table

    def route(self, request: RouteRequest) -> RouteDecision | None:
        """One decision, for callers that do not keep a snapshot."""
        self._maybe_reload()
        return self._table.decide(request)
