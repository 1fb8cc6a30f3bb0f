"""The Ray adapter's pure parts: the request as the scheduler sees it (salted block
hashes of the ingress's token ids, the tenant-scoped session key) and the decision
hand-off to the ingress."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from app.engine.kv_events import BlockStored
from app.engine.kv_publisher import ZmqKvPublisher
from app.request import Caller, InferenceRequest, Prompt
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Decision
from app.scheduler.ray_router import SwitchyardRouter, routed_request
from app.scheduler.views import scheduler_of
from app.serving.llm_server import free_port

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


def test_the_choice_reaches_the_ingress_inside_the_request_and_stays_in_the_process() -> None:
    """The router writes its choice on the request's note (no process-wide table): every
    copy of the request reads it; a pickled request (what the replica gets) has none."""
    import pickle
    from dataclasses import replace

    req = request()
    later = replace(req, max_tokens=7)  # the admission's copy shares the note
    d = Decision("r1", ("r1", "r0"), "prefix", 3, 4, 1.0, {"prefix": 0.75}, 12, {"prefix": 900})
    req.replica_note.write(d)
    got = later.replica_note.read()
    assert got is not None and got.header() == "replica=r1; scorer=prefix; prefix=3/4; load=1.00"
    assert (got.totals, got.index_blocks, got.timings_ns) == ({"prefix": 0.75}, 12, {"prefix": 900})
    assert pickle.loads(pickle.dumps(later)).replica_note.read() is None
    assert request().replica_note.read() is None  # another request: its own note


def test_precise_mode_follows_the_endpoints_replicas_advertise() -> None:
    """Two routers (two ingress replicas): one sent a context to r1; the other learns
    it from r1's engine events, through the endpoint r1 advertises in its routing stats."""
    router = SwitchyardRouter.__new__(SwitchyardRouter)  # Ray's own state is not needed
    router._deployment_id = SimpleNamespace(name="LLMServer-m")  # type: ignore[assignment]
    router.initialize_state(prefix={"mode": "precise", "block_size": 16})
    assert scheduler_of("LLMServer-m") is router.scheduler  # the ingress can read it
    assert router.feed is not None
    port = free_port()
    publisher = ZmqKvPublisher(port)
    replicas: list[Any] = [
        SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}"), routing_stats=stats)
        for i, stats in enumerate([{}, {"kv_events": f"tcp://127.0.0.1:{port}"}, {}])
    ]
    try:
        stored = BlockStored(block_hashes=[b"a", b"b"], parent_block_hash=None,
                             token_ids=list(IDS[:32]), block_size=16)  # fmt: skip
        routed = routed_request(request(), router._config)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            router._follow(replicas)
            if router.feed.following("r1") and router.scheduler.ctx.index.size("r1"):
                break
            publisher.publish([stored])  # until the subscription is up (slow joiner)
            time.sleep(0.05)
        assert router.feed.followed() == ["r1"]
        decision = router.scheduler.decide(routed, ["r0", "r1", "r2"])
        assert (decision.replica, decision.scorer, decision.matched_blocks) == ("r1", "prefix", 2)
    finally:
        router.feed.close()
        publisher.close()
