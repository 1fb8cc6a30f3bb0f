"""``app.api.single_node``: a second node's ingress replica may not open the same SQLite
store; a node that left is replaced; Redis is never checked."""

from __future__ import annotations

import pytest

from app.api.single_node import SqliteOnSeveralNodes, check_single_node

URL = "sqlite:////var/lib/switchyard/state.db"


class KV(dict[bytes, bytes]):
    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value


@pytest.mark.parametrize(
    ("recorded_on", "alive", "this_node", "refused"),
    [
        (None, {"n1"}, "n1", False),  # the first replica records its node
        ("n1", {"n1", "n2"}, "n1", False),  # another replica on the same node
        ("n1", {"n1", "n2"}, "n2", True),  # a second node while the first lives
        ("n1", {"n2"}, "n2", False),  # the first node is gone: the store moved
    ],
)
def test_one_node_per_sqlite_store(
    recorded_on: str | None, alive: set[str], this_node: str, refused: bool
) -> None:
    kv = KV()
    if recorded_on is not None:
        check_single_node(URL, recorded_on, kv.get, kv.put, lambda: {recorded_on})
    if refused:
        with pytest.raises(SqliteOnSeveralNodes, match="Use Redis"):
            check_single_node(URL, this_node, kv.get, kv.put, lambda: alive)
        assert list(kv.values()) == [recorded_on.encode()]  # type: ignore[union-attr]
    else:
        check_single_node(URL, this_node, kv.get, kv.put, lambda: alive)
        assert list(kv.values()) == [this_node.encode()]


def test_redis_and_other_sqlite_files_are_independent() -> None:
    kv = KV()
    check_single_node(URL, "n1", kv.get, kv.put, lambda: {"n1", "n2"})
    check_single_node("sqlite:////other.db", "n2", kv.get, kv.put, lambda: {"n1", "n2"})
    check_single_node("redis://redis:6379/0", "n2", kv.get, kv.put, lambda: {"n1", "n2"})
    assert sorted(kv.values()) == [b"n1", b"n2"]  # one key per SQLite URL, none for Redis
