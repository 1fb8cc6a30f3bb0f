"""Authentication: a credential becomes a ``Caller`` (tenant, team, user, key).

Rule (seed 000 CH4-2 §3): 401 when there is no credential or it is invalid, expired
or for another audience; 403 when it is valid but its tenant is unknown or disabled or
the key is revoked. Clients never learn which check failed (the reason goes to logs
and metrics only), and a bad credential never falls back to anonymous access.
Credentials come from ``Authorization: Bearer …``, ``api-key:`` or ``x-api-key:``.

A credential header that is present but unreadable (anything outside printable ASCII, e.g.
bytes that are not UTF-8, which Starlette hands over decoded as latin-1), or absurdly long
(a credential over ``MAX_CREDENTIAL_CHARS``, 16 KiB, the most a JWT may have) is a
malformed credential: 401, never anonymous. That holds for each of the three headers, also
one that a header of higher precedence would win over.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.gateway.jwt_auth import InvalidToken, JwtVerifier
from app.gateway.keys import looks_like_jwt, parse_key, verify_secret
from app.request import Caller
from app.state.protocol import StateStore, StoreUnavailable
from app.state.records import Principal

log = logging.getLogger(__name__)

PRINCIPAL_CACHE_MAX = 4096
MAX_CREDENTIAL_CHARS = 16 * 1024  # the credential itself (as jwt_auth.MAX_TOKEN_CHARS)
_MAX_HEADER_CHARS = MAX_CREDENTIAL_CHARS + 64  # room for "Bearer " and some blanks
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")  # in order of precedence
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")


@dataclass
class AuthError(Exception):
    status: int  # 401 or 403
    reason: str  # for logs and metrics, never sent to the client

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


def credential(headers: Mapping[str, str]) -> str | None:
    """The presented credential, ``None`` only when no credential header is present at all.

    Raises a 401 for a malformed Authorization header, an empty key header, and any
    credential header that is unreadable (see the module docstring)."""
    present: dict[str, str] = {}
    for name in CREDENTIAL_HEADERS:
        raw = headers.get(name)
        if raw is not None:
            present[name] = _readable(name, raw)
    auth = present.get("authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthError(401, "malformed authorization header")
        return _bounded("authorization", value.strip())
    for name in CREDENTIAL_HEADERS[1:]:
        other = present.get(name)
        if other is not None:
            if not other.strip():
                raise AuthError(401, f"empty {name} header")
            return _bounded(name, other.strip())
    return None


def _readable(name: str, value: object) -> str:
    """``value`` when it is a plausible credential header value, else a 401. Checked on the
    raw value, before any stripping (``str.strip`` would also drop e.g. a latin-1 NBSP)."""
    if not isinstance(value, str):
        raise AuthError(401, f"{name} header is not text")
    if len(value) > _MAX_HEADER_CHARS:
        raise AuthError(401, f"{name} header longer than {_MAX_HEADER_CHARS} characters")
    if _PRINTABLE_ASCII.fullmatch(value) is None:
        raise AuthError(401, f"{name} header is not printable ASCII")
    return value


def _bounded(name: str, presented: str) -> str:
    if len(presented) > MAX_CREDENTIAL_CHARS:
        raise AuthError(401, f"{name} credential longer than {MAX_CREDENTIAL_CHARS} characters")
    return presented


class Authenticator:
    def __init__(
        self,
        store: StateStore,
        *,
        jwt: JwtVerifier | None = None,
        anonymous_tenant: str | None = None,
        stale_ok_on_store_failure: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._jwt = jwt
        self._anonymous = anonymous_tenant
        self._stale_ok = stale_ok_on_store_failure
        self._clock = clock
        # Last good lookups, used only when the store is down and the policy is fail-open.
        self._last_good: dict[tuple[str | None, ...], Principal] = {}

    async def authenticate(self, headers: Mapping[str, str]) -> tuple[Caller, Principal]:
        token = credential(headers)
        if token is None:
            if self._anonymous is None:
                raise AuthError(401, "no credential")
            caller = Caller(tenant=self._anonymous, via="anonymous")
            principal = await self._load(tenant=caller.tenant)
            if principal.tenant is not None and principal.tenant.disabled:
                raise AuthError(403, "anonymous tenant disabled")
            return caller, principal
        parsed = parse_key(token)
        if parsed is not None:
            return await self._by_key(parsed.key_id, parsed.secret)
        if self._jwt is not None and looks_like_jwt(token):
            try:
                ident = await self._jwt.verify(token)
            except InvalidToken as exc:
                raise AuthError(401, f"jwt: {exc}") from None
            principal = await self._load(tenant=ident.tenant, team=ident.team, user=ident.user)
            self._check_tenant(principal, ident.tenant)
            caller = Caller(tenant=ident.tenant, team=ident.team, user=ident.user, via="jwt")
            return caller, principal
        raise AuthError(401, "unrecognised credential")

    async def _by_key(self, key_id: str, secret: str) -> tuple[Caller, Principal]:
        principal = await self._load(key_id=key_id)
        key = principal.key
        if key is None or not verify_secret(secret, key.salt, key.digest):
            raise AuthError(401, "unknown key or wrong secret")
        if key.expires_at is not None and key.expires_at <= self._clock():
            raise AuthError(401, "key expired")
        if key.revoked_at is not None:
            raise AuthError(403, "key revoked")
        self._check_tenant(principal, key.tenant)
        caller = Caller(tenant=key.tenant, team=key.team, user=key.user, key_id=key.id, via="key")
        return caller, principal

    @staticmethod
    def _check_tenant(principal: Principal, tenant: str) -> None:
        if principal.tenant is None:
            raise AuthError(403, f"unknown tenant {tenant!r}")
        if principal.tenant.disabled:
            raise AuthError(403, f"tenant {tenant!r} disabled")

    async def _load(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> Principal:
        cache_key = (key_id, tenant, team, user)
        try:
            principal = await self._store.load_principal(
                key_id=key_id, tenant=tenant, team=team, user=user
            )
        except StoreUnavailable:
            stale = self._last_good.get(cache_key)
            if not self._stale_ok or stale is None:
                raise
            log.warning("state store unavailable: using the last known identity record")
            return stale
        if self._stale_ok:
            if len(self._last_good) >= PRINCIPAL_CACHE_MAX:
                self._last_good.pop(next(iter(self._last_good)))
            self._last_good[cache_key] = principal
        return principal
