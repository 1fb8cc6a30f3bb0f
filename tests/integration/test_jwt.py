"""JWT bearer tokens over real HTTP: the tenant, team and user come from the claims;
a bad token is 401, a good token for an unknown or disabled tenant is 403."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.integration.conftest import SIM_FAST, Deploy, Gateway

AUDIENCE = "switchyard-api"
ISSUER = "https://idp.example.test"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
HELLO = [{"role": "user", "content": "hi"}]


def _token(**overrides: Any) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "tenant": "jwt-tenant",
        "team": "research",
        "iat": now,
        "exp": now + 300,
        **overrides,
    }
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, KEY, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def jwt_gateway(deploy: Deploy, tmp_path_factory: pytest.TempPathFactory) -> Gateway:
    jwk = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
    jwks = tmp_path_factory.mktemp("jwks") / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}))
    gw = deploy(
        "jwt",
        {"models": [{"id": "sim-jwt", "engine": "simulated", "simulation": SIM_FAST}]},
        jwt_jwks=str(Path(jwks)),
        jwt_audience=AUDIENCE,
        jwt_issuer=ISSUER,
    )
    for tenant in ("jwt-tenant", "jwt-disabled"):
        gw.admin("POST", "/tenants", json={"id": tenant})
    gw.admin("PATCH", "/tenants/jwt-disabled", json={"disabled": True})
    return gw


def test_a_valid_token_is_served_as_its_tenant(jwt_gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=jwt_gateway.v1, api_key=_token(), max_retries=0)
    out = client.chat.completions.create(model="sim-jwt", messages=HELLO, max_tokens=3)
    assert out.choices[0].message.content
    records = jwt_gateway.records("jwt-tenant")
    assert [(r["tenant"], r["team"], r["user"], r["key_id"]) for r in records] == [
        ("jwt-tenant", "research", "alice", None)
    ]


@pytest.mark.parametrize(
    ("case", "token", "status"),
    [
        ("expired", lambda: _token(exp=int(time.time()) - 120), 401),
        ("wrong audience", lambda: _token(aud="someone-else"), 401),
        ("wrong issuer", lambda: _token(iss="https://evil.test"), 401),
        ("no tenant claim", lambda: _token(tenant=None), 401),
        ("unknown tenant", lambda: _token(tenant="nobody"), 403),
        ("disabled tenant", lambda: _token(tenant="jwt-disabled"), 403),
    ],
)
def test_bad_tokens(jwt_gateway: Gateway, case: str, token: Any, status: int) -> None:
    response = httpx.post(
        jwt_gateway.v1 + "/chat/completions",
        json={"model": "sim-jwt", "messages": HELLO},
        headers={"Authorization": f"Bearer {token()}"},
        timeout=30,
    )
    assert response.status_code == status, case
    assert response.json()["error"]["code"] in ("invalid_api_key", "forbidden")


def test_no_credential_is_401_without_an_anonymous_tenant(jwt_gateway: Gateway) -> None:
    response = httpx.post(
        jwt_gateway.v1 + "/chat/completions", json={"model": "sim-jwt", "messages": HELLO}
    )
    assert response.status_code == 401
