"""Token caps (app.fairness.token_caps): a pool's caps from the per-replica settings,
and the two sums with the room they leave. The queue's use of them is in
test_fairness_queue.py."""

from __future__ import annotations

import pytest

from app.fairness.token_caps import TokenBook, TokenCaps


@pytest.mark.parametrize(
    ("prefill", "kv", "replicas", "ingress", "want"),
    [
        (1000, 10_000, 2, 3, TokenCaps(667, 6667)),  # ceil(× 2 / 3)
        (1000, None, 4, 1, TokenCaps(4000, None)),
        (None, None, 4, 1, TokenCaps()),
        (1, 1, 1, 8, TokenCaps(1, 1)),  # at least one token
    ],
)
def test_a_pools_caps_are_per_replica_times_replicas_over_ingress_replicas(
    prefill: int | None, kv: int | None, replicas: int, ingress: int, want: TokenCaps
) -> None:
    assert TokenCaps.of(prefill, kv, replicas, ingress) == want


@pytest.mark.parametrize(
    ("caps", "pending", "reserved", "room"),
    [
        (TokenCaps(), 10**9, 10**9, True),
        (TokenCaps(prefill=100), 99, 0, True),
        (TokenCaps(prefill=100), 100, 0, False),
        (TokenCaps(kv=500), 0, 499, True),
        (TokenCaps(kv=500), 0, 500, False),
        (TokenCaps(prefill=100, kv=500), 50, 600, False),
        (TokenCaps(prefill=1, kv=1), 0, 0, True),  # an idle pool always has room
    ],
)
def test_room_means_both_sums_below_their_caps(
    caps: TokenCaps, pending: int, reserved: int, room: bool
) -> None:
    assert TokenBook(caps, pending, reserved).room() is room


def test_the_sums_follow_start_first_token_and_leave() -> None:
    book = TokenBook(TokenCaps(prefill=100, kv=1000))
    book.start(80, 200)
    book.start(30, 10)
    assert (book.pending_prefill, book.reserved_kv) == (110, 320) and not book.room()
    book.prefilled(80)
    assert (book.pending_prefill, book.reserved_kv) == (30, 320) and book.room()
    book.leave(80, 200, prefilled=True)  # its prefill was counted off already
    book.leave(30, 10, prefilled=False)  # left before its first token
    assert (book.pending_prefill, book.reserved_kv) == (0, 0)
