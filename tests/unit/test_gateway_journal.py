"""The settlement journal (app/gateway/journal.py): the JSON round trip of a
SettleRequest, append and compaction on disk, one owner per file (flock), and the
replay of files left by earlier processes. Plus the setting that places it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from app.builders import gateway_config
from app.config import AppArgs, GatewayArgs, ModelSpec
from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
from app.gateway.journal import (
    Backoff,
    SettleJournal,
    decode,
    encode,
    file_name,
    settle_from_json,
    settle_to_json,
)
from app.gateway.plan import Plan
from app.observability.metrics import GatewayMetrics
from app.request import Caller, Outcome
from app.settings import Settings
from app.state.protocol import (
    AdmitRequest,
    AdmitResult,
    BudgetCheck,
    ConcurrencyCheck,
    LedgerQuery,
    Price,
    RateCheck,
    RateState,
    SettleRequest,
    StateStore,
    StoreUnavailable,
)
from app.state.records import LedgerRecord
from app.state.sqlite_store import SqliteStore
from tests.request_helpers import gated


def record(rid: str, **kw: object) -> LedgerRecord:
    return LedgerRecord.model_validate(
        {"request_id": rid, "tenant": "acme", "model_requested": "m",
         "endpoint": "/v1/chat/completions", "status": "ok", "http_status": 200,
         "e2e_s": 0.25, "started_at": 1_700_000_000.125, "ended_at": 1_700_000_000.375, **kw}
    )  # fmt: skip


def full(rid: str = "r-1") -> SettleRequest:
    """A settlement with every field set to something other than its default."""
    rec = record(
        rid, client_request_id="c-1", session_id="s-1", team="ml", user="alice",
        key_id="abc123abc123", model_served="m-served", pool="LLMServer-m",
        route_step="canary", attempts=2, prompt_tokens=100, completion_tokens=42,
        cached_tokens=7, cost_usd=1.0 / 3, ttft_s=0.0125, ingress="ingress-0",
        status="client_closed", http_status=499,
    )  # fmt: skip
    admit = AdmitRequest(
        request_id=rid,
        rates=(RateCheck("rate:tenant:acme:requests", "requests", 10),
               RateCheck("rate:tenant:acme:tokens", "tokens", 10_000)),
        concurrency=(ConcurrencyCheck("conc:tenant:acme", 4),),
        budgets=(BudgetCheck("budget:tenant:acme:tokens:d:2026-11-29", "tokens", 1e6, 1.8e9),
                 BudgetCheck("budget:tenant:acme:usd:m:2026-11", "usd", 12.5, 1.9e9)),
        prompt_tokens=100,
        max_output_tokens=500,
        min_output_tokens=16,
        price=Price(input=2e-6, output=8e-6, cached_input=5e-7),
        ttl_s=12.5,
        pending=record(rid, status="lost"),
    )  # fmt: skip
    result = AdmitResult(
        admitted=True,
        allowance=480,
        reserved_tokens=580,
        reserved_usd=0.0042,
        reason="budget",
        scope_key="budget:tenant:acme:tokens:d:2026-11-29",
        retry_after_s=1.5,
        rates=(RateState("requests", 10, 9, 6.0), RateState("tokens", 10_000, 9_420, 3.5)),
    )
    return SettleRequest(admit, result, 142, 0.000536, rec, key_id="abc123abc123")


def simple(rid: str, completion: int = 1) -> SettleRequest:
    return SettleRequest(AdmitRequest(rid), AdmitResult(True), 10 + completion, 0.0, record(rid))


def lines(path: Path) -> list[SettleRequest]:
    return [decode(line) for line in path.read_bytes().splitlines()]


# ---- JSON -----------------------------------------------------------------------------


def test_round_trip_keeps_every_field() -> None:
    s = full()
    back = decode(encode(s))
    assert back == s
    assert back.admit.pending == s.admit.pending  # not compared by AdmitRequest's __eq__
    assert back.record.cost_usd == s.record.cost_usd  # floats survive exactly
    assert encode(s).endswith(b"\n") and encode(s).count(b"\n") == 1
    assert settle_from_json(settle_to_json(simple("x"))) == simple("x")


@pytest.mark.parametrize(
    ("cls", "key"), [(SettleRequest, None), (AdmitRequest, "admit"), (AdmitResult, "result")]
)
def test_json_covers_every_dataclass_field(cls: type, key: str | None) -> None:
    """A field added to the protocol must be added to the journal's JSON too."""
    data = settle_to_json(full())
    assert set(data if key is None else data[key]) == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    "line",
    [
        b'{"v": 2, "settle": {}}',
        b'{"v": 1, "settle": {"admit": {}}}',
        b"not json",
        b'{"v": 1',
        b"[1, 2]",
    ],
)
def test_decode_refuses_bad_lines(line: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        decode(line)


def test_file_names() -> None:
    assert file_name("ingress-0") == "settle-ingress-0.jsonl"
    assert file_name("abc_DEF.1") == "settle-abc_DEF.1.jsonl"
    odd = [file_name(r) for r in ("a/b", "a:b", "a b", "..", "", "x" * 300)]
    assert all("/" not in n and n.startswith("settle-") and n.endswith(".jsonl") for n in odd)
    assert len(set(odd)) == len(odd)
    assert file_name("a/b") != file_name("a_b")  # the hash keeps distinct ids apart
    assert all(len(n) < 120 for n in odd)
    assert file_name(None) != file_name(None)


def test_backoff_doubles_up_to_the_cap() -> None:
    b = Backoff(0.5, 30.0)
    delays = [0.5]
    for _ in range(8):
        delays.append(b.next(delays[-1]))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


# ---- the file ---------------------------------------------------------------------------


async def test_memory_only_without_a_directory() -> None:
    j = SettleJournal(None, "ingress-0")
    assert j.open() == []
    assert await j.append(simple("a")) is False
    assert not j.durable and len(j) == 1 and j.path is None
    j.discard("a")
    await j.compact()
    assert not j


async def test_append_is_on_disk_at_once_and_compact_rewrites(tmp_path: Path) -> None:
    j = SettleJournal(tmp_path, "ingress-0")
    assert j.open() == []
    assert j.path == tmp_path / "settle-ingress-0.jsonl" and j.durable
    entries = [full("a"), simple("b"), simple("c")]
    for s in entries:
        assert await j.append(s) is True
        assert lines(j.path)[-1] == s  # on disk when append returns
    assert await j.append(simple("b", completion=99)) is True  # same id: kept once
    assert lines(j.path) == entries and j.pending == entries
    inode = j.path.stat().st_ino
    j.discard("a")
    j.discard("c")
    await j.compact()
    assert lines(j.path) == [simple("b")] and j.pending == [simple("b")]
    assert j.path.stat().st_ino != inode  # replaced, not edited in place
    await j.append(simple("d"))
    assert lines(j.path) == [simple("b"), simple("d")]
    assert [p.name for p in tmp_path.iterdir()] == [j.path.name]  # no temp file left


async def test_concurrent_appends_all_reach_the_file(tmp_path: Path) -> None:
    j = SettleJournal(tmp_path, "ingress-0")
    j.open()
    assert j.path is not None
    results = await asyncio.gather(*(j.append(simple(f"r{i}")) for i in range(50)))
    assert all(results)
    assert {s.admit.request_id for s in lines(j.path)} == {f"r{i}" for i in range(50)}
    assert len(lines(j.path)) == 50


async def test_requeue_moves_an_entry_to_the_back(tmp_path: Path) -> None:
    j = SettleJournal(tmp_path, "r")
    j.open()
    for rid in "abc":
        await j.append(simple(rid))
    j.requeue(simple("a"))
    assert [s.admit.request_id for s in j.pending] == ["b", "c", "a"]


async def test_close_deletes_an_empty_file_and_keeps_a_pending_one(tmp_path: Path) -> None:
    empty = SettleJournal(tmp_path, "r0")
    empty.open()
    await empty.append(simple("a"))
    empty.discard("a")
    await empty.close()
    assert not (tmp_path / "settle-r0.jsonl").exists()
    kept = SettleJournal(tmp_path, "r1")
    kept.open()
    await kept.append(simple("b"))
    await kept.close()
    assert lines(tmp_path / "settle-r1.jsonl") == [simple("b")]


# ---- ownership and replay --------------------------------------------------------------


async def test_a_file_has_one_owner(tmp_path: Path) -> None:
    first = SettleJournal(tmp_path, "ingress-0")
    first.open()
    await first.append(simple("a"))
    # the same replica id twice (never in Ray; a misconfigured pair): another file
    twin = SettleJournal(tmp_path, "ingress-0")
    assert twin.open() == []
    assert twin.path is not None and twin.path != first.path and not twin
    sibling = SettleJournal(tmp_path, "ingress-1")
    assert sibling.open() == [] and not sibling  # a held file is not adopted
    assert first.path is not None and lines(first.path) == [simple("a")]
    # compaction swaps the inode: the new one is locked before it gets the name
    await first.append(simple("b"))
    first.discard("b")
    await first.compact()
    late = SettleJournal(tmp_path, "ingress-2")
    assert late.open() == [] and not late


def test_a_file_locked_by_another_process_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "settle-other.jsonl"
    path.write_bytes(encode(simple("theirs")))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\n"
         "time.sleep(30)\n"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        j = SettleJournal(tmp_path, "mine")
        assert j.open() == [] and not j
        assert lines(path) == [simple("theirs")]
    finally:
        holder.kill()
        holder.wait()
    j2 = SettleJournal(tmp_path, "mine-again")  # the holder died: its file is free
    assert j2.open() == [path] and j2.pending == [simple("theirs")]
    assert not path.exists()


async def test_replay_of_a_file_left_by_an_earlier_process(tmp_path: Path) -> None:
    old = SettleJournal(tmp_path, "ingress-0")
    old.open()
    for rid in ("a", "b"):
        await old.append(full(rid))
    assert old._fd is not None
    os.close(old._fd)  # a crash: the lock goes, the file stays
    old._fd = None
    again = SettleJournal(tmp_path, "ingress-0")
    assert again.open() == [tmp_path / "settle-ingress-0.jsonl"]
    assert again.pending == [full("a"), full("b")]


async def test_a_sibling_adopts_an_orphaned_journal(tmp_path: Path) -> None:
    (tmp_path / ".settle-live.jsonl.tmp").write_bytes(b"")  # a rewrite that crashed
    live = SettleJournal(tmp_path, "live")  # a sibling that keeps running
    live.open()
    mine = SettleJournal(tmp_path, "ingress-1")
    mine.open()
    await mine.append(simple("mine"))
    await mine.close()
    orphan = tmp_path / "settle-ingress-0.jsonl"  # a crashed replica's, with a torn tail
    orphan.write_bytes(encode(simple("x")) + encode(simple("mine")) + b'{"v":1,"set')
    (tmp_path / "settle-empty.jsonl").write_bytes(b"")
    for torn in ("ingress-0", "ingress-1"):  # rewrites that crashed before the rename
        (tmp_path / f".settle-{torn}.jsonl.tmp").write_bytes(encode(simple("x")))
    (tmp_path / "notes.txt").write_text("not a journal")
    j = SettleJournal(tmp_path, "ingress-1")
    loaded = j.open()
    assert loaded == [tmp_path / "settle-ingress-1.jsonl", orphan]
    assert [s.admit.request_id for s in j.pending] == ["mine", "x"]  # each id once
    assert not orphan.exists() and not (tmp_path / "settle-empty.jsonl").exists()
    assert list(tmp_path.glob(".*")) == []  # each removed by the owner of its journal
    assert live.path is not None and live.path.exists()  # a held journal is not adopted
    assert (tmp_path / "notes.txt").exists()
    assert j.path is not None and lines(j.path) == j.pending  # adopted entries are ours now


async def test_an_unreadable_line_is_logged_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "settle-r.jsonl").write_bytes(encode(simple("ok")) + b"garbage-line\n")
    j = SettleJournal(tmp_path, "r")
    with caplog.at_level(logging.ERROR):
        j.open()
    assert j.pending == [simple("ok")]
    assert "garbage-line" in caplog.text


