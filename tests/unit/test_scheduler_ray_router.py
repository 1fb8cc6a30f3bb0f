"""The Ray adapter's pure parts: the request as the scheduler sees it (salted block
hashes of the ingress's token ids, the tenant-scoped session key) and the decision
hand-off to the ingress."""

from __future__ import annotations

import pytest

from app.request import Caller, InferenceRequest, Prompt
from app.scheduler.config import ReplicaRouting
from app.scheduler.decisions import keep_decision, take_decision
from app.scheduler.loop import Decision
from app.scheduler.ray_router import routed_request

IDS = tuple(range(40))


def request(**kw: object) -> InferenceRequest:
    args: dict[str, object] = {
        "id": "req-1", "endpoint": "chat", "model": "m", "caller": Caller("acme"),
        "prompt": Prompt(messages=({"role": "user", "content": "hi"},), token_ids=IDS,
                         tokenized_for="m"),
        **kw,
    }  # fmt: skip
    return InferenceRequest(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "session_id", "user", "expected"),
    [
        ("session_or_user", "s1", "u1", "acme|s1"),
        ("session_or_user", None, "u1", "acme|u1"),
        ("session", None, "u1", None),
        ("none", "s1", "u1", None),
        ("session_or_user", None, None, None),
    ],
)
def test_the_session_key_is_scoped_to_the_tenant(
    key: str, session_id: str | None, user: str | None, expected: str | None
) -> None:
    cfg = ReplicaRouting.model_validate({"session": {"key": key}})
    assert routed_request(request(session_id=session_id, user=user), cfg).session == expected


def test_blocks_are_salted_and_aligned_to_the_block_size() -> None:
    cfg = ReplicaRouting.model_validate({"prefix": {"block_size": 16}})
    plain = routed_request(request(), cfg)
    salted = routed_request(request(cache_salt="tenant-a"), cfg)
    assert (len(plain.hashes), plain.prompt_tokens, plain.key) == (2, 40, "req-1")
    assert not set(plain.hashes) & set(salted.hashes)
    untokenized = request(prompt=Prompt(text="x" * 40))
    assert len(routed_request(untokenized, cfg).hashes) == 2  # UTF-8 bytes stand in


def test_a_decision_is_taken_once() -> None:
    d = Decision("r1", ("r1", "r0"), "prefix", 3, 4, 1.0)
    keep_decision("req-9", d)
    assert take_decision("req-9") == d
    assert take_decision("req-9") is None
