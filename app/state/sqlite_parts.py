"""What the parts of ``SqliteStore`` (records, admission, sessions) need of it: one
write transaction (``_run``: ``BEGIN IMMEDIATE``, on the store's worker thread), one
read outside a transaction (``_read``) and the clock."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class SqliteParts:
    _clock: Callable[[], float]

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError
