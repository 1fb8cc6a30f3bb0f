"""The ``/admin`` HTTP API: tenants, keys, team/user limits, LoRA adapters and usage,
for operators.

Plain route functions on ``router``; each gets the ``AdminService`` through the
``current_admin`` dependency (the ingress replica's ``admin_access``; tests override
it). Without both a token and a service the whole API is absent: every route answers
404 like an unknown path. Otherwise a request must carry ``Authorization: Bearer
<admin token>`` (compared in constant time). Every error, including bad bodies and
query parameters, leaves as ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator

from app.admin.service import AdminService, IssuedKey
from app.admin.views import parse_time, public_key_view
from app.api.errors import (
    ApiError,
    from_validation_error,
    invalid_json,
    map_exception,
    unauthorized,
)
from app.api.request_id import incoming_request_id
from app.schema import Strict
from app.state.protocol import LedgerQuery, gateway_request_id
from app.state.records import Limits


@dataclass(frozen=True)
class AdminAccess:
    """What the admin API needs from its host; ``None`` in either field disables it."""

    service: AdminService | None = None
    token: SecretStr | None = None


async def current_admin() -> AdminAccess:
    """The serving ingress replica's ``admin_access`` (overridden in tests)."""
    from ray import serve

    access = getattr(serve.get_replica_context().servable_object, "admin_access", None)
    return access if isinstance(access, AdminAccess) else AdminAccess()


