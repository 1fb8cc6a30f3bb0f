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


# --- hostile tokens ---------------------------------------------------------------------------
#
# Every way a presented token can be hostile, grouped by category. Each row names the builder
# and the exact outcome: the identity (good-token controls) or a fragment of the InvalidToken
# message, so a row also fails when a token is refused for another reason than the intended one
# (a broken builder) or escapes as some other exception (a 500 at the API).

RSA_HEADER: dict[str, Any] = {"alg": "RS256", "typ": "JWT", "kid": "rsa-1"}


def forge(
    key: Any, alg: str, header: bytes | dict[str, Any], payload: bytes | dict[str, Any]
) -> str:
    """A compact JWS over exactly these header and payload bytes, really signed with ``key``."""
    signing_input = f"{b64(header)}.{b64(payload)}"
    algorithm = jwt.get_algorithm_by_name(alg)
    signature = algorithm.sign(signing_input.encode(), algorithm.prepare_key(key))
    return f"{signing_input}.{b64(signature)}"


def with_header(header: bytes | dict[str, Any]) -> Callable[[Keys], str]:
    """Good claims, signed by the right RSA key, under an odd header."""
    return lambda k: forge(k.rsa, "RS256", header, claims())


Payload = bytes | dict[str, Any]


def with_payload(payload: Payload | Callable[[], Payload]) -> Callable[[Keys], str]:
    """The normal header and a valid RS256 signature over an odd payload (built when the
    row runs, so its times are fresh however long after import that is)."""
    return lambda k: forge(k.rsa, "RS256", RSA_HEADER, payload() if callable(payload) else payload)


def with_claim_json(name: str, raw_json: str) -> Callable[[Keys], str]:
    """Good claims where claim ``name`` is the literal JSON ``raw_json`` (e.g. ``Infinity``)."""

    def build(k: Keys) -> str:
        body = json.dumps({**claims(), name: "@@"}).replace('"@@"', raw_json)
        return forge(k.rsa, "RS256", RSA_HEADER, body.encode())

    return build


def nested(depth: int, *, closed: bool = True) -> bytes:
    """A header object whose member ``x`` is ``depth`` nested JSON arrays."""
    tail = b"]" * depth + b"}" if closed else b""
    return b'{"alg":"RS256","kid":"rsa-1","x":' + b"[" * depth + tail


def deep_payload(depth: int) -> bytes:
    """Good claims plus a member ``x`` of ``depth`` nested JSON arrays."""
    return json.dumps(claims()).encode()[:-1] + b',"x":' + b"[" * depth + b"]" * depth + b"}"


def good_token_of_length(length: int) -> Callable[[Keys], str]:
    """A good RS256 token of exactly ``length`` characters, made long by an extra claim."""

    def build(k: Keys) -> str:
        for header_pad in range(3):  # base64url lengths skip every 4k+1: shift the header
            headers = {"kid": "rsa-1", "p": "x" * header_pad}
            lo, hi = 0, length
            while lo < hi:  # the smallest claim padding reaching ``length``
                mid = (lo + hi) // 2
                if len(jwt.encode(claims(pad="x" * mid), k.rsa, "RS256", headers)) < length:
                    lo = mid + 1
                else:
                    hi = mid
            token = jwt.encode(claims(pad="x" * lo), k.rsa, "RS256", headers)
            if len(token) == length:
                return token
        raise AssertionError(f"no token of {length} characters")

    return build


def segments(k: Keys, **overrides: Any) -> list[str]:
    return sign(k.rsa, "RS256", "rsa-1", **overrides).split(".")


def flip(segment: str, at: int) -> str:
    """``segment`` with the base64url character at ``at`` replaced by another one."""
    return segment[:at] + ("B" if segment[at] == "A" else "A") + segment[at + 1 :]


def hmac_token(secret: bytes, alg: str = "HS256") -> str:
    digest = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}[alg]
    signing_input = f"{b64({**RSA_HEADER, 'alg': alg})}.{b64(claims())}"
    sig = hmac.new(secret, signing_input.encode(), digest).digest()
    return f"{signing_input}.{b64(sig)}"


