"""Settlements the state store did not take, kept on the replica until it does.

When ``store.settle`` fails (the store is down, or did not answer in time), the gate
(``app.gateway.admission``) appends the ``SettleRequest`` here and re-sends it later,
unchanged. Re-sending is safe: settling a request id twice changes nothing the second
time (``app.state.protocol``), so a settlement that landed before its call failed is
billed once, and an entry found in two files is harmless.

File: ``<dir>/settle-<replica>.jsonl``, one JSON line per pending settlement
(``{"v": 1, "settle": {...}}``), appended and fsync'd before the settlement counts as
journaled; rewritten (temp file, fsync, ``os.replace``) once entries are written to the
store. One process at a time owns a file: it holds an exclusive ``flock`` on the inode
the name points to (checked after locking, since a rewrite or an adoption replaces or
removes the name). At start-up a journal also adopts every other journal file in the
directory that no live process holds — the file an earlier process of this replica left,
or a crashed sibling's — by copying its entries into its own file and deleting it.

Without a directory the journal is kept in memory only (lost with the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from app.state.protocol import (
    SettleRequest,
)

log = logging.getLogger(__name__)

VERSION = 1
PREFIX = "settle-"
SUFFIX = ".jsonl"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 80


@dataclass(frozen=True)
class Backoff:
    """Retry delays: ``initial_s``, then × ``factor`` after each failed pass, at most
    ``max_s``; back to ``initial_s`` once a pass writes something."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0

    def next(self, delay_s: float) -> float:
        return min(self.max_s, delay_s * self.factor)


# ---- JSON --------------------------------------------------------------------------------


# One pydantic adapter over the store's dataclasses (``app.state.protocol``): the JSON is
# each dataclass's fields by name, nested; the ledger records are the records' own JSON.
_SETTLE: TypeAdapter[SettleRequest] = TypeAdapter(SettleRequest)


def settle_to_json(s: SettleRequest) -> dict[str, Any]:
    """A ``SettleRequest`` as JSON-ready data (``settle_from_json`` reverses it)."""
    data: dict[str, Any] = _SETTLE.dump_python(s, mode="json")
    return data


def settle_from_json(d: dict[str, Any]) -> SettleRequest:
    return _SETTLE.validate_python(d)


def encode(s: SettleRequest) -> bytes:
    """One journal line, newline included."""
    line = json.dumps({"v": VERSION, "settle": settle_to_json(s)}, separators=(",", ":"))
    return line.encode() + b"\n"


def decode(line: bytes | str) -> SettleRequest:
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("v") != VERSION:
        raise ValueError(f"not a version {VERSION} journal line")
    return settle_from_json(data["settle"])


def file_name(replica: str | None) -> str:
    """``settle-<replica>.jsonl``: the id as is when it is a safe file name, else made
    safe with a hash of the id added (so distinct ids keep distinct files). Without an
    id, a name of this process's own."""
    if replica is None:
        return f"{PREFIX}pid{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
    safe = _UNSAFE.sub("_", replica)[:_MAX_NAME]
    if safe != replica or not safe or safe.startswith("."):
        safe = f"{safe}-{hashlib.sha256(replica.encode()).hexdigest()[:10]}"
    return f"{PREFIX}{safe}{SUFFIX}"


# ---- files -------------------------------------------------------------------------------


