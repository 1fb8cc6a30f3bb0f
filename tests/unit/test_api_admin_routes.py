"""The /admin HTTP API over a FastAPI app with ``current_admin`` overridden."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.admin.service import AdminService
from app.admin.views import PUBLIC_KEY_FIELDS
from app.api.admin_routes import AdminAccess, current_admin, router
from app.gateway.keys import parse_key, verify_secret
from app.state.protocol import AdmitRequest, AdmitResult, SettleRequest
from app.state.records import LedgerRecord, LedgerStatus
from app.state.sqlite_store import SqliteStore

TOKEN = "admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "s.db")
    yield s
    asyncio.run(s.close())


def client_for(access: AdminAccess) -> TestClient:
    app = FastAPI()
    app.include_router(router)
    app.dependency_overrides[current_admin] = lambda: access
    return TestClient(app)


@pytest.fixture
def client(store: SqliteStore) -> TestClient:
    return client_for(AdminAccess(AdminService(store), SecretStr(TOKEN)))


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def seed(store: SqliteStore, *rows: tuple[str, str, str, LedgerStatus, int, int, float]) -> None:
    """(request_id, tenant, model, status, prompt, completion, ended_at) per ledger record."""

    async def write() -> None:
        for request_id, tenant, model, status, prompt, completion, ended in rows:
            record = LedgerRecord(
                request_id=request_id,
                tenant=tenant,
                model_requested=model,
                endpoint="/v1/completions",
                status=status,
                http_status=200,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cost_usd=(prompt + completion) / 1000,
                e2e_s=1.0,
                started_at=ended - 1,
                ended_at=ended,
            )
            admit = AdmitRequest(request_id=request_id)
            await store.settle(SettleRequest(admit, AdmitResult(True), 0, 0.0, record))

    asyncio.run(write())


ROUTES = [
    ("GET", "/admin/tenants", None),
    ("POST", "/admin/tenants", {"id": "acme"}),
    ("POST", "/admin/keys", {"tenant": "acme"}),
    ("GET", "/admin/keys", None),
    ("POST", "/admin/keys/abc/rotate", None),
    ("DELETE", "/admin/keys/abc", None),
    ("GET", "/admin/usage", None),
    ("PUT", "/admin/limits", {"level": "team"}),
]


# ---- absent and authentication --------------------------------------------------------------


@pytest.mark.parametrize(
    "configured",
    ["no token", "empty token", "no service"],
)
@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_absent_without_configuration(
    store: SqliteStore, configured: str, method: str, path: str, body: Any
) -> None:
    access = {
        "no token": AdminAccess(AdminService(store), None),
        "empty token": AdminAccess(AdminService(store), SecretStr("")),
        "no service": AdminAccess(None, SecretStr(TOKEN)),
    }[configured]
    response = client_for(access).request(method, path, json=body, headers=AUTH)
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
    if body is not None:  # nothing was written
        assert asyncio.run(store.list_tenants()) == []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer ünïcode"},
    ],
)
@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_unauthorized(
    client: TestClient,
    store: SqliteStore,
    headers: dict[str, str],
    method: str,
    path: str,
    body: Any,
) -> None:
    encoded = {k: v.encode() for k, v in headers.items()}
    response = client.request(method, path, json=body, headers=encoded)
    assert response.status_code == 401
    assert error_of(response)["code"] == "invalid_api_key"
    assert "wrong-token" not in response.text and TOKEN not in response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert asyncio.run(store.list_tenants()) == []


def test_auth_comes_before_body_parsing(client: TestClient) -> None:
    response = client.post("/admin/tenants", content=b"{not json")
    assert response.status_code == 401
    response = client.post("/admin/tenants", content=b"{not json", headers=AUTH)
    assert (response.status_code, error_of(response)["code"]) == (400, "invalid_json")


# ---- keys -----------------------------------------------------------------------------------


def test_key_lifecycle(client: TestClient, store: SqliteStore) -> None:
    created = client.post(
        "/admin/keys",
        json={"tenant": "acme", "team": "ml", "name": "ci", "limits": {"rpm": 60}},
        headers=AUTH,
    )
    assert created.status_code == 201
    assert created.headers["cache-control"] == "no-store"
    secret, record = created.json()["key"], created.json()["record"]
    parsed = parse_key(secret)
    assert parsed is not None and parsed.key_id == record["id"]
    assert set(record) == set(PUBLIC_KEY_FIELDS)
    assert record["limits"]["rpm"] == 60 and record["team"] == "ml"

    listed = client.get("/admin/keys", params={"tenant": "acme"}, headers=AUTH)
    [view] = listed.json()["data"]
    assert set(view) == set(PUBLIC_KEY_FIELDS)
    assert view["prefix"] == secret.split("_", 1)[0]
    assert parsed.secret not in listed.text
    assert "salt" not in listed.text and "digest" not in listed.text
    assert client.get("/admin/keys", params={"tenant": "other"}, headers=AUTH).json() == {
        "data": []
    }

    rotated = client.post(f"/admin/keys/{record['id']}/rotate", headers=AUTH)
    assert rotated.status_code == 200
    new_secret = rotated.json()["key"]
    new_parsed = parse_key(new_secret)
    assert new_parsed is not None and new_parsed.key_id == record["id"]
    stored = asyncio.run(store.get_key(record["id"]))
    assert stored is not None
    assert verify_secret(new_parsed.secret, stored.salt, stored.digest)
    assert not verify_secret(parsed.secret, stored.salt, stored.digest)

    revoked = client.post(f"/admin/keys/{record['id']}/revoke", headers=AUTH)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = client.post(f"/admin/keys/{record['id']}/rotate", headers=AUTH)
    assert refused.status_code == 400
    assert "revoked" in error_of(refused)["message"]
    assert new_secret not in refused.text


def test_delete_revokes(client: TestClient) -> None:
    record = client.post("/admin/keys", json={"tenant": "acme"}, headers=AUTH).json()["record"]
    deleted = client.delete(f"/admin/keys/{record['id']}", headers=AUTH)
    assert deleted.status_code == 200 and deleted.json()["revoked_at"] is not None
    [view] = client.get("/admin/keys", headers=AUTH).json()["data"]
    assert view["revoked_at"] == deleted.json()["revoked_at"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/admin/keys/nope/revoke"),
        ("POST", "/admin/keys/nope/rotate"),
        ("DELETE", "/admin/keys/nope"),
    ],
)
def test_unknown_key_is_404(client: TestClient, method: str, path: str) -> None:
    response = client.request(method, path, headers=AUTH)
    assert response.status_code == 404
    assert error_of(response)["message"] == "no key 'nope'"


@pytest.mark.parametrize(
    ("expires_at", "expected"),
    [(4_000_000_000, 4_000_000_000.0), ("2096-10-02T07:06:40Z", 4_000_000_000.0)],
)
def test_create_key_with_expiry(client: TestClient, expires_at: Any, expected: float) -> None:
    body = {"tenant": "acme", "expires_at": expires_at}
    response = client.post("/admin/keys", json=body, headers=AUTH)
    assert response.status_code == 201
    assert response.json()["record"]["expires_at"] == expected


# ---- tenants and limits ---------------------------------------------------------------------


def test_tenants_create_conflict_patch(client: TestClient) -> None:
    created = client.post("/admin/tenants", json={"id": "acme", "limits": {"tpm": 5}}, headers=AUTH)
    assert created.status_code == 201
    assert (created.json()["id"], created.json()["limits"]["tpm"]) == ("acme", 5)
    again = client.post("/admin/tenants", json={"id": "acme"}, headers=AUTH)
    assert again.status_code == 409
    assert error_of(again)["code"] == "conflict"

    patched = client.patch("/admin/tenants/acme", json={"disabled": True}, headers=AUTH)
    assert patched.status_code == 200
    assert patched.json()["disabled"] is True and patched.json()["limits"]["tpm"] == 5
    [listed] = client.get("/admin/tenants", headers=AUTH).json()["data"]
    assert listed == patched.json()

    missing = client.patch("/admin/tenants/ghost", json={"disabled": True}, headers=AUTH)
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"


def test_limits_put_and_get(client: TestClient) -> None:
    for level, name, rpm in [("team", "ml", 10), ("user", "ann", 3), ("team", "ml", 20)]:
        body = {"level": level, "tenant": "acme", "name": name, "limits": {"rpm": rpm}}
        response = client.put("/admin/limits", json=body, headers=AUTH)
        assert response.status_code == 200 and response.json()["limits"]["rpm"] == rpm
    listed = client.get("/admin/limits", headers=AUTH).json()["data"]
    got = sorted((r["level"], r["name"], r["limits"]["rpm"]) for r in listed)
    assert got == [("team", "ml", 20), ("user", "ann", 3)]  # the second put replaced


# ---- usage ----------------------------------------------------------------------------------

LEDGER: list[tuple[str, str, str, LedgerStatus, int, int, float]] = [
    ("r1", "acme", "llama", "ok", 10, 5, 1000.0),
    ("r2", "acme", "llama", "error", 4, 0, 2000.0),
    ("r3", "beta", "qwen", "ok", 100, 20, 3000.0),
]


AL, BQ = ("acme", "llama"), ("beta", "qwen")


@pytest.mark.parametrize(
    ("params", "summary", "ids"),
    [
        ({}, {AL: (2, 1, 14, 5), BQ: (1, 0, 100, 20)}, ["r1", "r2", "r3"]),
        ({"tenant": "acme"}, {AL: (2, 1, 14, 5)}, ["r1", "r2"]),
        ({"since": "1500"}, {AL: (1, 1, 4, 0), BQ: (1, 0, 100, 20)}, ["r2", "r3"]),
        ({"until": "1970-01-01T00:33:20Z"}, {AL: (1, 0, 10, 5)}, ["r1"]),
        ({"since": "1000", "until": "3000"}, {AL: (2, 1, 14, 5)}, ["r1", "r2"]),
        ({"since": "1d"}, {}, []),
    ],
)
def test_usage_summary_and_records(
    client: TestClient,
    store: SqliteStore,
    params: dict[str, str],
    summary: dict[tuple[str, str], tuple[int, int, int, int]],
    ids: list[str],
) -> None:
    seed(store, *LEDGER)
    response = client.get("/admin/usage", params=params, headers=AUTH)
    assert response.status_code == 200 and response.json()["group"] == "summary"
    rows = response.json()["data"]
    got = {
        (r["tenant"], r["model"]): (
            r["requests"],
            r["errors"],
            r["prompt_tokens"],
            r["completion_tokens"],
        )
        for r in rows
    }
    assert got == summary
    for r in rows:
        assert r["cost_usd"] == pytest.approx((r["prompt_tokens"] + r["completion_tokens"]) / 1000)

    records = client.get("/admin/usage", params={**params, "group": "records"}, headers=AUTH)
    assert records.json()["group"] == "records"
    assert [r["request_id"] for r in records.json()["data"]] == ids


def test_usage_records_limit_keeps_the_newest(client: TestClient, store: SqliteStore) -> None:
    seed(store, *LEDGER)
    params = {"group": "records", "limit": "1"}
    data = client.get("/admin/usage", params=params, headers=AUTH).json()["data"]
    assert [r["request_id"] for r in data] == ["r3"]


@pytest.mark.parametrize(
    ("params", "ids"),
    [
        ({"request_id": "r2"}, ["r2"]),
        ({"request_id": "chatcmpl-r2"}, ["r2"]),
        ({"request_id": "r2", "tenant": "beta"}, []),
        ({"request_id": "r9"}, []),
    ],
)
def test_usage_by_request_id_gives_its_record(
    client: TestClient, store: SqliteStore, params: dict[str, str], ids: list[str]
) -> None:
    seed(store, *LEDGER)
    body = client.get("/admin/usage", params=params, headers=AUTH).json()
    assert body["group"] == "records"  # implied
    assert [r["request_id"] for r in body["data"]] == ids


# ---- bad requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("POST", "/admin/tenants", {"id": "acme", "bogus": 1}, "bogus"),
        ("POST", "/admin/tenants", {}, "id"),
        ("POST", "/admin/tenants", {"id": "acme", "limits": {"rpm": 0}}, "limits.rpm"),
        ("PATCH", "/admin/tenants/acme", {"disabled": "perhaps"}, "disabled"),
        ("POST", "/admin/keys", {"tenant": "acme", "secret": "x"}, "secret"),
        ("POST", "/admin/keys", {"tenant": "acme", "limits": {"burst": 1}}, "limits.burst"),
        ("POST", "/admin/keys", {"tenant": "acme", "expires_at": "soon"}, "expires_at"),
        ("PUT", "/admin/limits", {"level": "org", "tenant": "a", "name": "b"}, "level"),
        ("PUT", "/admin/limits", {"level": "team", "tenant": "a", "name": "b"}, "limits"),
        ("GET", "/admin/usage?since=yesterday", None, "since"),
        ("GET", "/admin/usage?until=later", None, "until"),
        ("GET", "/admin/usage?limit=0", None, "limit"),
        ("GET", "/admin/usage?group=daily", None, "group"),
    ],
)  # fmt: skip
def test_bad_request_names_the_param(
    client: TestClient, method: str, path: str, body: Any, param: str
) -> None:
    if method == "PATCH":
        assert client.post("/admin/tenants", json={"id": "acme"}, headers=AUTH).status_code == 201
    response = client.request(method, path, json=body, headers=AUTH)
    assert response.status_code == 400
    error = error_of(response)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_expiry_in_the_past_is_400(client: TestClient) -> None:
    body = {"tenant": "acme", "expires_at": "2001-01-01"}
    response = client.post("/admin/keys", json=body, headers=AUTH)
    assert response.status_code == 400 and "past" in error_of(response)["message"]