def test_an_unusable_directory_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        SettleJournal(blocker / "journal", "r").open()


# ---- where it lives ---------------------------------------------------------------------


def test_journal_dir_defaults_under_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWITCHYARD_JOURNAL_DIR", raising=False)
    assert Settings(data_dir=tmp_path).journal_dir == tmp_path / "journal"
    assert Settings(data_dir=tmp_path, journal_dir=tmp_path / "j").journal_dir == tmp_path / "j"
    monkeypatch.setenv("SWITCHYARD_JOURNAL_DIR", str(tmp_path / "env"))
    assert Settings(data_dir=tmp_path).journal_dir == tmp_path / "env"


def test_each_state_store_has_its_own_journal_dir(tmp_path: Path) -> None:
    """Applications on different stores may share the data dir: a journal must replay
    only into the store it was written for."""
    args = AppArgs(models=[ModelSpec(id="m", engine="simulated")])
    dirs = {
        url: gateway_config(
            args, Settings(cache_dir=tmp_path, data_dir=tmp_path / "data", state_url=url), {}
        ).journal_dir
        for url in ("redis://127.0.0.1:1/0", "redis://127.0.0.1:1/1", "sqlite:////x/s.db")
    }
    assert len(set(dirs.values())) == 3
    assert all(d is not None and d.parent == tmp_path / "data" / "journal" for d in dirs.values())
    again = Settings(cache_dir=tmp_path, data_dir=tmp_path / "data", state_url="sqlite:////x/s.db")
    assert gateway_config(args, again, {}).journal_dir == dirs["sqlite:////x/s.db"]


