"""API key format and hashing.

Format: ``sk-sy-<id>_<secret>``

* ``id``: 12 lowercase hex characters (``secrets.token_hex(6)``). Not secret: it names the
  key record in the store and is embedded in the key so a lookup needs no scan.
* ``secret``: ``secrets.token_urlsafe(32)``, i.e. 43 base64url characters (256 bits).
* ``prefix``: ``sk-sy-<id>``, the non-secret part shown in listings.

Hashing: the secret is never stored. Each key gets a fresh 16-byte random ``salt`` and the
store keeps ``digest = HMAC-SHA256(key=salt, msg=secret)``, both as hex. A fast keyed hash
is enough because the secret has 256 bits of entropy (no password stretching needed);
verification compares digests in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-sy-"
ID_HEX_CHARS = 12
SECRET_CHARS = 43  # len(secrets.token_urlsafe(32))
SALT_BYTES = 16
MAX_JWT_CHARS = 16 * 1024  # as app.gateway.jwt_auth.MAX_TOKEN_CHARS: longer is never a JWT

_KEY_RE = re.compile(
    rf"{re.escape(KEY_PREFIX)}(?P<id>[0-9a-f]{{{ID_HEX_CHARS}}})_(?P<secret>[A-Za-z0-9_-]{{{SECRET_CHARS}}})"
)
_B64URL_RE = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class NewKey:
    """A freshly minted key. ``secret_key`` is shown to the caller once, never stored."""

    key_id: str
    secret_key: str  # the full ``sk-sy-<id>_<secret>`` string
    prefix: str  # ``sk-sy-<id>``
    salt_hex: str
    digest_hex: str

    def __repr__(self) -> str:  # keep the secret out of logs and tracebacks
        return f"NewKey(key_id={self.key_id!r}, prefix={self.prefix!r})"


@dataclass(frozen=True)
class ParsedKey:
    key_id: str
    secret: str

    def __repr__(self) -> str:
        return f"ParsedKey(key_id={self.key_id!r})"


def key_prefix(key_id: str) -> str:
    return f"{KEY_PREFIX}{key_id}"


def digest_secret(secret: str, salt_hex: str) -> str:
    """HMAC-SHA256 of ``secret`` under the salt (hex), as hex."""
    return hmac.new(bytes.fromhex(salt_hex), secret.encode("utf-8"), hashlib.sha256).hexdigest()


def new_key(key_id: str | None = None) -> NewKey:
    """A fresh key; with ``key_id``, a new secret for that id (rotation)."""
    key_id = key_id or secrets.token_hex(ID_HEX_CHARS // 2)
    secret = secrets.token_urlsafe(32)
    salt_hex = secrets.token_bytes(SALT_BYTES).hex()
    return NewKey(
        key_id=key_id,
        secret_key=f"{key_prefix(key_id)}_{secret}",
        prefix=key_prefix(key_id),
        salt_hex=salt_hex,
        digest_hex=digest_secret(secret, salt_hex),
    )


def parse_key(presented: str) -> ParsedKey | None:
    """Split a presented key into id and secret; ``None`` unless it has the exact format."""
    m = _KEY_RE.fullmatch(presented)
    if m is None:
        return None
    return ParsedKey(key_id=m["id"], secret=m["secret"])


def verify_secret(secret: str, salt_hex: str, digest_hex: str) -> bool:
    """Whether ``secret`` hashes to ``digest_hex`` under ``salt_hex`` (constant-time compare).

    A malformed salt or digest (not hex) verifies as ``False``.
    """
    try:
        expected = bytes.fromhex(digest_hex)
        actual = bytes.fromhex(digest_secret(secret, salt_hex))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def _b64url_decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has the shape of a compact JWS: three base64url segments joined by
    dots, the first decoding to a JSON object with an ``alg`` member. Nothing is verified;
    this only decides which authenticator a bearer token goes to. It never raises: a token
    that is too long, or whose header cannot be decoded (not base64url, not UTF-8, not JSON,
    nested too deeply for the JSON parser), does not look like one."""
    if len(token) > MAX_JWT_CHARS:
        return False
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return False
    if not all(_B64URL_RE.fullmatch(p) for p in parts):
        return False
    try:
        header = json.loads(_b64url_decode(parts[0]))
    except (binascii.Error, ValueError, RecursionError):
        return False
    return isinstance(header, dict) and "alg" in header
