"""Gateway metrics in Prometheus text format, and who may read which of them.

Labels are bounded: ``model`` is one of the configured model ids or ``other``;
``tenant`` is one of ``gateway.metrics_tenants`` (an allow-list, so the label set does
not depend on which tenants a replica happened to see first) or ``other``;
``endpoint``, ``status``, ``reason`` and ``op`` come from small fixed sets. No user
ids, keys or prompts.

Families with a ``tenant`` label live in a registry of their own, so a scrape that
must not see them never collects them. A scrape of any ingress replica shows every
replica's families, each series labelled ``replica`` (``BoardClient``,
``app.observability.board``). ``GET /metrics`` (``metrics_response``):

* ``Authorization: Bearer <admin token>`` (``SWITCHYARD_ADMIN_TOKEN``, compared in
  constant time) → every family;
* any other ``Authorization`` header → 401 (a bad credential never falls back to the
  anonymous view);
* no ``Authorization`` header → ``gateway.public_metrics``: ``tenant_free`` (default)
  every family without a ``tenant`` label, ``all`` every family, ``none`` 404.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response
from pydantic import SecretStr

from app.api.errors import ApiError
from app.observability.board import PUSH_S, MetricsBoard, Snapshot, board_name
from app.observability.metrics import GatewayMetrics, PublicMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricsAccess:
    """Who may read which families of ``GET /metrics``."""

    public: PublicMetrics = "tenant_free"
    admin_token: SecretStr | None = None

    def include_tenants(self, headers: Mapping[str, str]) -> bool:
        """Whether this scrape gets the tenant families too; ``ApiError`` 401 for a
        credential that is not the admin token, 404 for an anonymous scrape when the
        public view is ``none``."""
        presented = headers.get("authorization")
        if presented is not None:
            if not self._is_admin(presented):
                raise ApiError(
                    401,
                    "Invalid credentials for /metrics: it accepts only "
                    "`Authorization: Bearer <admin token>`.",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return True
        if self.public == "none":
            raise ApiError(404, "No route for /metrics.", code="not_found")
        return self.public == "all"

    def _is_admin(self, authorization: str) -> bool:
        token = self.admin_token.get_secret_value() if self.admin_token is not None else ""
        scheme, _, presented = authorization.partition(" ")
        valid = hmac.compare_digest(presented.strip().encode(), token.encode())
        return bool(token) and scheme.lower() == "bearer" and valid


def metrics_response(
    metrics: GatewayMetrics,
    access: MetricsAccess,
    headers: Mapping[str, str],
    others: Iterable[Snapshot] = (),
    engines: bytes = b"",
) -> Response:
    """The whole ``GET /metrics`` endpoint, outside Ray (the ingress only calls this):
    this replica's families and ``others``, the other ingress replicas' latest, then
    ``engines`` (the engine family, ``engine_families``) when the setup asks for it."""
    try:
        include_tenants = access.include_tenants(headers)
    except ApiError as exc:
        return exc.response()
    return Response(
        metrics.render(include_tenants, others) + engines,
        media_type=metrics.content_type,
        headers={"Vary": "Authorization"},
    )


ENGINE_PREFIX = "ray_switchyard_engine_"


def engine_families(exposition: str) -> bytes:
    """The engine family's lines (HELP, TYPE and samples) of a Ray metrics export."""
    keep = []
    for line in exposition.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line
        if name.startswith(ENGINE_PREFIX):
            keep.append(line)
    return ("\n".join(keep) + "\n").encode() if keep else b""


async def node_engine_families(timeout_s: float = 2.0) -> bytes:
    """The engine family from this node's Ray metrics export (nothing when it cannot
    be read: the gateway's own families are still served)."""
    try:
        import httpx
        import ray

        ip = ray.util.get_node_ip_address()
        (node,) = [n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip]
        url = f"http://{ip}:{node['MetricsExportPort']}/metrics"
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            text = (await client.get(url)).text
    except Exception as exc:
        log.warning("the node's Ray metrics export could not be read: %r", exc)
        return b""
    return engine_families(text)


class BoardClient:
    """One ingress replica's side of its application's metrics board
    (``app.observability.board``): it pushes this replica's snapshot every ``PUSH_S``
    and reads the others' for a scrape. The board is a Ray actor found or created by
    name; when it cannot be reached, a scrape shows this replica alone."""

    def __init__(self, app: str, metrics: GatewayMetrics) -> None:
        self._name = board_name(app)
        self._metrics = metrics
        self._board: Any = None
        self._task: asyncio.Task[None] | None = None

    def _handle(self) -> Any:
        if self._board is None:
            import ray

            actor = ray.remote(num_cpus=0)(MetricsBoard)
            self._board = actor.options(name=self._name, get_if_exists=True).remote()
        return self._board

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._push_forever())

    async def _push_forever(self) -> None:
        while True:
            try:
                await self._handle().put.remote(self._metrics.snapshot())
            except Exception as exc:  # the board's actor died: a new one next time
                log.debug("metrics board unreachable: %r", exc)
                self._board = None
            await asyncio.sleep(PUSH_S)

    async def others(self, timeout_s: float = 2.0) -> list[Snapshot]:
        try:
            got: list[Snapshot] = await asyncio.wait_for(
                self._handle().snapshots.remote(), timeout_s
            )
        except Exception as exc:
            log.warning("metrics board unreachable, this replica's metrics only: %r", exc)
            self._board = None
            return []
        return got

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
