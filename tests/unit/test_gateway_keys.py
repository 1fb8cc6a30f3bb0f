from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable

import pytest

from app.gateway.keys import (
    KEY_PREFIX,
    NewKey,
    digest_secret,
    looks_like_jwt,
    new_key,
    parse_key,
    verify_secret,
)


def _b64(obj: object) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


GOOD_ID = "0123456789ab"
GOOD_SECRET = "A" * 21 + "_" + "-" * 21  # 43 base64url chars, with '_' and '-' inside
GOOD_KEY = f"sk-sy-{GOOD_ID}_{GOOD_SECRET}"


def test_new_key_has_documented_shape() -> None:
    k = new_key()
    assert re.fullmatch(r"[0-9a-f]{12}", k.key_id)
    assert k.prefix == f"{KEY_PREFIX}{k.key_id}"
    assert k.secret_key.startswith(k.prefix + "_")
    assert len(bytes.fromhex(k.salt_hex)) == 16
    assert len(bytes.fromhex(k.digest_hex)) == 32


def test_round_trip_verifies() -> None:
    k = new_key()
    parsed = parse_key(k.secret_key)
    assert parsed is not None
    assert parsed.key_id == k.key_id
    assert k.secret_key == f"{k.prefix}_{parsed.secret}"
    assert verify_secret(parsed.secret, k.salt_hex, k.digest_hex)


def test_digest_is_hmac_of_secret_not_the_secret() -> None:
    k = new_key()
    parsed = parse_key(k.secret_key)
    assert parsed is not None
    secret = parsed.secret
    assert secret not in k.digest_hex
    assert secret.encode().hex() != k.digest_hex
    assert k.digest_hex == digest_secret(secret, k.salt_hex)
    # the salt matters: same secret, other salt, other digest
    assert digest_secret(secret, "00" * 16) != k.digest_hex


def test_secret_stays_out_of_repr() -> None:
    k = new_key()
    parsed = parse_key(k.secret_key)
    assert parsed is not None
    assert parsed.secret not in repr(k)
    assert parsed.secret not in repr(parsed)


def _flip_last_hex(h: str) -> str:
    return h[:-1] + ("0" if h[-1] != "0" else "1")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda k, s: (s, k.salt_hex, k.digest_hex), True),
        (lambda k, s: (s[:-1] + ("A" if s[-1] != "A" else "B"), k.salt_hex, k.digest_hex), False),
        (lambda k, s: (s + "x", k.salt_hex, k.digest_hex), False),
        (lambda k, s: ("", k.salt_hex, k.digest_hex), False),
        (lambda k, s: (s, k.salt_hex, _flip_last_hex(k.digest_hex)), False),
        (lambda k, s: (s, _flip_last_hex(k.salt_hex), k.digest_hex), False),
        (lambda k, s: (s, k.salt_hex, k.digest_hex[:-2]), False),
        (lambda k, s: (s, k.salt_hex, "zz" * 32), False),
        (lambda k, s: (s, "not-hex", k.digest_hex), False),
        (lambda k, s: (s, k.salt_hex, ""), False),
    ],
    ids=[
        "correct",
        "wrong_secret",
        "longer_secret",
        "empty_secret",
        "tampered_digest",
        "tampered_salt",
        "truncated_digest",
        "non_hex_digest",
        "non_hex_salt",
        "empty_digest",
    ],
)
def test_verify_secret(
    mutate: Callable[[NewKey, str], tuple[str, str, str]], expected: bool
) -> None:
    k = new_key()
    parsed = parse_key(k.secret_key)
    assert parsed is not None
    args = mutate(k, parsed.secret)
    assert verify_secret(*args) is expected


def test_key_from_other_record_does_not_verify() -> None:
    a, b = new_key(), new_key()
    pa = parse_key(a.secret_key)
    assert pa is not None
    assert not verify_secret(pa.secret, b.salt_hex, b.digest_hex)


