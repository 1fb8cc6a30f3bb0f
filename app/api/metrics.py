"""Gateway metrics in Prometheus text format, and who may read which of them.

Labels are bounded: ``model`` is one of the configured model ids or ``other``;
``tenant`` is one of ``gateway.metrics_tenants`` (an allow-list, so the label set does
not depend on which tenants a replica happened to see first) or ``other``;
``endpoint``, ``status``, ``reason`` and ``op`` come from small fixed sets. No user
ids, keys or prompts.

Families with a ``tenant`` label live in a registry of their own, so a scrape that
must not see them never collects them. ``GET /metrics`` (``metrics_response``):

* ``Authorization: Bearer <admin token>`` (``SWITCHYARD_ADMIN_TOKEN``, compared in
  constant time) → every family;
* any other ``Authorization`` header → 401 (a bad credential never falls back to the
  anonymous view);
* no ``Authorization`` header → ``gateway.public_metrics``: ``tenant_free`` (default)
  every family without a ``tenant`` label, ``all`` every family, ``none`` 404.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi.responses import Response
from pydantic import SecretStr

from app.api.errors import ApiError
from app.observability.metrics import GatewayMetrics, PublicMetrics


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
    metrics: GatewayMetrics, access: MetricsAccess, headers: Mapping[str, str]
) -> Response:
    """The whole ``GET /metrics`` endpoint, outside Ray (the ingress only calls this)."""
    try:
        include_tenants = access.include_tenants(headers)
    except ApiError as exc:
        return exc.response()
    return Response(
        metrics.render(include_tenants),
        media_type=metrics.content_type,
        headers={"Vary": "Authorization"},
    )
