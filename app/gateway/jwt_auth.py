"""JWT bearer-token verification against a JWKS.

Rule: a token is accepted only when all of these hold, checked in this order:

0. It is a string of at most ``MAX_TOKEN_CHARS`` (16 KiB) ASCII characters. This is
   checked before anything is decoded, so no parser ever sees a huge or non-ASCII token.
1. Its unverified header parses and its ``alg`` is one of ``algorithms``. This happens
   before any key is touched, so ``alg: none`` and HMAC tokens (e.g. HS256 "signed" with a
   public key as the secret) are refused outright; only asymmetric algorithms can be
   configured.
2. Its ``kid`` names a key in the JWKS. The JWKS is loaded lazily and cached for
   ``jwks_cache_s``. An unknown ``kid`` triggers a refresh (key rotation), but at most one
   fetch per ``refresh_min_interval_s``, so a flood of random kids cannot hammer the JWKS
   endpoint; concurrent verifications share one fetch. A token without ``kid`` is accepted
   only when the JWKS holds exactly one key.
3. The key fits the algorithm family: ``RSA`` for RS*/PS*, ``EC`` on the matching curve for
   ES*, ``OKP`` (Ed25519/Ed448) for EdDSA; a JWK that declares its own ``alg`` must declare
   the token's, and one that declares ``use`` must declare ``sig``. Symmetric (``oct``)
   keys in the JWKS are ignored.
4. The signature verifies, ``exp`` is present and not passed, ``nbf`` (if present) is
   reached and ``iat`` (if present) is not in the future, all with ``leeway_s`` of clock
   skew; ``exp``, ``nbf`` and ``iat`` must be NumericDates (RFC 7519: a finite JSON number;
   a numeric string such as ``"9999999999"`` or a boolean is refused); ``aud`` must
   contain ``audience`` when one is configured (otherwise it is not checked); ``iss`` must
   equal ``issuer`` when one is configured.
5. The ``tenant_claim`` claim is a non-empty string. ``team_claim`` and ``user_claim``, when
   configured, must be strings if present (absent, null or empty means none).

Every failure raises :class:`InvalidToken`; its message is for logs only (callers answer
a generic 401). That includes any exception at all raised while the token is parsed, its
key looked up or loaded, or its signature and claims checked (a hostile token, e.g. one
whose header is deeply nested JSON, must never surface as anything but a 401).

Parameters (:class:`JwtConfig`):

* ``jwks``: where the JWKS lives, a file path or an ``http(s)://`` URL.
* ``audience``: required ``aud`` value, or ``None`` to not check audience.
* ``issuer``: required ``iss`` value, or ``None`` to not check issuer.
* ``algorithms``: accepted ``alg`` values, a subset of RS256/384/512, PS256/384/512,
  ES256/384/512 and EdDSA (default RS256 and ES256).
* ``leeway_s``: clock skew allowed on ``exp`` and ``nbf`` (default 10 s).
* ``tenant_claim``: claim holding the tenant id (default ``tenant``).
* ``team_claim``: claim holding the team, or ``None`` for no team (default ``team``).
* ``user_claim``: claim holding the user, or ``None`` for no user (default ``sub``).
* ``jwks_cache_s``: how long a loaded JWKS is used before it is reloaded (default 300 s).
* ``refresh_min_interval_s``: least time between two JWKS fetches (default 30 s). If a
  reload fails, the previous JWKS stays in use until a later fetch succeeds.
* ``fetch_timeout_s``: timeout of one JWKS fetch over HTTP (default 2 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
from pydantic import Field, field_validator

from app.schema import StrictFrozen

log = logging.getLogger(__name__)

ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"}
)
MAX_TOKEN_CHARS = 16 * 1024
MAX_JWKS_BYTES = 1024 * 1024

_EC_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
_OKP_CURVES = frozenset({"Ed25519", "Ed448"})


class JwtConfig(StrictFrozen):
    jwks: str = Field(min_length=1)
    audience: str | None = None
    issuer: str | None = None
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    leeway_s: float = Field(default=10, ge=0)
    tenant_claim: str = Field(default="tenant", min_length=1)
    team_claim: str | None = "team"
    user_claim: str | None = "sub"
    jwks_cache_s: float = Field(default=300, gt=0)
    refresh_min_interval_s: float = Field(default=30, ge=0)
    fetch_timeout_s: float = Field(default=2.0, gt=0)

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("algorithms must name at least one algorithm")
        bad = [a for a in v if a not in ALLOWED_ALGORITHMS]
        if bad:
            raise ValueError(
                f"algorithms {bad} not allowed: only asymmetric signature algorithms "
                f"({', '.join(sorted(ALLOWED_ALGORITHMS))}) can be used; 'none' and HMAC "
                "(HS*) are refused"
            )
        return tuple(dict.fromkeys(v))


@dataclass(frozen=True)
class JwtIdentity:
    tenant: str
    team: str | None
    user: str | None
    subject: str | None


class InvalidToken(Exception):
    """Any reason a token is refused. The message is for logs, never for the caller."""


@dataclass
class _Jwk:
    data: Mapping[str, Any]
    kid: str | None
    kty: str
    _keys: dict[str, Any] = field(default_factory=dict)  # alg -> public key object

    def fits(self, alg: str) -> bool:
        declared = self.data.get("alg")
        if declared is not None and declared != alg:
            return False
        if alg.startswith(("RS", "PS")):
            return self.kty == "RSA"
        if alg.startswith("ES"):
            return self.kty == "EC" and self.data.get("crv") == _EC_CURVES.get(alg)
        if alg == "EdDSA":
            return self.kty == "OKP" and self.data.get("crv") in _OKP_CURVES
        return False

    def key_for(self, alg: str) -> Any:
        key = self._keys.get(alg)
        if key is None:
            try:
                key = jwt.get_algorithm_by_name(alg).from_jwk(dict(self.data))
            except Exception as e:  # whatever the JWK holds, it is only an unusable key
                raise InvalidToken(f"unusable JWK kid={_brief(self.kid)}: {_brief(e)}") from e
            self._keys[alg] = key
        return key


def _parse_jwks(raw: bytes) -> list[_Jwk]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"JWKS is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("JWKS must be an object with a 'keys' list")
    keys: list[_Jwk] = []
    for item in doc["keys"]:
        if not isinstance(item, dict):
            continue
        kty, kid, use = item.get("kty"), item.get("kid"), item.get("use")
        if kty not in ("RSA", "EC", "OKP"):  # never accept symmetric or unknown keys
            continue
        if use is not None and use != "sig":
            continue
        if kid is not None and not isinstance(kid, str):
            continue
        keys.append(_Jwk(data=item, kid=kid, kty=kty))
    return keys


class JwtVerifier:
    """Verifies bearer JWTs per the module rule. One instance per process (event loop) so
    the JWKS cache and the refresh rate limit are shared; ``clock`` (monotonic seconds)
    drives the cache and refresh timers and is replaceable in tests. Token ``exp``/``nbf``
    are always checked against wall-clock time."""

    def __init__(self, config: JwtConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._keys: list[_Jwk] | None = None
        self._loaded_at: float | None = None  # last successful load
        self._attempted_at: float | None = None  # last load attempt, successful or not
        self._generation = 0  # bumps when a load attempt ends
        self._lock = asyncio.Lock()

    async def verify(self, token: str) -> JwtIdentity:
        """The identity in ``token``; raises :class:`InvalidToken` for any refusal, including
        any exception raised by the parsers, the key loader or the signature check."""
        try:
            return await self._verify(token)
        except InvalidToken:
            raise
        except Exception as e:  # a hostile token is a 401, never a 500
            raise InvalidToken(f"unverifiable token: {type(e).__name__}: {_brief(e)}") from e

    async def _verify(self, token: str) -> JwtIdentity:
        cfg = self.config
        # Bounded and plain before anything decodes it: no parser sees a huge token.
        if not isinstance(token, str):
            raise InvalidToken(f"token is not a string but {type(token).__name__}")
        if len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken("token too long")
        if not token.isascii():
            raise InvalidToken("token is not ASCII")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise InvalidToken(f"malformed token header: {_brief(e)}") from e
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in cfg.algorithms:
            raise InvalidToken(f"algorithm {_brief(alg)} not allowed")
        kid = header.get("kid")

        keys = await self._current_keys()
        jwk = self._select(keys, kid, alg)
        if jwk is None:
            keys = await self._refresh(self._generation, reason=f"unknown kid {_brief(kid)}")
            jwk = self._select(keys, kid, alg)
            if jwk is None:
                raise InvalidToken(f"unknown kid {_brief(kid)}")

        try:
            claims = jwt.decode(
                token,
                jwk.key_for(alg),
                algorithms=[alg],
                audience=cfg.audience,
                issuer=cfg.issuer,
                leeway=cfg.leeway_s,
                options={"require": ["exp"], "verify_aud": cfg.audience is not None},
            )
        except jwt.PyJWTError as e:
            raise InvalidToken(f"{type(e).__name__}: {_brief(e)}") from e
        # PyJWT reads these claims with int(), which also takes "9999999999" and true.
        for name in ("exp", "nbf", "iat"):
            if name in claims and not _is_numeric_date(claims[name]):
                raise InvalidToken(f"claim {name!r} is not a NumericDate (a finite JSON number)")

        tenant = claims.get(cfg.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise InvalidToken(f"claim {cfg.tenant_claim!r} missing or not a non-empty string")
        subject = claims.get("sub")
        return JwtIdentity(
            tenant=tenant,
            team=_optional_claim(claims, cfg.team_claim),
            user=_optional_claim(claims, cfg.user_claim),
            subject=subject if isinstance(subject, str) and subject else None,
        )

    @staticmethod
    def _select(keys: list[_Jwk], kid: Any, alg: str) -> _Jwk | None:
        """The key for ``kid``; ``None`` when the kid is unknown (worth a refresh).
        Raises when the kid is known but no key of that kid fits ``alg``."""
        if kid is None:
            if len(keys) != 1:
                raise InvalidToken(f"token has no kid and the JWKS holds {len(keys)} keys")
            candidates = keys
        else:
            candidates = [k for k in keys if k.kid == kid]
            if not candidates:
                return None
        for k in candidates:
            if k.fits(alg):
                return k
        raise InvalidToken(f"key kid={_brief(kid)} ({candidates[0].kty}) does not fit alg {alg}")

    async def _current_keys(self) -> list[_Jwk]:
        keys, loaded_at = self._keys, self._loaded_at
        if (
            keys is not None
            and loaded_at is not None
            and self._clock() - loaded_at < self.config.jwks_cache_s
        ):
            return keys
        return await self._refresh(self._generation, reason="cache empty or expired")

    async def _refresh(self, seen_generation: int, *, reason: str) -> list[_Jwk]:
        """Load the JWKS, unless another caller did since ``seen_generation`` or the last
        attempt is younger than ``refresh_min_interval_s``; return the keys in use."""
        async with self._lock:
            if self._generation == seen_generation and self._may_fetch():
                # The generation moves only once the attempt is over, so callers that
                # queued on the lock during the fetch see it change and reuse its result.
                keys: list[_Jwk] | None = None
                try:
                    keys = _parse_jwks(await self._fetch())
                except Exception as e:  # any failure (even a RecursionError) is a failed load
                    log.warning(
                        "JWKS load from %s failed (%s): %s: %s",
                        self.config.jwks,
                        reason,
                        type(e).__name__,
                        _brief(e),
                    )
                self._generation += 1
                self._attempted_at = self._clock()
                if keys is not None:
                    self._keys, self._loaded_at = keys, self._attempted_at
                    log.info(
                        "JWKS loaded from %s (%s): %d keys", self.config.jwks, reason, len(keys)
                    )
            if self._keys is None:
                raise InvalidToken("JWKS unavailable")
            return self._keys

    def _may_fetch(self) -> bool:
        if self._attempted_at is None:
            return True
        return self._clock() - self._attempted_at >= self.config.refresh_min_interval_s

    async def _fetch(self) -> bytes:
        src = self.config.jwks
        if src.startswith(("http://", "https://")):
            body = bytearray()
            async with (
                httpx.AsyncClient(timeout=self.config.fetch_timeout_s) as client,
                client.stream("GET", src, headers={"Accept": "application/json"}) as resp,
            ):
                resp.raise_for_status()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
            return bytes(body)
        data = await asyncio.to_thread(Path(src).read_bytes)
        if len(data) > MAX_JWKS_BYTES:
            raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
        return data


def _is_numeric_date(value: Any) -> bool:
    """RFC 7519 NumericDate: a JSON number (never a string or a boolean), and finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _brief(value: object, limit: int = 120) -> str:
    """A short, safe rendering of a token-controlled value (or an exception about one) for a
    log message: strings and exception texts are cut to ``limit`` characters; containers
    are named by type only, as their repr could be huge or too deep to render."""
    if not isinstance(value, BaseException | str | int | float | None):
        return f"<{type(value).__name__}>"
    try:
        text = str(value) if isinstance(value, BaseException) else repr(value)
    except Exception:  # e.g. an int too long to render
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}…"


def _optional_claim(claims: Mapping[str, Any], name: str | None) -> str | None:
    if name is None:
        return None
    value = claims.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidToken(f"claim {name!r} is not a string")
    return value