def test_parse_accepts_exact_format() -> None:
    parsed = parse_key(GOOD_KEY)
    assert parsed is not None
    assert (parsed.key_id, parsed.secret) == (GOOD_ID, GOOD_SECRET)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "sk-sy-",
        f"sk-sy-{GOOD_ID}",
        f"sk-sy-{GOOD_ID}_",
        f"sk-sy-{GOOD_ID}{GOOD_SECRET}",  # no separator
        f"sk-sy-{GOOD_ID}-{GOOD_SECRET}",  # wrong separator
        f"sk-{GOOD_ID}_{GOOD_SECRET}",  # wrong prefix
        f"sk-xx-{GOOD_ID}_{GOOD_SECRET}",
        f"SK-SY-{GOOD_ID}_{GOOD_SECRET}",
        f" {GOOD_KEY}",
        f"{GOOD_KEY} ",
        f"{GOOD_KEY}\n",
        f"Bearer {GOOD_KEY}",
        f"sk-sy-{GOOD_ID.upper()}_{GOOD_SECRET}",  # id must be lowercase
        f"sk-sy-0123456789ag_{GOOD_SECRET}",  # non-hex id
        f"sk-sy-0123456789a_{GOOD_SECRET}",  # 11-char id
        f"sk-sy-0123456789abc_{GOOD_SECRET}",  # 13-char id
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET[:-1]}",  # 42-char secret
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET}A",  # 44-char secret
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET[:-1]}=",  # padding
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET[:-1]}+",  # standard (not url-safe) base64
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET[:-1]}/",
        f"sk-sy-{GOOD_ID}_{GOOD_SECRET[:-1]}é",
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
    ],
)
def test_parse_rejects_malformed(bad: str) -> None:
    assert parse_key(bad) is None


def test_generated_ids_salts_and_secrets_are_unique() -> None:
    keys: list[NewKey] = [new_key() for _ in range(500)]
    assert len({k.key_id for k in keys}) == len(keys)
    assert len({k.salt_hex for k in keys}) == len(keys)
    assert len({k.secret_key for k in keys}) == len(keys)
    assert len({k.digest_hex for k in keys}) == len(keys)
    assert all(parse_key(k.secret_key) is not None for k in keys)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64({'sub': 'x'})}.c2ln", True),
        (f"{_b64({'alg': 'none'})}.{_b64({'sub': 'x'})}.", True),  # unsigned still looks like one
        (f"{_b64({'alg': 'ES256', 'kid': 'k1'})}.{_b64({})}.{'A' * 86}", True),
        (GOOD_KEY, False),
        ("", False),
        ("..", False),
        ("a.b", False),
        ("a.b.c.d", False),
        (f"{_b64({'typ': 'JWT'})}.{_b64({'sub': 'x'})}.c2ln", False),  # no alg
        (f"{_b64(['alg'])}.{_b64({'sub': 'x'})}.c2ln", False),  # header not an object
        (f"{_b64(b'not json')}.{_b64({'sub': 'x'})}.c2ln", False),
        (f"{_b64(bytes([0xFF, 0xFE]))}.{_b64({'sub': 'x'})}.c2ln", False),  # not utf-8
        (f"{_b64({'alg': 'RS256'})}..c2ln", False),  # empty payload
        (f".{_b64({'sub': 'x'})}.c2ln", False),  # empty header
        (f"{_b64({'alg': 'RS256'})}.{_b64({'sub': 'x'})}.c2l+", False),  # not url-safe
        (f"{_b64({'alg': 'RS256'})}=.{_b64({'sub': 'x'})}.c2ln", False),  # padding
        ("x" + f"{_b64({'alg': 'RS256'})}.{_b64({'sub': 'x'})}.c2ln", False),  # corrupt header
    ],
)
def test_looks_like_jwt(token: str, expected: bool) -> None:
    assert looks_like_jwt(token) is expected