def _lock(path: Path, flags: int) -> int | None:
    """``path`` opened and exclusively locked (without waiting), or None when another
    process holds it or the name no longer points to the inode we locked."""
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, now = os.fstat(fd), os.stat(path)
        if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _read(fd: int, path: Path) -> list[SettleRequest]:
    """The entries of a journal file; a line that does not parse (a torn last append) is
    logged whole, since it is the only copy left."""
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    out = []
    for n, line in enumerate(b"".join(chunks).splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(decode(line))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("unreadable settlement journal line %s:%d (%r): %r", path, n, exc, line)
    return out


def _temp(path: Path) -> Path:
    """Where a rewrite of ``path`` is written before it is renamed over ``path``."""
    return path.with_name(f".{path.name}.tmp")


def _remove_temp(path: Path) -> None:
    """Delete the temp file a crashed rewrite of ``path`` left (its journal file still
    has every entry). Only while holding ``path``: its owner is the only writer."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_temp(path))


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a delete in ``directory`` durable (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class SettleJournal:
    """The pending settlements of one replica, in the order they failed: in memory, and
    with a ``directory`` also in a file this process owns (module docstring)."""

    def __init__(self, directory: Path | None, replica: str | None) -> None:
        self.directory = directory
        self._replica = replica
        self.path: Path | None = None
        self._fd: int | None = None
        self._pending: dict[str, SettleRequest] = {}  # admit request id -> settlement
        self._unwritten: list[bytes] = []  # appended in memory, not yet on disk
        self._io: asyncio.Lock | None = None  # orders appends and rewrites
        self._thread_lock = threading.Lock()  # file writes, even if a waiter is cancelled

    # ---- state ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    @property
    def pending(self) -> list[SettleRequest]:
        return list(self._pending.values())

    @property
    def durable(self) -> bool:
        """Whether entries reach a file (else they live in this process only)."""
        return self._fd is not None

    # ---- start-up --------------------------------------------------------------------

    def open(self) -> list[Path]:
        """Take this replica's file and adopt the unowned journal files of the directory;
        returns the files whose entries were loaded (own first). Blocking file I/O, once
        at start-up. Raises ``OSError`` when the directory cannot be used (the journal
        then stays in memory)."""
        if self.directory is None or self._fd is not None:
            return []
        self.directory.mkdir(parents=True, exist_ok=True)
        name = file_name(self._replica)
        path = self.directory / name
        fd = _lock(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        if fd is None:  # a live process holds this name (the same id twice): use another
            path = self.directory / f"{name[: -len(SUFFIX)]}-pid{os.getpid()}{SUFFIX}"
            fd = _lock(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            if fd is None:
                raise OSError(f"settlement journal {path} is locked by another process")
        self.path, self._fd = path, fd
        _remove_temp(path)
        loaded: list[Path] = []
        if self._load(_read(fd, path)):
            loaded.append(path)
        for other in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")):
            if other != path and self._adopt(other):
                loaded.append(other)
        return loaded

    def _load(self, entries: Iterable[SettleRequest]) -> list[SettleRequest]:
        new = []
        for s in entries:
            if s.admit.request_id not in self._pending:
                self._pending[s.admit.request_id] = s
                new.append(s)
        return new

    def _adopt(self, other: Path) -> bool:
        """Copy the entries of an unowned journal file into ours, then delete it (a
        crash in between leaves them in both: replayed twice, billed once)."""
        assert self._fd is not None
        fd = _lock(other, os.O_RDWR)
        if fd is None:
            return False
        try:
            entries = _read(fd, other)
            new = self._load(entries)
            if new:
                _write_all(self._fd, b"".join(encode(s) for s in new))
                os.fsync(self._fd)
            os.unlink(other)
            _remove_temp(other)
            assert self.directory is not None
            _fsync_dir(self.directory)
        finally:
            os.close(fd)
        if entries:
            log.warning("adopted %d pending settlements from %s", len(new), other)
        return bool(entries)

    # ---- changes -----------------------------------------------------------------------

    def _lock_io(self) -> asyncio.Lock:
        if self._io is None:
            self._io = asyncio.Lock()
        return self._io

    async def append(self, s: SettleRequest) -> bool:
        """Keep ``s`` until it is written to the store; True once it is on disk (fsync'd),
        False when it lives in memory only. Appends that arrive while one is written go
        to disk together (one write, one fsync)."""
        rid = s.admit.request_id
        if rid not in self._pending:
            self._pending[rid] = s
            if self.durable:
                self._unwritten.append(encode(s))
        if not self.durable:
            return False
        # shielded: a cancelled caller must not leave the lock free while a write runs
        await asyncio.shield(self._write_unwritten())
        return self.durable

    async def _write_unwritten(self) -> None:
        async with self._lock_io():
            if not self._unwritten or self._fd is None:
                return  # an earlier batch (or a rewrite) took ours
            lines, self._unwritten = self._unwritten, []
            try:
                await asyncio.to_thread(self._append_sync, self._fd, b"".join(lines))
            except OSError as exc:
                self._broken(exc)

    def _append_sync(self, fd: int, data: bytes) -> None:
        with self._thread_lock:
            _write_all(fd, data)
            os.fsync(fd)

    def requeue(self, s: SettleRequest) -> None:
        """Move a pending entry to the back (one that keeps failing never blocks the rest)."""
        rid = s.admit.request_id
        if rid in self._pending:
            self._pending[rid] = self._pending.pop(rid)

    def discard(self, request_id: str) -> None:
        """The store has it: forget it (the file follows at the next ``compact``)."""
        self._pending.pop(request_id, None)

    async def compact(self) -> None:
        """Rewrite the file with what is still pending, atomically."""
        if self.durable:
            await asyncio.shield(self._compact())

    async def _compact(self) -> None:
        async with self._lock_io():
            if self._fd is None or self.path is None:
                return
            data = b"".join(encode(s) for s in self._pending.values())
            self._unwritten = []  # the rewrite holds every pending entry
            try:
                self._fd = await asyncio.to_thread(self._rewrite_sync, self._fd, self.path, data)
            except OSError as exc:
                self._broken(exc)

    def _rewrite_sync(self, old: int, path: Path, data: bytes) -> int:
        """Write ``data`` to a temp file we lock first, fsync, rename it over ``path``;
        then let go of the old inode. Returns the new file's descriptor."""
        with self._thread_lock:
            tmp = _temp(path)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _write_all(fd, data)
                os.fsync(fd)
                os.replace(tmp, path)
            except BaseException:
                os.close(fd)
                raise
            _fsync_dir(path.parent)
            os.close(old)
            return fd

    def _broken(self, exc: OSError) -> None:
        """The file cannot be written: keep going in memory (logged; lost on exit)."""
        log.error(
            "settlement journal %s unwritable (%r): %d pending settlements kept in memory only",
            self.path,
            exc,
            len(self._pending),
        )
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._unwritten = []

    async def close(self) -> None:
        """Compact and let go of the file; an empty journal deletes its file."""
        if self._fd is None or self.path is None:
            return
        await self.compact()
        async with self._lock_io():
            fd, self._fd = self._fd, None
            if fd is None:
                return
            with self._thread_lock:
                if not self._pending:
                    with contextlib.suppress(OSError):
                        os.unlink(self.path)
                os.close(fd)
