from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from pydantic import ValidationError

from app.gateway.jwt_auth import InvalidToken, JwtConfig, JwtIdentity, JwtVerifier

AUD = "switchyard"
ISS = "https://idp.example"


@dataclass(frozen=True)
class Keys:
    rsa: RSAPrivateKey
    ec: EllipticCurvePrivateKey
    ed: Ed25519PrivateKey
    other_rsa: RSAPrivateKey  # not in any JWKS


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        rsa=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec=ec.generate_private_key(ec.SECP256R1()),
        ed=Ed25519PrivateKey.generate(),
        other_rsa=rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def rsa_jwk(key: RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)  # type: ignore[assignment]
    return {**jwk, "kid": kid}


def ec_jwk(key: EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)  # type: ignore[assignment]
    return {**jwk, "kid": kid}


def ed_jwk(key: Ed25519PrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)  # type: ignore[assignment]
    return {**jwk, "kid": kid}


def jwks_doc(*jwks: dict[str, Any]) -> dict[str, Any]:
    return {"keys": list(jwks)}


@pytest.fixture(scope="module")
def jwks_file(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    doc = jwks_doc(
        rsa_jwk(keys.rsa, "rsa-1"),
        ec_jwk(keys.ec, "ec-1"),
        ed_jwk(keys.ed, "ed-1"),
        {"kty": "oct", "k": base64.urlsafe_b64encode(b"s" * 32).decode(), "kid": "hmac-1"},
    )
    path.write_text(json.dumps(doc))
    return path


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {
        "tenant": "acme",
        "team": "ml",
        "sub": "alice",
        "aud": AUD,
        "iss": ISS,
        "iat": now,
        "exp": now + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def sign(key: Any, alg: str, kid: str | None, **overrides: Any) -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims(**overrides), key, algorithm=alg, headers=headers)


def b64(data: bytes | dict[str, Any]) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsigned(k: Keys) -> str:
    return f"{b64({'alg': 'none', 'typ': 'JWT', 'kid': 'rsa-1'})}.{b64(claims())}."


def hs256_with_public_pem(k: Keys) -> str:
    pem = k.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signing_input = f"{b64({'alg': 'HS256', 'typ': 'JWT', 'kid': 'rsa-1'})}.{b64(claims())}"
    sig = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(sig)}"


def tampered_payload(k: Keys) -> str:
    header, _, signature = sign(k.rsa, "RS256", "rsa-1").split(".")
    return f"{header}.{b64(claims(tenant='evil'))}.{signature}"


def now() -> int:
    return int(time.time())


ALICE = JwtIdentity(tenant="acme", team="ml", user="alice", subject="alice")

# (builder, expected): a JwtIdentity when accepted, else a fragment of the InvalidToken message
CASES: list[tuple[str, Callable[[Keys], str], JwtIdentity | str]] = [
    ("valid_rs256", lambda k: sign(k.rsa, "RS256", "rsa-1"), ALICE),
    ("valid_es256", lambda k: sign(k.ec, "ES256", "ec-1"), ALICE),
    (
        "valid_without_team",
        lambda k: sign(k.rsa, "RS256", "rsa-1", team=None, sub="bob"),
        JwtIdentity(tenant="acme", team=None, user="bob", subject="bob"),
    ),
    (
        "valid_aud_list",
        lambda k: sign(k.rsa, "RS256", "rsa-1", aud=["other", AUD]),
        ALICE,
    ),
    ("missing_exp", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=None), '"exp"'),
    ("expired", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=now() - 60), "ExpiredSignature"),
    ("expired_within_leeway", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=now() - 5), ALICE),
    ("nbf_in_future", lambda k: sign(k.rsa, "RS256", "rsa-1", nbf=now() + 60), "Immature"),
    ("nbf_within_leeway", lambda k: sign(k.rsa, "RS256", "rsa-1", nbf=now() + 5), ALICE),
    ("wrong_audience", lambda k: sign(k.rsa, "RS256", "rsa-1", aud="other"), "InvalidAudience"),
    ("missing_audience", lambda k: sign(k.rsa, "RS256", "rsa-1", aud=None), '"aud"'),
    ("wrong_issuer", lambda k: sign(k.rsa, "RS256", "rsa-1", iss="https://evil"), "InvalidIssuer"),
    ("missing_issuer", lambda k: sign(k.rsa, "RS256", "rsa-1", iss=None), '"iss"'),
    ("alg_none", unsigned, "algorithm 'none' not allowed"),
    ("hs256_public_key_as_secret", hs256_with_public_pem, "algorithm 'HS256' not allowed"),
    ("unknown_kid", lambda k: sign(k.rsa, "RS256", "rsa-404"), "unknown kid 'rsa-404'"),
    ("symmetric_jwk_kid", lambda k: sign(k.rsa, "RS256", "hmac-1"), "unknown kid 'hmac-1'"),
    ("no_kid_with_several_keys", lambda k: sign(k.rsa, "RS256", None), "no kid"),
    ("tampered_payload", tampered_payload, "InvalidSignature"),
    ("signed_by_other_key", lambda k: sign(k.other_rsa, "RS256", "rsa-1"), "InvalidSignature"),
    ("missing_tenant", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=None), "'tenant'"),
    ("empty_tenant", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=""), "'tenant'"),
    ("non_string_tenant", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=7), "'tenant'"),
    ("non_string_team", lambda k: sign(k.rsa, "RS256", "rsa-1", team=["a"]), "'team'"),
    ("es256_header_rsa_kid", lambda k: sign(k.ec, "ES256", "rsa-1"), "does not fit alg ES256"),
    ("rs256_header_ec_kid", lambda k: sign(k.rsa, "RS256", "ec-1"), "does not fit alg RS256"),
    ("eddsa_not_configured", lambda k: sign(k.ed, "EdDSA", "ed-1"), "'EdDSA' not allowed"),
    ("garbage", lambda k: "not.a.jwt", "malformed"),
    ("empty", lambda k: "", "malformed"),
    ("huge", lambda k: "a" * 20_000, "too long"),
]


