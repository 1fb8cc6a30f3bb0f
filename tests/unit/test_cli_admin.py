"""``switchyard keys|tenants|limits|usage`` through typer's CliRunner on a SQLite store."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.gateway.keys import parse_key, verify_secret
from app.settings import Settings
from app.state.protocol import AdmitRequest, AdmitResult, SettleRequest
from app.state.records import KeyRecord, LedgerRecord, LedgerStatus
from app.state.sqlite_store import SqliteStore

runner = CliRunner()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, cache_dir=tmp_path, state_url=None)


def invoke(settings: Settings, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), obj=settings)
    return result.exit_code, result.stdout, result.stderr


def ok(settings: Settings, *args: str) -> str:
    code, out, err = invoke(settings, *args)
    assert code == 0, err
    return out


def as_json(settings: Settings, *args: str) -> Any:
    return json.loads(ok(settings, *args, "--format", "json"))


def stored_key(settings: Settings, key_id: str) -> KeyRecord:
    async def get() -> KeyRecord | None:
        store = SqliteStore(settings.data_dir / "state.db")
        try:
            return await store.get_key(key_id)
        finally:
            await store.close()

    record = asyncio.run(get())
    assert record is not None
    return record


def verifies(settings: Settings, secret: str) -> bool:
    parsed = parse_key(secret)
    assert parsed is not None
    record = stored_key(settings, parsed.key_id)
    return verify_secret(parsed.secret, record.salt, record.digest)


def gpu_s(prompt: int, completion: int) -> float:
    return 0.01 * prompt + 0.05 * completion


def seed(path: Path, *rows: tuple[str, str, str, LedgerStatus, int, int, int, float]) -> None:
    """(request_id, tenant, model, status, prompt, completion, cached, ended_at)."""

    async def write() -> None:
        store = SqliteStore(path)
        try:
            for request_id, tenant, model, status, prompt, completion, cached, ended in rows:
                record = LedgerRecord(
                    request_id=request_id,
                    tenant=tenant,
                    model_requested=model,
                    endpoint="/v1/chat/completions",
                    status=status,
                    http_status=200,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cached_tokens=cached,
                    cost_usd=prompt * 0.001 + completion * 0.002,
                    # engine seconds and their price; none where the request failed
                    gpu_seconds=None if status == "error" else gpu_s(prompt, completion),
                    gpu_cost_usd=None if status == "error" else gpu_s(prompt, completion) / 1800,
                    e2e_s=1.0,
                    started_at=ended - 1,
                    ended_at=ended,
                )
                admit = AdmitRequest(request_id=request_id)
                await store.settle(SettleRequest(admit, AdmitResult(True), 0, 0.0, record))
        finally:
            await store.close()

    asyncio.run(write())


# ---- keys -----------------------------------------------------------------------------------


def test_keys_create_prints_only_the_secret(settings: Settings) -> None:
    code, out, err = invoke(settings, "keys", "create", "--tenant", "acme", "--rpm", "60")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 1 and out.endswith("\n")
    assert parse_key(lines[0]) is not None
    assert verifies(settings, lines[0])
    assert "not be shown again" in err
    assert lines[0] not in err


def test_keys_list_shows_limits_and_never_secrets(settings: Settings) -> None:
    secret = ok(
        settings,
        *("keys", "create", "--tenant", "acme", "--team", "ml", "--user", "ann"),
        *("--name", "ci", "--rpm", "60", "--daily-usd", "2.5", "--max-concurrent", "4"),
        *("--priority", "interactive", "--share", "2", "--raise-priority"),
        *("--expires", "2100-01-01T00:00:00Z"),
    ).strip()
    ok(settings, "keys", "create", "--tenant", "beta")
    listed = as_json(settings, "keys", "list", "--tenant", "acme")
    [key] = listed
    assert "salt" not in key and "digest" not in key
    assert secret.split("_", 1)[1] not in json.dumps(listed)
    assert key["prefix"] == secret.split("_", 1)[0]
    assert (key["tenant"], key["team"], key["user"], key["name"]) == ("acme", "ml", "ann", "ci")
    assert key["limits"] == {
        "rpm": 60, "tpm": None, "max_concurrent": 4, "daily_tokens": None,
        "monthly_tokens": None, "daily_usd": 2.5, "monthly_usd": None,
        "priority": "interactive", "share": 2.0, "raise_priority": True,
    }  # fmt: skip
    assert key["expires_at"] == 4_102_444_800.0
    assert len(as_json(settings, "keys", "list")) == 2

    table = ok(settings, "keys", "list")
    assert key["prefix"] in table and "rpm=60" in table
    assert secret.split("_", 1)[1] not in table


def test_keys_revoke_and_rotate(settings: Settings) -> None:
    first = ok(settings, "keys", "create", "--tenant", "acme", "--tpm", "1000").strip()
    key_id = first.split("_", 1)[0].removeprefix("sk-sy-")

    code, out, err = invoke(settings, "keys", "rotate", key_id)
    assert code == 0 and len(out.splitlines()) == 1
    second = out.strip()
    assert second != first and parse_key(second) is not None
    assert verifies(settings, second) and not verifies(settings, first)
    assert "not be shown again" in err
    [key] = as_json(settings, "keys", "list")
    assert key["id"] == key_id and key["limits"]["tpm"] == 1000

    code, out, err = invoke(settings, "keys", "revoke", key_id)
    assert (code, out) == (0, "")
    assert "revoked" in err
    [key] = as_json(settings, "keys", "list")
    assert key["revoked_at"] is not None
    assert ok(settings, "keys", "revoke", key_id) == ""  # idempotent

    code, out, err = invoke(settings, "keys", "rotate", key_id)
    assert (code, out) == (1, "")
    assert "revoked" in err


def test_keys_create_with_expiry_in_the_past_fails(settings: Settings) -> None:
    code, out, err = invoke(settings, "keys", "create", "--tenant", "a", "--expires", "2001-01-01")
    assert (code, out) == (1, "")
    assert "past" in err


def test_state_url_option_wins_over_settings(settings: Settings, tmp_path: Path) -> None:
    other = tmp_path / "other" / "elsewhere.db"
    url = f"sqlite:///{other}"
    ok(settings, "tenants", "create", "acme", "--state-url", url)
    assert other.exists()
    assert as_json(settings, "tenants", "list") == []
    assert [t["id"] for t in as_json(settings, "tenants", "list", "--state-url", url)] == ["acme"]


# ---- tenants and limits ---------------------------------------------------------------------


def test_tenants_lifecycle(settings: Settings) -> None:
    ok(settings, "tenants", "create", "acme", "--tpm", "500", "--monthly-tokens", "0")
    [tenant] = as_json(settings, "tenants", "list")
    assert tenant["id"] == "acme" and not tenant["disabled"]
    assert tenant["limits"]["tpm"] == 500 and tenant["limits"]["monthly_tokens"] == 0

    code, _, err = invoke(settings, "tenants", "create", "acme")
    assert code == 1 and "exists already" in err

    ok(settings, "tenants", "disable", "acme")
    assert as_json(settings, "tenants", "list")[0]["disabled"] is True
    assert "disabled" in ok(settings, "tenants", "list")
    ok(settings, "tenants", "enable", "acme")
    assert as_json(settings, "tenants", "list")[0]["disabled"] is False

    ok(settings, "tenants", "set-limits", "acme", "--rpm", "9")
    [tenant] = as_json(settings, "tenants", "list")
    assert tenant["limits"]["rpm"] == 9 and tenant["limits"]["tpm"] is None  # replaced


def test_limits_set_and_list(settings: Settings) -> None:
    ok(settings, "limits", "set", "--tenant", "acme", "--team", "ml", "--rpm", "10")
    ok(settings, "limits", "set", "--tenant", "acme", "--user", "ann", "--daily-tokens", "100")
    ok(settings, "limits", "set", "--tenant", "acme", "--team", "ml", "--rpm", "20")
    listed = as_json(settings, "limits", "list")
    got = sorted((r["level"], r["tenant"], r["name"], r["limits"]["rpm"]) for r in listed)
    assert got == [("team", "acme", "ml", 20), ("user", "acme", "ann", None)]
    assert "daily_tokens=100" in ok(settings, "limits", "list")


@pytest.mark.parametrize(
    "args",
    [
        ("limits", "set", "--tenant", "acme", "--rpm", "1"),
        ("limits", "set", "--tenant", "acme", "--team", "a", "--user", "b"),
        ("keys", "create", "--tenant", "acme", "--rpm", "0"),
        ("keys", "create", "--tenant", "acme", "--daily-usd", "-1"),
        ("keys", "create", "--tenant", "acme", "--expires", "someday"),
        ("usage", "--since", "yesterday"),
        ("usage", "--format", "xml"),
    ],
)
def test_usage_errors_exit_2_and_write_nothing(settings: Settings, args: tuple[str, ...]) -> None:
    code, out, _ = invoke(settings, *args)
    assert (code, out) == (2, "")
    assert not (settings.data_dir / "state.db").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("keys", "revoke", "nope"), "no key 'nope'"),
        (("keys", "rotate", "nope"), "no key 'nope'"),
        (("tenants", "disable", "ghost"), "no tenant 'ghost'"),
        (("tenants", "set-limits", "ghost", "--rpm", "1"), "no tenant 'ghost'"),
        (("keys", "list", "--state-url", "mysql://db/x"), "unsupported state URL"),
        (("usage", "--state-url", "sqlite:////dev/null/x/state.db"), "state store"),
    ],
)
def test_errors_exit_1_with_the_message_on_stderr(
    settings: Settings, args: tuple[str, ...], message: str
) -> None:
    code, out, err = invoke(settings, *args)
    assert (code, out) == (1, "")
    assert message in err and err.startswith("error:")


# ---- usage ----------------------------------------------------------------------------------

LEDGER: list[tuple[str, str, str, LedgerStatus, int, int, int, float]] = [
    ("r1", "acme", "llama", "ok", 10, 5, 2, 1000.0),
    ("r2", "acme", "llama", "error", 4, 0, 0, 2000.0),
    ("r3", "acme", "qwen", "ok", 7, 3, 0, 2500.0),
    ("r4", "beta", "qwen", "client_closed", 100, 20, 50, 3000.0),
]


@pytest.fixture
def seeded(settings: Settings) -> Settings:
    seed(settings.data_dir / "state.db", *LEDGER)
    return settings


TOKEN_COUNTS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens")


def test_usage_json_summary(seeded: Settings) -> None:
    rows = json.loads(ok(seeded, "usage", "--format", "json"))
    got = {(r["tenant"], r["model"]): tuple(r[f] for f in TOKEN_COUNTS) for r in rows}
    assert got == {
        ("acme", "llama"): (2, 1, 14, 5, 2),
        ("acme", "qwen"): (1, 0, 7, 3, 0),
        ("beta", "qwen"): (1, 1, 100, 20, 50),
    }
    costs = {(r["tenant"], r["model"]): r["cost_usd"] for r in rows}
    assert costs[("acme", "llama")] == pytest.approx(0.014 + 0.010)


def test_usage_csv_adds_up(seeded: Settings) -> None:
    out = ok(seeded, "usage", "--format", "csv")
    reader = csv.DictReader(io.StringIO(out))
    assert reader.fieldnames == [
        "tenant", "model", "requests", "errors", "prompt_tokens",
        "completion_tokens", "cached_tokens", "cost_usd", "gpu_seconds", "gpu_cost_usd",
    ]  # fmt: skip
    rows = list(reader)
    assert len(rows) == 3
    assert sum(int(r["requests"]) for r in rows) == len(LEDGER)
    assert sum(int(r["prompt_tokens"]) for r in rows) == sum(x[4] for x in LEDGER)
    assert sum(int(r["completion_tokens"]) for r in rows) == sum(x[5] for x in LEDGER)
    assert sum(int(r["cached_tokens"]) for r in rows) == sum(x[6] for x in LEDGER)
    expected_cost = sum(x[4] * 0.001 + x[5] * 0.002 for x in LEDGER)
    assert sum(float(r["cost_usd"]) for r in rows) == pytest.approx(expected_cost)
    # list price and GPU-time cost side by side; a record without GPU time adds nothing
    gpu = {(r["tenant"], r["model"]): float(r["gpu_seconds"]) for r in rows}
    expected = {
        ("acme", "llama"): gpu_s(10, 5), ("acme", "qwen"): gpu_s(7, 3),
        ("beta", "qwen"): gpu_s(100, 20),
    }  # fmt: skip
    assert gpu == pytest.approx(expected)
    gpu_usd = sum(float(r["gpu_cost_usd"]) for r in rows)
    assert gpu_usd == pytest.approx(sum(gpu.values()) / 1800)


def test_usage_table(seeded: Settings) -> None:
    out = ok(seeded, "usage", "--tenant", "acme")
    lines = [line for line in out.splitlines() if "llama" in line or "qwen" in line]
    assert len(lines) == 2 and all("acme" in line for line in lines)
    assert "beta" not in out
    total = next(line for line in out.splitlines() if "total" in line)
    assert [c for c in total.replace("│", " ").split()][1:6] == ["3", "1", "21", "8", "2"]


@pytest.mark.parametrize(
    ("args", "ids"),
    [
        ((), ["r1", "r2", "r3", "r4"]),
        (("--tenant", "beta"), ["r4"]),
        (("--since", "2000"), ["r2", "r3", "r4"]),
        (("--until", "1970-01-01T00:41:40"), ["r1", "r2"]),  # 2500, exclusive; no zone: UTC
        (("--since", "1500", "--until", "2600", "--tenant", "acme"), ["r2", "r3"]),
        (("--since", "1h"), []),
        (("--limit", "2"), ["r3", "r4"]),
    ],
)
def test_usage_records_filters(seeded: Settings, args: tuple[str, ...], ids: list[str]) -> None:
    records = json.loads(ok(seeded, "usage", "--records", "--format", "json", *args))
    assert sorted(r["request_id"] for r in records) == ids
    out = ok(seeded, "usage", "--records", "--format", "csv", *args)
    assert sorted(r["request_id"] for r in csv.DictReader(io.StringIO(out))) == ids
    table = ok(seeded, "usage", "--records", *args)
    assert all(request_id in table for request_id in ids)


@pytest.mark.parametrize(
    ("args", "ids"),
    [
        (("--request-id", "r3"), ["r3"]),
        (("--request-id", "chatcmpl-r3"), ["r3"]),  # the response's id works too
        (("--request-id", "cmpl-r4"), ["r4"]),
        (("--request-id", "r3", "--tenant", "beta"), []),
        (("--request-id", "nope"), []),
    ],
)
def test_usage_finds_one_request_by_its_id(
    seeded: Settings, args: tuple[str, ...], ids: list[str]
) -> None:
    """--request-id implies --records."""
    records = json.loads(ok(seeded, "usage", "--format", "json", *args))
    assert [r["request_id"] for r in records] == ids
