"""Authentication (app/gateway/auth.py) against a real SqliteStore: which credentials pass,
and which fail with 401 (no/invalid credential) or 403 (valid, but tenant unknown or
disabled, or the key revoked)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from jwt.algorithms import RSAAlgorithm
from starlette.datastructures import Headers as RawHeaders

from app.admin.service import AdminService
from app.gateway.auth import Authenticator, AuthError, credential
from app.gateway.jwt_auth import JwtConfig, JwtVerifier
from app.gateway.keys import new_key
from app.request import Caller
from app.state.protocol import StateStore, StoreUnavailable
from app.state.records import KeyRecord, Limits, TenantRecord
from app.state.sqlite_store import SqliteStore

AUD = "switchyard"
ISS = "https://idp.example"
KID = "rsa-1"


# ---- JWT material ---------------------------------------------------------------------


@dataclass(frozen=True)
class Signer:
    key: RSAPrivateKey
    jwks: Path

    def token(self, *, alg: str = "RS256", kid: str = KID, **overrides: Any) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "tenant": "acme", "team": "ml", "sub": "alice", "aud": AUD, "iss": ISS,
            "iat": now, "exp": now + 300,
        }  # fmt: skip
        claims.update(overrides)
        return jwt.encode(claims, self.key, algorithm=alg, headers={"kid": kid})

    def unsigned(self) -> str:
        header = b64({"alg": "none", "typ": "JWT", "kid": KID})
        return f"{header}.{b64(self._claims())}."

    def hs256_with_public_key(self) -> str:
        pem = self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        signing_input = f"{b64({'alg': 'HS256', 'typ': 'JWT', 'kid': KID})}.{b64(self._claims())}"
        sig = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{b64(sig)}"

    def nested_header(self, depth: int) -> str:
        """A validly signed token whose header holds ``depth`` nested JSON arrays."""
        header = b'{"alg":"RS256","kid":"%s","x":%s%s}' % (KID.encode(), b"[" * depth, b"]" * depth)
        signing_input = f"{b64(header)}.{b64(self._claims())}"
        rs256 = jwt.get_algorithm_by_name("RS256")
        sig = rs256.sign(signing_input.encode(), rs256.prepare_key(self.key))
        return f"{signing_input}.{b64(sig)}"

    @staticmethod
    def _claims() -> dict[str, Any]:
        now = int(time.time())
        return {"tenant": "acme", "sub": "alice", "aud": AUD, "iss": ISS, "exp": now + 300}


def b64(data: bytes | dict[str, Any]) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)  # type: ignore[assignment]
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": KID}]}))
    return Signer(key, path)


def verifier(signer: Signer) -> JwtVerifier:
    return JwtVerifier(JwtConfig(jwks=str(signer.jwks), audience=AUD, issuer=ISS))


# ---- the store and its records --------------------------------------------------------


@dataclass(frozen=True)
class World:
    good: str
    good_record: KeyRecord
    expired: str
    revoked: str
    disabled_tenant: str
    orphan: str  # a key whose tenant record does not exist
    unknown_id: str  # right format, id not in the store
    wrong_secret: str  # the good key's id with another secret


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "s.db")
    yield s
    await s.close()


async def populate(store: StateStore) -> World:
    admin = AdminService(store)
    good = await admin.create_key(
        "acme", team="ml", user="alice", name="good", limits=Limits(rpm=10)
    )
    await admin.set_limits("team", "acme", "ml", Limits(rpm=100))
    await admin.set_limits("user", "acme", "alice", Limits(rpm=50))
    past = time.time() - 3600  # a key issued an hour ago that expired a second ago
    expired = await AdminService(store, clock=lambda: past).create_key(
        "acme", expires_at=time.time() - 1
    )
    revoked = await admin.create_key("acme")
    await admin.revoke_key(revoked.record.id)
    disabled = await admin.create_key("dis")
    await admin.update_tenant("dis", disabled=True)
    orphan = new_key()
    await store.put_key(
        KeyRecord(
            id=orphan.key_id, prefix=orphan.prefix, salt=orphan.salt_hex,
            digest=orphan.digest_hex, tenant="ghost", created_at=time.time(),
        )
    )  # fmt: skip
    return World(
        good=good.secret,
        good_record=good.record,
        expired=expired.secret,
        revoked=revoked.secret,
        disabled_tenant=disabled.secret,
        orphan=orphan.secret_key,
        unknown_id=new_key().secret_key,
        wrong_secret=new_key(key_id=good.record.id).secret_key,
    )


@pytest.fixture
async def world(store: SqliteStore) -> World:
    return await populate(store)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def raw(name: str, value: bytes) -> Mapping[str, str]:
    """Headers as the API sees them: Starlette decodes the raw bytes as latin-1, so bytes
    that are not UTF-8 (or not ASCII) arrive as a str with non-ASCII characters."""
    return RawHeaders(raw=[(b"content-type", b"application/json"), (name.encode(), value)])


Headers = Callable[[World, Signer], Mapping[str, str]]

# (id, headers, status): every way a request is refused
REFUSALS: list[tuple[str, Headers, int]] = [
    ("no_credential", lambda w, s: {}, 401),
    ("no_credential_other_headers", lambda w, s: {"content-type": "application/json"}, 401),
    ("basic_scheme", lambda w, s: {"authorization": "Basic x"}, 401),
    ("basic_scheme_with_key", lambda w, s: {"authorization": f"Basic {w.good}"}, 401),
    ("bearer_without_token", lambda w, s: {"authorization": "Bearer"}, 401),
    ("bearer_space", lambda w, s: {"authorization": "Bearer "}, 401),
    ("bearer_spaces", lambda w, s: {"authorization": "Bearer    "}, 401),
    ("empty_authorization", lambda w, s: {"authorization": ""}, 401),
    ("key_without_scheme", lambda w, s: {"authorization": w.good}, 401),
    ("malformed_authorization_wins_over_api_key",
     lambda w, s: {"authorization": "Basic x", "api-key": w.good}, 401),
    ("unknown_key_id", lambda w, s: bearer(w.unknown_id), 401),
    ("wrong_secret", lambda w, s: bearer(w.wrong_secret), 401),
    ("truncated_key", lambda w, s: bearer(w.good[:-1]), 401),
    ("key_with_suffix", lambda w, s: bearer(w.good + "x"), 401),
    ("expired_key", lambda w, s: bearer(w.expired), 401),
    ("revoked_key", lambda w, s: bearer(w.revoked), 403),
    ("revoked_key_via_api_key", lambda w, s: {"api-key": w.revoked}, 403),
    ("tenant_disabled", lambda w, s: bearer(w.disabled_tenant), 403),
    ("tenant_missing", lambda w, s: bearer(w.orphan), 403),
    ("garbage_token", lambda w, s: bearer("hunter2"), 401),
    ("garbage_api_key", lambda w, s: {"x-api-key": "not-a-key"}, 401),
    ("garbage_dots", lambda w, s: bearer("a.b.c"), 401),
    ("jwt_expired", lambda w, s: bearer(s.token(exp=int(time.time()) - 120)), 401),
    ("jwt_wrong_audience", lambda w, s: bearer(s.token(aud="other")), 401),
    ("jwt_wrong_issuer", lambda w, s: bearer(s.token(iss="https://evil")), 401),
    ("jwt_alg_none", lambda w, s: bearer(s.unsigned()), 401),
    ("jwt_hs256_public_key", lambda w, s: bearer(s.hs256_with_public_key()), 401),
    ("jwt_unknown_kid", lambda w, s: bearer(s.token(kid="rsa-404")), 401),
    ("jwt_no_tenant_claim", lambda w, s: bearer(s.token(tenant=None)), 401),
    ("jwt_unknown_tenant", lambda w, s: bearer(s.token(tenant="nobody")), 403),
    ("jwt_disabled_tenant", lambda w, s: bearer(s.token(tenant="dis")), 403),
    ("jwt_via_api_key_header", lambda w, s: {"api-key": s.token(tenant="dis")}, 403),
    ("jwt_deeply_nested_header", lambda w, s: bearer(s.nested_header(3_000)), 401),
    ("jwt_deeply_nested_header_huge", lambda w, s: bearer(s.nested_header(10_000)), 401),
    # credential headers that are not printable ASCII (not UTF-8, other bytes) or absurdly long
    ("authorization_not_utf8", lambda w, s: raw("authorization", b"Bearer \xff\xfe\xfd"), 401),
    ("authorization_only_non_ascii", lambda w, s: raw("authorization", b"\xc3\x28"), 401),
    ("authorization_utf8_non_ascii",
     lambda w, s: raw("authorization", "Bearer ключ".encode()), 401),
    ("authorization_key_then_latin1",
     lambda w, s: raw("authorization", f"Bearer {w.good}".encode() + b"\xff"), 401),
    ("authorization_key_then_nbsp",
     lambda w, s: raw("authorization", f"Bearer {w.good}".encode() + b"\xa0"), 401),
    ("authorization_nel_then_key",
     lambda w, s: raw("authorization", b"\x85" + f"Bearer {w.good}".encode()), 401),
    ("authorization_nbsp_only", lambda w, s: raw("authorization", b"\xa0"), 401),
    ("authorization_nul_in_key", lambda w, s: bearer(w.good[:10] + "\x00" + w.good[10:]), 401),
    ("authorization_tab_separator", lambda w, s: {"authorization": f"Bearer\t{w.good}"}, 401),
    ("authorization_jwt_then_latin1",
     lambda w, s: raw("authorization", f"Bearer {s.token()}".encode() + b"\xe9"), 401),
    ("authorization_too_long", lambda w, s: bearer(w.good + " " + "a" * 17_000), 401),
    ("api_key_not_utf8", lambda w, s: raw("api-key", b"\xff\xfe"), 401),
    ("api_key_nbsp_around_key",
     lambda w, s: raw("api-key", b"\xa0" + w.good.encode() + b"\xa0"), 401),
    ("api_key_too_long", lambda w, s: {"api-key": "k" * (16 * 1024 + 1)}, 401),
    ("x_api_key_not_utf8", lambda w, s: raw("x-api-key", b"sk-sy-\xc3\x28"), 401),
    ("x_api_key_key_then_del", lambda w, s: {"x-api-key": w.good + "\x7f"}, 401),
    ("unreadable_x_api_key_next_to_good_api_key",
     lambda w, s: {"api-key": w.good, "x-api-key": "\xff"}, 401),
    ("unreadable_api_key_next_to_good_bearer",
     lambda w, s: {"authorization": f"Bearer {w.good}", "api-key": "\xa0"}, 401),
]  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "status"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS]
)
async def test_refusals(
    store: SqliteStore, world: World, signer: Signer, headers: Headers, status: int
) -> None:
    auth = Authenticator(store, jwt=verifier(signer))
    with pytest.raises(AuthError) as info:
        await auth.authenticate(headers(world, signer))
    assert info.value.status == status


BAD_FOR_ANONYMOUS = [c for c in REFUSALS if not c[0].startswith("no_credential")]


@pytest.mark.parametrize(
    ("headers", "status"),
    [c[1:] for c in BAD_FOR_ANONYMOUS],
    ids=[c[0] for c in BAD_FOR_ANONYMOUS],
)
async def test_bad_credential_never_falls_back_to_anonymous(
    store: SqliteStore, world: World, signer: Signer, headers: Headers, status: int
) -> None:
    auth = Authenticator(store, jwt=verifier(signer), anonymous_tenant="acme")
    with pytest.raises(AuthError) as info:
        await auth.authenticate(headers(world, signer))
    assert info.value.status == status


def test_auth_error_message_carries_status_and_reason() -> None:
    assert str(AuthError(403, "key revoked")) == "403: key revoked"


# ---- accepted credentials -------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda k: {"authorization": f"Bearer {k}"}, id="bearer"),
        pytest.param(lambda k: {"authorization": f"bearer {k}"}, id="bearer_lowercase"),
        pytest.param(lambda k: {"authorization": f"  BEARER   {k}  "}, id="bearer_padded"),
        pytest.param(lambda k: {"api-key": k}, id="api_key"),
        pytest.param(lambda k: {"x-api-key": f" {k} "}, id="x_api_key"),
        pytest.param(lambda k: raw("authorization", f"Bearer {k}".encode()), id="raw_bearer"),
        pytest.param(lambda k: raw("x-api-key", k.encode()), id="raw_x_api_key"),
    ],
)
async def test_good_key(
    store: SqliteStore, world: World, headers: Callable[[str], Mapping[str, str]]
) -> None:
    auth = Authenticator(store)
    caller, principal = await auth.authenticate(headers(world.good))
    assert caller == Caller(
        tenant="acme", team="ml", user="alice", key_id=world.good_record.id, via="key"
    )
    assert principal.key is not None and principal.key.id == world.good_record.id
    assert principal.tenant is not None and principal.tenant.id == "acme"
    assert principal.team is not None and principal.team.limits == Limits(rpm=100)
    assert principal.user is not None and principal.user.limits == Limits(rpm=50)


async def test_key_not_yet_expired_is_accepted(store: SqliteStore) -> None:
    issued = await AdminService(store).create_key("acme", expires_at=time.time() + 60)
    caller, _ = await Authenticator(store).authenticate(bearer(issued.secret))
    assert caller.key_id == issued.record.id


async def test_rotated_key_old_secret_stops_working(store: SqliteStore) -> None:
    admin = AdminService(store)
    old = await admin.create_key("acme")
    new = await admin.rotate_key(old.record.id)
    auth = Authenticator(store)
    assert (await auth.authenticate(bearer(new.secret)))[0].key_id == old.record.id
    with pytest.raises(AuthError) as info:
        await auth.authenticate(bearer(old.secret))
    assert info.value.status == 401


async def test_valid_jwt(store: SqliteStore, world: World, signer: Signer) -> None:
    auth = Authenticator(store, jwt=verifier(signer))
    caller, principal = await auth.authenticate(bearer(signer.token()))
    assert caller == Caller(tenant="acme", team="ml", user="alice", key_id=None, via="jwt")
    assert principal.key is None
    assert principal.tenant is not None and principal.tenant.id == "acme"
    assert principal.team is not None and principal.team.scope == "team:acme/ml"
    assert principal.user is not None and principal.user.scope == "user:acme/alice"


async def test_jwt_without_verifier_is_401(
    store: SqliteStore, world: World, signer: Signer
) -> None:
    with pytest.raises(AuthError) as info:
        await Authenticator(store).authenticate(bearer(signer.token()))
    assert info.value.status == 401


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization-x": "y"},
        {"content-type": "application/json"},
        raw("user-agent", b"\xff\xfe"),  # odd bytes in a header that is not a credential
    ],
)
async def test_no_credential_with_anonymous_tenant(
    store: SqliteStore, world: World, headers: Mapping[str, str]
) -> None:
    caller, principal = await Authenticator(store, anonymous_tenant="acme").authenticate(headers)
    assert caller == Caller(tenant="acme", via="anonymous")
    assert principal.key is None
    assert principal.tenant is not None and principal.tenant.id == "acme"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"authorization": "Bearer tok"}, "tok"),
        ({"authorization": "Bearer  tok "}, "tok"),
        ({"api-key": "k1"}, "k1"),
        ({"x-api-key": "k2"}, "k2"),
        ({"api-key": "k1", "x-api-key": "k2"}, "k1"),
        ({"authorization": "Bearer tok", "api-key": "k1"}, "tok"),
    ],
)
def test_credential(headers: dict[str, str], expected: str | None) -> None:
    assert credential(headers) == expected


@pytest.mark.parametrize(
    "headers", [{"api-key": ""}, {"x-api-key": "  "}, {"api-key": "", "x-api-key": "k2"}]
)
def test_an_empty_key_header_is_a_bad_credential_not_an_absent_one(
    headers: dict[str, str],
) -> None:
    with pytest.raises(AuthError) as refused:
        credential(headers)
    assert refused.value.status == 401


@pytest.mark.parametrize("name", ["authorization", "api-key", "x-api-key"])
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"Bearer \xff\xfe", id="not_utf8"),
        pytest.param("Bearer clé".encode(), id="utf8_non_ascii"),
        pytest.param(b"Bearer tok\xa0", id="trailing_nbsp"),
        pytest.param(b"\x85Bearer tok", id="leading_nel"),
        pytest.param(b"\xa0", id="nbsp_only"),
        pytest.param(b"Bearer tok\x01", id="control_char"),
        pytest.param(b"Bearer " + b"t" * (16 * 1024 + 1), id="too_long"),
    ],
)
def test_an_unreadable_credential_header_is_a_bad_credential_not_an_absent_one(
    name: str, value: bytes
) -> None:
    if name != "authorization":
        value = value.removeprefix(b"Bearer ")
    with pytest.raises(AuthError) as refused:
        credential(raw(name, value))
    assert refused.value.status == 401


def test_credential_at_the_length_limit_is_read() -> None:
    limit = 16 * 1024  # as long as the longest JWT the verifier looks at
    assert credential(raw("authorization", b"Bearer " + b"t" * limit)) == "t" * limit
    assert credential(raw("authorization", b"Bearer  " + b"t" * limit + b" ")) == "t" * limit
    assert credential(raw("api-key", b"k" * limit)) == "k" * limit
    assert credential(raw("x-api-key", b"k" * limit)) == "k" * limit


async def test_a_disabled_anonymous_tenant_is_403(store: SqliteStore) -> None:
    await store.put_tenant(TenantRecord(id="anon", disabled=True))
    auth = Authenticator(store, anonymous_tenant="anon")
    with pytest.raises(AuthError) as refused:
        await auth.authenticate({})
    assert refused.value.status == 403


# ---- store failures -------------------------------------------------------------------


class FlakyStore:
    """A SqliteStore that can be switched off: every call then raises StoreUnavailable."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.down = False
        self.calls = 0

    async def load_principal(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("switched off")
        return await self.inner.load_principal(**kwargs)


@pytest.mark.parametrize("kind", ["directory_as_db", "stub_down"])
@pytest.mark.parametrize("stale_ok", [False, True])
async def test_store_down_propagates(
    tmp_path: Path, store: SqliteStore, world: World, kind: str, stale_ok: bool
) -> None:
    if kind == "directory_as_db":
        (tmp_path / "dir.db").mkdir()
        broken: Any = SqliteStore(tmp_path / "dir.db")
    else:
        broken = FlakyStore(store)
        broken.down = True
    auth = Authenticator(cast(StateStore, broken), stale_ok_on_store_failure=stale_ok)
    try:
        with pytest.raises(StoreUnavailable):  # nothing cached yet: no fallback either way
            await auth.authenticate(bearer(world.good))
    finally:
        if kind == "directory_as_db":
            await broken.close()


@pytest.mark.parametrize("stale_ok", [False, True])
async def test_store_down_after_a_good_lookup(
    store: SqliteStore, world: World, stale_ok: bool
) -> None:
    flaky = FlakyStore(store)
    auth = Authenticator(cast(StateStore, flaky), stale_ok_on_store_failure=stale_ok)
    first = await auth.authenticate(bearer(world.good))
    flaky.down = True
    if not stale_ok:
        with pytest.raises(StoreUnavailable):
            await auth.authenticate(bearer(world.good))
        return
    assert await auth.authenticate(bearer(world.good)) == first
    assert flaky.calls == 2  # the store was asked; the cache answered only because it failed
    # the cached record still has to match the secret, and unknown ids still need the store
    with pytest.raises(AuthError) as info:
        await auth.authenticate(bearer(world.wrong_secret))
    assert info.value.status == 401
    with pytest.raises(StoreUnavailable):
        await auth.authenticate(bearer(world.revoked))


async def test_stale_cache_is_refreshed_by_later_good_lookups(
    store: SqliteStore, world: World
) -> None:
    """A key revoked while the store was up is refused from the cache when it goes down."""
    flaky = FlakyStore(store)
    auth = Authenticator(cast(StateStore, flaky), stale_ok_on_store_failure=True)
    await auth.authenticate(bearer(world.good))
    await AdminService(store).revoke_key(world.good_record.id)
    with pytest.raises(AuthError):
        await auth.authenticate(bearer(world.good))
    flaky.down = True
    with pytest.raises(AuthError) as info:
        await auth.authenticate(bearer(world.good))
    assert info.value.status == 403