@pytest.mark.parametrize(("builder", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_verify_table(
    keys: Keys, jwks_file: Path, builder: Callable[[Keys], str], expected: JwtIdentity | str
) -> None:
    verifier = JwtVerifier(JwtConfig(jwks=str(jwks_file), audience=AUD, issuer=ISS))
    token = builder(keys)
    if isinstance(expected, JwtIdentity):
        assert await verifier.verify(token) == expected
    else:
        with pytest.raises(InvalidToken) as info:
            await verifier.verify(token)
        assert expected in str(info.value)


@pytest.mark.parametrize(
    ("config", "builder", "expected"),
    [
        (
            {"algorithms": ("EdDSA",)},
            lambda k: sign(k.ed, "EdDSA", "ed-1"),
            ALICE,
        ),
        (
            {"algorithms": ("PS256",)},
            lambda k: sign(k.rsa, "PS256", "rsa-1"),
            ALICE,
        ),
        ({"algorithms": ("RS256",)}, lambda k: sign(k.ec, "ES256", "ec-1"), "'ES256' not allowed"),
        (
            {"algorithms": ("ES256",)},
            lambda k: sign(k.rsa, "RS256", "rsa-1"),
            "'RS256' not allowed",
        ),
        # without audience configured, aud is not checked
        ({"audience": None}, lambda k: sign(k.rsa, "RS256", "rsa-1", aud="anything"), ALICE),
        # without issuer configured, iss is not checked
        ({"issuer": None}, lambda k: sign(k.rsa, "RS256", "rsa-1", iss=None), ALICE),
        (
            {"tenant_claim": "org", "team_claim": None, "user_claim": "email"},
            lambda k: sign(k.rsa, "RS256", "rsa-1", org="o1", email="a@x"),
            JwtIdentity(tenant="o1", team=None, user="a@x", subject="alice"),
        ),
        ({"tenant_claim": "org"}, lambda k: sign(k.rsa, "RS256", "rsa-1"), "'org'"),
        ({"leeway_s": 0}, lambda k: sign(k.rsa, "RS256", "rsa-1", exp=now() - 5), "Expired"),
        (
            {"leeway_s": 0},
            lambda k: sign(k.rsa, "RS256", "rsa-1", nbf=now() + 5),
            "Immature",
        ),
    ],
    ids=[
        "eddsa",
        "ps256",
        "es256_not_configured",
        "rs256_not_configured",
        "audience_unchecked",
        "issuer_unchecked",
        "custom_claims",
        "custom_tenant_claim_missing",
        "no_leeway_expired",
        "no_leeway_nbf",
    ],
)
async def test_verify_config_variants(
    keys: Keys,
    jwks_file: Path,
    config: dict[str, Any],
    builder: Callable[[Keys], str],
    expected: JwtIdentity | str,
) -> None:
    cfg = JwtConfig.model_validate(
        {"jwks": str(jwks_file), "audience": AUD, "issuer": ISS, **config}
    )
    verifier = JwtVerifier(cfg)
    token = builder(keys)
    if isinstance(expected, JwtIdentity):
        assert await verifier.verify(token) == expected
    else:
        with pytest.raises(InvalidToken) as info:
            await verifier.verify(token)
        assert expected in str(info.value)


async def test_single_key_jwks_accepts_token_without_kid(keys: Keys, tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(jwks_doc(ec_jwk(keys.ec, "ec-1"))))
    verifier = JwtVerifier(JwtConfig(jwks=str(path), audience=AUD, issuer=ISS))
    assert await verifier.verify(sign(keys.ec, "ES256", None)) == ALICE
    # ... but the single key must still fit the algorithm
    with pytest.raises(InvalidToken, match="does not fit"):
        await verifier.verify(sign(keys.rsa, "RS256", None))


@pytest.mark.parametrize(
    "content",
    [None, "not json", json.dumps({"keys": "nope"}), json.dumps([1, 2])],
    ids=["missing_file", "not_json", "keys_not_list", "not_object"],
)
async def test_unusable_jwks_refuses(keys: Keys, tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "jwks.json"
    if content is not None:
        path.write_text(content)
    verifier = JwtVerifier(JwtConfig(jwks=str(path)))
    with pytest.raises(InvalidToken, match="JWKS unavailable"):
        await verifier.verify(sign(keys.rsa, "RS256", "rsa-1"))


@pytest.mark.parametrize(
    "algorithms",
    [("HS256",), ("none",), ("RS256", "HS512"), ("HS384",), ("ES256K",), ("rs256",), ()],
)
def test_config_rejects_algorithms(algorithms: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError, match="algorithms"):
        JwtConfig(jwks="/x", algorithms=algorithms)


@pytest.mark.parametrize(
    "extra",
    [{"leeway_s": -1}, {"jwks_cache_s": 0}, {"fetch_timeout_s": 0}, {"tenant_claim": ""}],
)
def test_config_rejects_bad_numbers(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=next(iter(extra))):
        JwtConfig.model_validate({"jwks": "/x", **extra})


def test_config_defaults_and_frozen() -> None:
    cfg = JwtConfig.model_validate({"jwks": "/x", "algorithms": ["PS256", "EdDSA"]})
    assert cfg.algorithms == ("PS256", "EdDSA")
    assert JwtConfig(jwks="/x").algorithms == ("RS256", "ES256")
    with pytest.raises(ValidationError):
        JwtConfig.model_validate({"jwks": "/x", "typo": 1})
    with pytest.raises(ValidationError):
        cfg.leeway_s = 99  # type: ignore[misc]


# --- JWKS over HTTP ---------------------------------------------------------------------------


@dataclass
class JwksServer:
    doc: dict[str, Any]
    url: str = ""
    fetches: int = 0
    fail: bool = False
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def jwks_server(keys: Keys) -> Iterator[JwksServer]:
    state = JwksServer(doc=jwks_doc(rsa_jwk(keys.rsa, "rsa-1")))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.fetches += 1
            time.sleep(state.delay_s)
            if state.fail:
                self.send_response(500)
                self.end_headers()
                return
            body = json.dumps(state.doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def http_verifier(server: JwksServer, clock: FakeClock, **config: Any) -> JwtVerifier:
    cfg = JwtConfig.model_validate(
        {
            "jwks": server.url,
            "audience": AUD,
            "issuer": ISS,
            "refresh_min_interval_s": 30,
            "jwks_cache_s": 300,
            **config,
        }
    )
    return JwtVerifier(cfg, clock=clock)


async def test_http_jwks_is_fetched_once_and_cached(keys: Keys, jwks_server: JwksServer) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    assert jwks_server.fetches == 0  # lazy
    for _ in range(5):
        assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE
    assert jwks_server.fetches == 1


async def test_key_rotation_refetches_once_then_verifies(
    keys: Keys, jwks_server: JwksServer
) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE
    assert jwks_server.fetches == 1

    # the IdP rotates in a new key; it is published after our last fetch
    jwks_server.doc = jwks_doc(rsa_jwk(keys.rsa, "rsa-1"), ec_jwk(keys.ec, "ec-2"))
    clock.advance(31)
    assert await verifier.verify(sign(keys.ec, "ES256", "ec-2")) == ALICE
    assert jwks_server.fetches == 2
    assert await verifier.verify(sign(keys.ec, "ES256", "ec-2")) == ALICE
    assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE
    assert jwks_server.fetches == 2


async def test_unknown_kid_within_min_interval_does_not_refetch(
    keys: Keys, jwks_server: JwksServer
) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE
    jwks_server.doc = jwks_doc(rsa_jwk(keys.rsa, "rsa-1"), ec_jwk(keys.ec, "ec-2"))
    clock.advance(29)  # the last fetch is too recent
    with pytest.raises(InvalidToken, match="unknown kid"):
        await verifier.verify(sign(keys.ec, "ES256", "ec-2"))
    assert jwks_server.fetches == 1
    clock.advance(2)
    assert await verifier.verify(sign(keys.ec, "ES256", "ec-2")) == ALICE
    assert jwks_server.fetches == 2


async def test_flood_of_unknown_kids_refetches_at_most_once(
    keys: Keys, jwks_server: JwksServer
) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE
    clock.advance(31)  # a refresh is allowed again
    jwks_server.delay_s = 0.05  # keep the fetch in flight while the flood piles up

    tokens = [sign(keys.rsa, "RS256", f"random-{secrets.token_hex(4)}") for _ in range(20)]
    results = await asyncio.gather(*(verifier.verify(t) for t in tokens), return_exceptions=True)
    assert all(isinstance(r, InvalidToken) and "unknown kid" in str(r) for r in results)
    assert jwks_server.fetches == 2

    for t in tokens:  # more of the same, sequentially, inside the interval
        with pytest.raises(InvalidToken):
            await verifier.verify(t)
    assert jwks_server.fetches == 2
    # known kids keep working meanwhile
    assert await verifier.verify(sign(keys.rsa, "RS256", "rsa-1")) == ALICE

    clock.advance(31)
    with pytest.raises(InvalidToken):
        await verifier.verify(tokens[0])
    assert jwks_server.fetches == 3


@pytest.mark.parametrize("min_interval_s", [0, 30])
async def test_concurrent_first_verifies_share_one_fetch(
    keys: Keys, jwks_server: JwksServer, min_interval_s: float
) -> None:
    jwks_server.delay_s = 0.05
    verifier = http_verifier(jwks_server, FakeClock(), refresh_min_interval_s=min_interval_s)
    token = sign(keys.rsa, "RS256", "rsa-1")
    results = await asyncio.gather(*(verifier.verify(token) for _ in range(20)))
    assert results == [ALICE] * 20
    assert jwks_server.fetches == 1


async def test_cache_expiry_drops_removed_keys(keys: Keys, jwks_server: JwksServer) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    old = sign(keys.rsa, "RS256", "rsa-1")
    assert await verifier.verify(old) == ALICE
    jwks_server.doc = jwks_doc(ec_jwk(keys.ec, "ec-2"))  # rsa-1 retired
    clock.advance(299)
    assert await verifier.verify(old) == ALICE  # still cached
    assert jwks_server.fetches == 1
    clock.advance(2)
    with pytest.raises(InvalidToken, match="unknown kid 'rsa-1'"):
        await verifier.verify(old)
    assert jwks_server.fetches == 2  # expiry reload; the unknown kid did not fetch again


async def test_failed_reload_keeps_previous_keys(keys: Keys, jwks_server: JwksServer) -> None:
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    token = sign(keys.rsa, "RS256", "rsa-1")
    assert await verifier.verify(token) == ALICE
    jwks_server.fail = True
    clock.advance(301)
    assert await verifier.verify(token) == ALICE
    assert jwks_server.fetches == 2
    assert await verifier.verify(token) == ALICE  # no retry inside the min interval
    assert jwks_server.fetches == 2
    jwks_server.fail = False
    clock.advance(31)
    assert await verifier.verify(token) == ALICE
    assert jwks_server.fetches == 3


async def test_http_jwks_unavailable_refuses(keys: Keys, jwks_server: JwksServer) -> None:
    jwks_server.fail = True
    clock = FakeClock()
    verifier = http_verifier(jwks_server, clock)
    token = sign(keys.rsa, "RS256", "rsa-1")
    for _ in range(3):
        with pytest.raises(InvalidToken, match="JWKS unavailable"):
            await verifier.verify(token)
    assert jwks_server.fetches == 1  # failed loads are rate limited too
    jwks_server.fail = False
    clock.advance(31)
    assert await verifier.verify(token) == ALICE