def public_pem(k: Keys) -> bytes:
    return k.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def embedded_jwk(k: Keys) -> str:
    """Signed by an attacker's key that the header itself carries (``jwk``) and points at
    (``jku``): the verifier must only ever use its own JWKS."""
    header = {**RSA_HEADER, "jwk": rsa_jwk(k.other_rsa, "rsa-1"), "jku": "https://evil/jwks"}
    return forge(k.other_rsa, "RS256", header, claims())


NUMERIC_DATE = "not a NumericDate"

HOSTILE: list[tuple[str, Callable[[Keys], str], JwtIdentity | str]] = [
    # controls: the same builders with nothing wrong are accepted
    ("control_rs256", lambda k: sign(k.rsa, "RS256", "rsa-1"), ALICE),
    ("control_es256", lambda k: sign(k.ec, "ES256", "ec-1"), ALICE),
    ("control_forged_helper", with_header(RSA_HEADER), ALICE),
    ("control_fractional_exp", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=now() + 300.5), ALICE),
    ("control_iat_within_leeway", lambda k: sign(k.rsa, "RS256", "rsa-1", iat=now() + 5), ALICE),
    # algorithm
    ("alg_none", unsigned, "algorithm 'none' not allowed"),
    ("alg_none_capitalised", with_header({**RSA_HEADER, "alg": "None"}), "'None' not allowed"),
    (
        "alg_none_with_rs256_signature",
        lambda k: f"{b64({**RSA_HEADER, 'alg': 'none'})}.{b64(claims())}.{segments(k)[2]}",
        "'none' not allowed",
    ),
    ("alg_missing", with_header({"typ": "JWT", "kid": "rsa-1"}), "algorithm None not allowed"),
    ("alg_empty", with_header({**RSA_HEADER, "alg": ""}), "algorithm '' not allowed"),
    ("alg_lowercase", with_header({**RSA_HEADER, "alg": "rs256"}), "'rs256' not allowed"),
    ("alg_list", with_header({**RSA_HEADER, "alg": ["RS256"]}), "algorithm <list> not allowed"),
    ("hs256_public_pem_as_secret", lambda k: hmac_token(public_pem(k)), "'HS256' not allowed"),
    ("hs512_public_pem_as_secret",
     lambda k: hmac_token(public_pem(k), "HS512"), "'HS512' not allowed"),
    (
        "hs256_jwk_json_as_secret",
        lambda k: hmac_token(json.dumps(rsa_jwk(k.rsa, "rsa-1")).encode()),
        "'HS256' not allowed",
    ),
    ("rs512_not_allowed", lambda k: sign(k.rsa, "RS512", "rsa-1"), "'RS512' not allowed"),
    ("ps256_not_allowed", lambda k: sign(k.rsa, "PS256", "rsa-1"), "'PS256' not allowed"),
    ("eddsa_not_allowed", lambda k: sign(k.ed, "EdDSA", "ed-1"), "'EdDSA' not allowed"),
    ("es256_header_on_rsa_kid", lambda k: sign(k.ec, "ES256", "rsa-1"), "does not fit alg ES256"),
    ("rs256_header_on_hmac_kid", lambda k: sign(k.rsa, "RS256", "hmac-1"), "unknown kid 'hmac-1'"),
    # expiry, not-before, issued-at
    ("expired", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=now() - 60), "ExpiredSignature"),
    ("expired_at_epoch", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=1), "ExpiredSignature"),
    ("exp_missing", lambda k: sign(k.rsa, "RS256", "rsa-1", exp=None), '"exp"'),
    ("exp_null", with_claim_json("exp", "null"), '"exp"'),
    ("exp_numeric_string", lambda k: sign(k.rsa, "RS256", "rsa-1", exp="9999999999"), NUMERIC_DATE),
    ("exp_string_of_soon",
     lambda k: sign(k.rsa, "RS256", "rsa-1", exp=str(now() + 300)), NUMERIC_DATE),
    ("exp_true", with_claim_json("exp", "true"), "ExpiredSignature"),  # PyJWT: int(True) == 1
    ("exp_object", with_claim_json("exp", '{"t": 9999999999}'), "(exp) must be"),
    ("exp_list", with_claim_json("exp", "[9999999999]"), "(exp) must be"),
    ("exp_nan", with_claim_json("exp", "NaN"), "(exp) must be"),
    ("exp_infinity", with_claim_json("exp", "Infinity"), "(exp) must be"),
    ("exp_overflowing_float", with_claim_json("exp", "1e400"), "(exp) must be"),
    ("nbf_in_future", lambda k: sign(k.rsa, "RS256", "rsa-1", nbf=now() + 60), "(nbf)"),
    ("nbf_numeric_string", lambda k: sign(k.rsa, "RS256", "rsa-1", nbf="0"), NUMERIC_DATE),
    ("nbf_false", with_claim_json("nbf", "false"), NUMERIC_DATE),
    ("nbf_minus_infinity", with_claim_json("nbf", "-Infinity"), "(nbf) must be"),
    ("iat_in_future", lambda k: sign(k.rsa, "RS256", "rsa-1", iat=now() + 3600), "(iat)"),
    ("iat_numeric_string", lambda k: sign(k.rsa, "RS256", "rsa-1", iat="0"), NUMERIC_DATE),
    ("iat_true", with_claim_json("iat", "true"), NUMERIC_DATE),
    ("iat_nan", with_claim_json("iat", "NaN"), "(iat) must be"),
    # audience and issuer
    ("aud_wrong", lambda k: sign(k.rsa, "RS256", "rsa-1", aud="other"), "InvalidAudience"),
    ("aud_other_case", lambda k: sign(k.rsa, "RS256", "rsa-1", aud=AUD.upper()), "InvalidAudience"),
    ("aud_missing", lambda k: sign(k.rsa, "RS256", "rsa-1", aud=None), '"aud"'),
    ("aud_list_without_ours",
     lambda k: sign(k.rsa, "RS256", "rsa-1", aud=["a", "b"]), "InvalidAudience"),
    ("aud_empty_list", lambda k: sign(k.rsa, "RS256", "rsa-1", aud=[]), '"aud"'),
    ("aud_number", lambda k: sign(k.rsa, "RS256", "rsa-1", aud=7), "InvalidAudience"),
    ("iss_wrong", lambda k: sign(k.rsa, "RS256", "rsa-1", iss="https://evil"), "InvalidIssuer"),
    ("iss_trailing_slash", lambda k: sign(k.rsa, "RS256", "rsa-1", iss=ISS + "/"), "InvalidIssuer"),
    ("iss_missing", lambda k: sign(k.rsa, "RS256", "rsa-1", iss=None), '"iss"'),
    ("iss_list", with_payload(lambda: claims(iss=[ISS])), "InvalidIssuer"),  # PyJWT won't encode it
    ("iss_object", with_payload(lambda: claims(iss={"iss": ISS})), "InvalidIssuer"),
    # tenant (and the other identity claims)
    ("tenant_missing", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=None), "'tenant'"),
    ("tenant_null", with_claim_json("tenant", "null"), "'tenant'"),
    ("tenant_empty", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=""), "'tenant'"),
    ("tenant_number", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=7), "'tenant'"),
    ("tenant_true", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=True), "'tenant'"),
    ("tenant_list", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant=["acme"]), "'tenant'"),
    ("tenant_object", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant={"id": "acme"}), "'tenant'"),
    ("tenant_huge", lambda k: sign(k.rsa, "RS256", "rsa-1", tenant="a" * 20_000), "too long"),
    ("team_list", lambda k: sign(k.rsa, "RS256", "rsa-1", team=["ml"]), "'team'"),
    ("sub_number", lambda k: sign(k.rsa, "RS256", "rsa-1", sub=7), "InvalidSubject"),
    # tampering
    ("tampered_payload", tampered_payload, "InvalidSignature"),
    (
        "tampered_header",
        lambda k: f"{b64({**RSA_HEADER, 'typ': 'at+jwt'})}.{segments(k)[1]}.{segments(k)[2]}",
        "InvalidSignature",
    ),
    (
        "signature_flipped",
        lambda k: ".".join([*segments(k)[:2], flip(segments(k)[2], 10)]),
        "InvalidSignature",
    ),
    (
        "signature_of_another_token",
        lambda k: ".".join([*segments(k)[:2], segments(k, sub="bob")[2]]),
        "InvalidSignature",
    ),
    ("signature_empty", lambda k: ".".join([*segments(k)[:2], ""]), "InvalidSignature"),
    ("signature_not_base64url", lambda k: ".".join([*segments(k)[:2], "!!!!"]), "malformed"),
    ("signed_by_other_key", lambda k: sign(k.other_rsa, "RS256", "rsa-1"), "InvalidSignature"),
    ("embedded_jwk_and_jku", embedded_jwk, "InvalidSignature"),
    # truncation and framing
    ("truncated_last_char", lambda k: sign(k.rsa, "RS256", "rsa-1")[:-1], "malformed"),
    (
        "truncated_signature_whole_bytes",  # 340 of 342 characters: 255 bytes, decodes fine
        lambda k: ".".join([*segments(k)[:2], segments(k)[2][:340]]),
        "InvalidSignature",
    ),
    (
        "truncated_in_payload",
        lambda k: f"{segments(k)[0]}.{segments(k)[1][: len(segments(k)[1]) // 2]}",
        "malformed",
    ),
    ("header_and_payload_only", lambda k: ".".join(segments(k)[:2]), "malformed"),
    ("header_only", lambda k: segments(k)[0], "malformed"),
    ("four_segments", lambda k: ".".join([*segments(k), "x"]), "malformed"),
    ("dots_only", lambda k: "..", "malformed"),
    ("empty_token", lambda k: "", "malformed"),
    ("space_inside", lambda k: " ".join(sign(k.rsa, "RS256", "rsa-1").split(".", 1)), "malformed"),
    ("non_ascii_char", lambda k: sign(k.rsa, "RS256", "rsa-1") + "é", "not ASCII"),
    ("lone_surrogate", lambda k: sign(k.rsa, "RS256", "rsa-1") + "\ud800", "not ASCII"),
    # huge and odd headers
    ("huge_token", lambda k: "a" * 20_000, "too long"),
    ("control_good_token_at_the_limit", good_token_of_length(16 * 1024), ALICE),
    ("good_token_just_over_the_limit", good_token_of_length(16 * 1024 + 1), "too long"),
    ("deeply_nested_header", with_header(nested(3_000)), "malformed"),
    ("deeply_nested_header_unclosed", with_header(nested(8_000, closed=False)), "malformed"),
    ("deeply_nested_header_10000", with_header(nested(10_000)), "too long"),
    ("deeply_nested_payload", with_payload(lambda: deep_payload(3_000)), "payload"),
    ("header_not_json", with_header(b"not json"), "malformed"),
    ("header_not_utf8", with_header(b'{"alg":"RS256","kid":"\xff"}'), "malformed"),
    ("header_array", with_header(b'["RS256"]'), "malformed"),
    ("header_string", with_header(b'"RS256"'), "malformed"),
    ("payload_array", with_payload(b"[1]"), "payload"),
    ("kid_list", with_header({**RSA_HEADER, "kid": ["rsa-1"]}), "malformed"),
    ("kid_object", with_header({**RSA_HEADER, "kid": {"kid": "rsa-1"}}), "malformed"),
    ("kid_null", with_header({**RSA_HEADER, "kid": None}), "malformed"),
    ("kid_huge", lambda k: sign(k.rsa, "RS256", "k" * 4_000), "unknown kid"),
    ("kid_path_traversal", lambda k: sign(k.rsa, "RS256", "../../../etc/passwd"), "unknown kid"),
    ("crit_unknown_extension", with_header({**RSA_HEADER, "crit": ["exp"]}), "malformed"),
    ("crit_not_a_list", with_header({**RSA_HEADER, "crit": "b64"}), "malformed"),
    ("b64_false_unencoded_payload",
     with_header({**RSA_HEADER, "b64": False, "crit": ["b64"]}), "malformed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("builder", "expected"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
async def test_hostile_tokens(
    keys: Keys, jwks_file: Path, builder: Callable[[Keys], str], expected: JwtIdentity | str
) -> None:
    verifier = JwtVerifier(JwtConfig(jwks=str(jwks_file), audience=AUD, issuer=ISS))
    token = builder(keys)
    if isinstance(expected, JwtIdentity):
        assert await verifier.verify(token) == expected
        return
    with pytest.raises(InvalidToken) as refused:
        await verifier.verify(token)
    assert type(refused.value) is InvalidToken
    assert expected in str(refused.value)
    assert len(str(refused.value)) <= 300  # a hostile token never floods the logs


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
    [
        None,
        "not json",
        json.dumps({"keys": "nope"}),
        json.dumps([1, 2]),
        '{"keys": ' + "[" * 5_000 + "]" * 5_000 + "}",
    ],
    ids=["missing_file", "not_json", "keys_not_list", "not_object", "deeply_nested"],
)
async def test_unusable_jwks_refuses(keys: Keys, tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "jwks.json"
    if content is not None:
        path.write_text(content)
    verifier = JwtVerifier(JwtConfig(jwks=str(path)))
    with pytest.raises(InvalidToken, match="JWKS unavailable"):
        await verifier.verify(sign(keys.rsa, "RS256", "rsa-1"))


def _raise(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


@pytest.mark.parametrize(
    ("target", "exc", "fragment"),
    [
        ("get_unverified_header", RecursionError("maximum recursion depth exceeded"), "Recursion"),
        ("get_unverified_header", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "Unicode"),
        ("get_algorithm_by_name", AttributeError("no from_jwk"), "unusable JWK"),
        ("decode", RuntimeError("crypto backend exploded"), "RuntimeError"),
        ("decode", OverflowError("int too large"), "OverflowError"),
        ("decode", RecursionError("maximum recursion depth exceeded"), "RecursionError"),
    ],
    ids=["header_recursion", "header_unicode", "key_lookup", "decode_runtime",
         "decode_overflow", "decode_recursion"],
)  # fmt: skip
async def test_any_failure_inside_verification_is_invalid_token(
    keys: Keys,
    jwks_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    exc: BaseException,
    fragment: str,
) -> None:
    """Whatever a parser, key loader or signature check raises, the caller sees InvalidToken
    (a 401), never the exception itself (a 500)."""
    verifier = JwtVerifier(JwtConfig(jwks=str(jwks_file), audience=AUD, issuer=ISS))
    token = sign(keys.rsa, "RS256", "rsa-1")
    monkeypatch.setattr(jwt, target, _raise(exc))
    with pytest.raises(InvalidToken, match=fragment):
        await verifier.verify(token)


async def test_unexpected_jwks_load_failure_is_invalid_token_and_rate_limited(
    keys: Keys, jwks_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    verifier = JwtVerifier(JwtConfig(jwks=str(jwks_file), audience=AUD, issuer=ISS), clock=clock)
    calls: list[int] = []

    async def broken_fetch() -> bytes:
        calls.append(1)
        raise RuntimeError("unexpected")

    monkeypatch.setattr(verifier, "_fetch", broken_fetch)
    token = sign(keys.rsa, "RS256", "rsa-1")
    for _ in range(3):
        with pytest.raises(InvalidToken, match="JWKS unavailable"):
            await verifier.verify(token)
    assert len(calls) == 1  # the failed attempt counts for the refresh rate limit
    monkeypatch.undo()
    clock.advance(31)
    assert await verifier.verify(token) == ALICE


@pytest.mark.parametrize("token", [None, 7, b"a.b.c", ["a", "b", "c"]], ids=repr)
async def test_a_token_that_is_not_a_string_is_invalid(jwks_file: Path, token: Any) -> None:
    verifier = JwtVerifier(JwtConfig(jwks=str(jwks_file)))
    with pytest.raises(InvalidToken, match="not a string"):
        await verifier.verify(token)


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
