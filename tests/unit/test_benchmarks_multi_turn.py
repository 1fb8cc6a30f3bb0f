"""benchmarks/multi_turn.py without an engine: the turns a run sends, and the report's
summary computed from a stored result."""

from __future__ import annotations

from typing import Any

from benchmarks.multi_turn import ARMS, TURNS, inputs, markdown


def test_a_run_has_ten_turns_named_by_its_run() -> None:
    a, b = inputs("aaaa"), inputs("bbbb")
    assert len(a) == len(b) == TURNS
    assert a[0].startswith("Run aaaa.") and b[0].startswith("Run bbbb.")
    assert a[1:] == b[1:]  # the same tool results: only the run's name differs
    assert a[-1].startswith("Summarise")


def _turns(ttft: float, cached: int) -> list[dict[str, Any]]:
    return [{"ttft": ttft, "prompt": 100 * (i + 1), "cached": cached * i, "bytes": 10}
            for i in range(TURNS)]  # fmt: skip


def test_the_summary_gives_the_ratios_and_the_cached_share() -> None:
    doc = {
        "parameters": {"model": "m", "dtype": "float32", "turns": TURNS, "runs": 1,
                       "max_output_tokens": 24, "ingress_replicas": 2, "state": "redis"},
        "turns": {"responses": _turns(0.5, 50), "chat": _turns(0.4, 50),
                  "responses-b32": _turns(0.25, 80)},
        "ledger": {"sent": 30, "records": 30, "ok": 30,
                   "by_endpoint": {"responses": 20, "chat": 10}},
        "environment": {"git_commit": "abc"}, "_plot": "x.png",
    }  # fmt: skip
    assert set(doc["turns"]) == set(ARMS)
    text = markdown(doc, "python -m benchmarks.multi_turn")
    assert "median of the per-turn ratios 1.25" in text
    assert "block 32 ÷ block 128 (both responses) 0.50" in text
    # cached share over turns 2-10: sum(50 i) / sum(100 (i + 1)) for i in 1..9
    assert "responses 42%" in text and "block 32 67%" in text
    assert "30 records for 30 requests sent" in text
