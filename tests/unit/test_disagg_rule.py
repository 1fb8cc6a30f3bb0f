"""The per-request prefill/decode rule, case by case (app.disagg.rule)."""

from __future__ import annotations

import pytest

from app.disagg.rule import decide

CASES = [
    # mode, prompt, cached, in flight per prefill replica, → mode, reason, uncached
    ("auto", 2000, 0, [0, 0], "remote", "long_uncached", 2000),
    ("auto", 2000, 1536, [0], "local", "cached", 464),
    ("auto", 2000, 1488, [0], "remote", "long_uncached", 512),  # exactly the threshold
    ("auto", 300, 0, [0], "local", "short", 300),
    ("auto", 2000, 0, [4, 4], "local", "prefill_busy", 2000),
    ("auto", 2000, 0, [4, 3], "remote", "long_uncached", 2000),  # one replica has room
    ("auto", 2000, 0, [], "local", "no_prefill", 2000),
    ("always", 10, 0, [9], "remote", "mode", 10),
    ("always", 10, 0, [], "local", "no_prefill", 10),
    ("never", 5000, 0, [0], "local", "mode", 5000),
    ("auto", 100, 400, [0], "local", "short", 0),  # a stale index never goes below 0
]


def test_several_choices_are_served_whole() -> None:
    for mode in ("auto", "always"):
        choice = decide(
            mode=mode,  # type: ignore[arg-type]
            prompt_tokens=4000,
            cached_tokens=0,
            min_uncached_tokens=512,
            prefill_in_flight=[0],
            max_prefill_in_flight=4,
            choices=2,
        )
        assert (choice.mode, choice.reason) == ("local", "n")


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("auto", "prefill_ejected"), ("always", "prefill_ejected"), ("never", "mode")],
)
def test_with_every_prefill_replica_ejected_the_request_is_served_whole(
    mode: str, reason: str
) -> None:
    choice = decide(
        mode=mode,  # type: ignore[arg-type]
        prompt_tokens=4000,
        cached_tokens=0,
        min_uncached_tokens=512,
        prefill_in_flight=[],
        max_prefill_in_flight=4,
        prefill_ejected=True,
    )
    assert (choice.mode, choice.reason) == ("local", reason)


@pytest.mark.parametrize(("mode", "prompt", "cached", "busy", "want", "reason", "uncached"), CASES)
def test_decide(
    mode: str, prompt: int, cached: int, busy: list[int], want: str, reason: str, uncached: int
) -> None:
    choice = decide(
        mode=mode,  # type: ignore[arg-type]
        prompt_tokens=prompt,
        cached_tokens=cached,
        min_uncached_tokens=512,
        prefill_in_flight=busy,
        max_prefill_in_flight=4,
    )
    assert (choice.mode, choice.reason, choice.uncached_tokens) == (want, reason, uncached)
    assert choice.header() == f"pd={want}; pd_reason={reason}"


@pytest.mark.parametrize(
    ("prompt", "cached", "decode", "busy_prefill", "want", "reason"),
    [
        (300, 0, [8, 9], [0], "remote", "decode_busy"),  # every decode replica busy
        (300, 0, [8, 2], [0], "local", "short"),  # one decode replica has room
        (300, 0, None, [0], "local", "short"),  # decode load unknown: not busy
        (2000, 1800, [9, 9], [0], "local", "cached"),  # held there: never moved
        (300, 0, [8, 8], [4], "local", "prefill_busy"),
    ],
)
def test_a_busy_decode_role_sends_short_prompts_remote(
    prompt: int,
    cached: int,
    decode: list[int] | None,
    busy_prefill: list[int],
    want: str,
    reason: str,
) -> None:
    choice = decide(
        mode="auto",
        prompt_tokens=prompt,
        cached_tokens=cached,
        min_uncached_tokens=512,
        prefill_in_flight=busy_prefill,
        max_prefill_in_flight=4,
        decode_in_flight=decode,
        max_decode_in_flight=8,
    )
    assert (choice.mode, choice.reason) == (want, reason)