class _AdminRoute(APIRoute):
    """Turns every failure of an admin route (dependencies included) into our error shape,
    whatever app the router is mounted on."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # the one mapper (app.api.errors)
                return map_exception(exc, incoming_request_id(request.scope)).response()

        return guarded


router = APIRouter(prefix="/admin", route_class=_AdminRoute)


def _service(
    request: Request, access: Annotated[AdminAccess, Depends(current_admin)]
) -> AdminService:
    token = access.token.get_secret_value() if access.token is not None else ""
    if access.service is None or not token:
        raise ApiError(404, f"No route for {request.url.path}.", code="not_found")
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    valid = hmac.compare_digest(presented.strip().encode(), token.encode())
    if scheme.lower() != "bearer" or not valid:
        raise dataclasses.replace(unauthorized(), headers={"WWW-Authenticate": "Bearer"})
    return access.service


Service = Annotated[AdminService, Depends(_service)]
B = TypeVar("B", bound=BaseModel)


async def _body(request: Request, model: type[B]) -> B:
    try:
        data = json.loads(await request.body())
    except ValueError as exc:
        raise invalid_json(str(exc)) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _when(value: str | None, param: str) -> float | None:
    try:
        return None if value is None else parse_time(value)
    except ValueError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


def _issued(issued: IssuedKey, status: int) -> JSONResponse:
    body = {"key": issued.secret, "record": public_key_view(issued.record)}
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


class TenantCreate(Strict):
    id: str = Field(min_length=1)
    limits: Limits | None = None


class TenantUpdate(Strict):
    disabled: bool | None = None
    limits: Limits | None = None


class KeyCreate(Strict):
    tenant: str = Field(min_length=1)
    team: str | None = None
    user: str | None = None
    name: str | None = None
    limits: Limits | None = None
    expires_at: float | None = None  # epoch seconds, ISO 8601, or a duration from now

    @field_validator("expires_at", mode="before")
    @classmethod
    def _expiry(cls, value: object) -> object:
        return parse_time(value, future=True) if isinstance(value, str) else value


class LimitsPut(Strict):
    level: Literal["team", "user"]
    tenant: str = Field(min_length=1)
    name: str = Field(min_length=1)
    limits: Limits


class AdapterCreate(Strict):
    name: str = Field(min_length=1)
    base: str = Field(min_length=1)
    source: str = Field(min_length=1)
    tenant: str | None = None
    price_per_1m_in: float | None = None
    price_per_1m_out: float | None = None


# ---- LoRA adapters ---------------------------------------------------------------------


@router.post("/adapters", status_code=201)
async def add_adapter(request: Request, service: Service) -> dict[str, Any]:
    body = await _body(request, AdapterCreate)
    return (await service.add_adapter(**dict(body))).model_dump()  # fields = its keywords


@router.get("/adapters")
async def list_adapters(service: Service, tenant: str | None = None) -> dict[str, Any]:
    return {"data": [a.model_dump() for a in await service.list_adapters(tenant)]}


@router.delete("/adapters/{adapter_id:path}")
async def remove_adapter(adapter_id: str, service: Service) -> dict[str, Any]:
    return (await service.remove_adapter(adapter_id)).model_dump()


# ---- tenants ---------------------------------------------------------------------------


@router.post("/tenants", status_code=201)
async def create_tenant(request: Request, service: Service) -> dict[str, Any]:
    body = await _body(request, TenantCreate)
    return (await service.create_tenant(body.id, body.limits)).model_dump()


@router.get("/tenants")
async def list_tenants(service: Service) -> dict[str, Any]:
    return {"data": [t.model_dump() for t in await service.list_tenants()]}


@router.patch("/tenants/{tenant}")
async def update_tenant(tenant: str, request: Request, service: Service) -> dict[str, Any]:
    body = await _body(request, TenantUpdate)
    record = await service.update_tenant(tenant, disabled=body.disabled, limits=body.limits)
    return record.model_dump()


# ---- keys ------------------------------------------------------------------------------


@router.post("/keys", status_code=201)
async def create_key(request: Request, service: Service) -> JSONResponse:
    body = await _body(request, KeyCreate)
    return _issued(await service.create_key(**dict(body)), 201)  # fields = its keywords


@router.get("/keys")
async def list_keys(service: Service, tenant: str | None = None) -> dict[str, Any]:
    return {"data": [public_key_view(k) for k in await service.list_keys(tenant)]}


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: str, service: Service) -> dict[str, Any]:
    return public_key_view(await service.revoke_key(key_id))


@router.delete("/keys/{key_id}")
async def delete_key(key_id: str, service: Service) -> dict[str, Any]:
    """Keys are never erased (the ledger names them): deleting one revokes it."""
    return public_key_view(await service.revoke_key(key_id))


@router.post("/keys/{key_id}/rotate")
async def rotate_key(key_id: str, service: Service) -> JSONResponse:
    return _issued(await service.rotate_key(key_id), 200)


# ---- team and user limits --------------------------------------------------------------


@router.put("/limits")
async def put_limits(request: Request, service: Service) -> dict[str, Any]:
    body = await _body(request, LimitsPut)
    record = await service.set_limits(body.level, body.tenant, body.name, body.limits)
    return record.model_dump()


@router.get("/limits")
async def list_limits(service: Service) -> dict[str, Any]:
    return {"data": [r.model_dump() for r in await service.list_limits()]}


# ---- usage -----------------------------------------------------------------------------


@router.get("/usage")
async def usage(
    service: Service,
    tenant: str | None = None,
    since: str | None = None,
    until: str | None = None,
    group: Literal["summary", "records"] = "summary",
    limit: Annotated[int | None, Query(ge=1)] = None,
    request_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    """``request_id`` (an ``x-request-id`` or a response id) selects that request's
    record and implies ``group=records``."""
    query = LedgerQuery(
        tenant=tenant,
        since=_when(since, "since"),
        until=_when(until, "until"),
        limit=limit,
        request_id=None if request_id is None else gateway_request_id(request_id),
    )
    rows: list[BaseModel] = []
    if request_id is not None:
        group = "records"
    if group == "records":
        rows.extend(await service.usage_records(query))
    else:
        rows.extend(await service.usage(query))
    return {"group": group, "data": [row.model_dump() for row in rows]}


# ---- agent sessions (any tenant's) -----------------------------------------------------


@router.get("/tenants/{tenant}/sessions/{session_id}")
async def show_session(tenant: str, session_id: str, service: Service) -> dict[str, Any]:
    return await service.session(tenant, session_id)


@router.post("/tenants/{tenant}/sessions/{session_id}/cancel")
async def cancel_session(tenant: str, session_id: str, service: Service) -> dict[str, Any]:
    return await service.cancel_session(tenant, session_id)
