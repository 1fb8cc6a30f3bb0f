"""``open_store``: a state store from its URL (``sqlite:///PATH`` or ``redis://…``)."""

from __future__ import annotations

from app.state.protocol import StateStore

SQLITE = "sqlite:///"


def open_store(url: str, *, timeout_s: float = 0.5) -> StateStore:
    if url.startswith(SQLITE):
        from app.state.sqlite_store import SqliteStore

        return SqliteStore(url[len(SQLITE) :])
    if url.startswith(("redis://", "rediss://", "unix://")):
        from app.state.redis_store import RedisStore

        return RedisStore(url, timeout_s=timeout_s)
    raise ValueError(f"unsupported state URL {url.split('://')[0]}://… (sqlite:/// or redis://)")