async def test_layer1_counts_journaled_settlements_and_replays_them(tmp_path: Path) -> None:
    """The ingress wiring: the journal sits in ``journal_dir``, the two metrics follow it,
    and a restarted Gatekeeper on that directory writes what the last one left."""
    config = GatewayConfig(
        args=GatewayArgs(store_timeout_s=0.2),
        state_url=f"sqlite:///{tmp_path / 'state.db'}",
        journal_dir=tmp_path / "journal",
    )

    class Down:
        url = "down://"

        async def settle(self, request: SettleRequest) -> bool:
            raise StoreUnavailable("down")

    metrics = GatewayMetrics(["m"])
    first = Gatekeeper(config, metrics, replica="ingress-0")
    assert first.gate.journal.path == tmp_path / "journal" / "settle-ingress-0.jsonl"
    caller = Caller(tenant="acme")
    a = await first.gate.admit(
        gated(caller, max_tokens=4), Plan(), prompt_tokens=3, context_left=100, price=Price()
    )
    first.gate._store = cast(StateStore, Down())  # Gatekeeper still closes its own store
    first.gate.settle(a, Outcome(endpoint="/v1/completions", status="ok", http_status=200,
                                 prompt_tokens=3, completion_tokens=4))  # fmt: skip
    await first.close(drain_s=0.1)
    sample = metrics.registry.get_sample_value
    assert sample("switchyard_settlements_journaled_total") == 1.0
    assert sample("switchyard_settlements_pending") == 1.0

    again = GatewayMetrics(["m"])
    second = Gatekeeper(config, again, replica="ingress-0")  # the replica restarted
    assert again.registry.get_sample_value("switchyard_settlements_pending") == 1.0
    await second.close(drain_s=2.0)
    assert again.registry.get_sample_value("switchyard_settlements_pending") == 0.0
    store = SqliteStore(tmp_path / "state.db")
    records = await store.query_ledger(LedgerQuery())
    await store.close()
    assert [(r.request_id, r.prompt_tokens, r.completion_tokens) for r in records] == [
        (a.request.request_id, 3, 4)
    ]
    assert list((tmp_path / "journal").iterdir()) == []


async def test_an_outage_longer_than_the_ttl_ends_with_the_real_record(tmp_path: Path) -> None:
    """The settlement is journaled, the reservation expires, a sibling sweeps the request
    ``lost`` (billing the prompt); the replayed settlement then replaces that record and
    bills what the request really used — one record, the right tokens."""
    config = GatewayConfig(
        args=GatewayArgs(store_timeout_s=0.2, reservation_ttl_s=0.2),
        state_url=f"sqlite:///{tmp_path / 'state.db'}",
        journal_dir=tmp_path / "journal",
    )

    class Down:
        url = "down://"

        async def settle(self, request: SettleRequest) -> bool:
            raise StoreUnavailable("down")

    budget = BudgetCheck("budget:tenant:acme:tokens:d:2026-12-02", "tokens", 10_000, 4e9)
    plan = Plan(concurrency=(ConcurrencyCheck("conc:tenant:acme", 4),), budgets=(budget,))
    first = Gatekeeper(config, GatewayMetrics(["m"]), replica="ingress-0")
    a = await first.gate.admit(
        gated(Caller(tenant="acme"), max_tokens=40), plan, prompt_tokens=3, context_left=100,
        price=Price(),
    )
    first.gate._store = cast(StateStore, Down())
    first.gate.settle(a, Outcome(endpoint="/v1/completions", status="ok", http_status=200,
                                 prompt_tokens=3, completion_tokens=40))  # fmt: skip
    await first.close(drain_s=0.1)

    sibling = SqliteStore(tmp_path / "state.db")
    await asyncio.sleep(0.3)  # past the reservation's TTL
    assert await sibling.sweep_lost() == 1
    (lost,) = await sibling.query_ledger(LedgerQuery())
    assert (lost.status, lost.prompt_tokens, lost.completion_tokens) == ("lost", 3, 0)
    assert await sibling.budget_used(budget.key) == (3, 0)

    second = Gatekeeper(config, GatewayMetrics(["m"]), replica="ingress-0")  # replays
    await second.close(drain_s=2.0)
    (rec,) = await sibling.query_ledger(LedgerQuery())
    assert (rec.request_id, rec.status) == (a.request.request_id, "ok")
    assert (rec.prompt_tokens, rec.completion_tokens) == (3, 40)
    assert await sibling.budget_used(budget.key) == (43, 0)
    await sibling.close()
