from __future__ import annotations

from app.api.tally import Tally
from app.engine.protocol import GenerationDelta


def test_counts_text_and_timing_from_content_deltas_only() -> None:
    t = Tally(started=0.0)
    t.add(GenerationDelta("", 0, prompt_tokens=10))  # no content: no TTFT yet
    assert t.first_at is None
    t.add(GenerationDelta("a", 1))
    t.add(GenerationDelta("b", 2))
    t.add(GenerationDelta("", 1, finish_reason="stop"))
    assert "".join(t.parts) == "ab"
    assert t.completion_tokens == 4 and len(t.itls) == 1
    assert t.finish_reason == "stop"
    assert t.usage().prompt_tokens == 10


def test_the_latest_prompt_count_replaces_an_estimate() -> None:
    """An upstream's first delta carries our estimate; its usage chunk the exact count,
    which may be lower."""
    t = Tally(started=0.0)
    t.add(GenerationDelta("x", 1, prompt_tokens=120))
    t.add(GenerationDelta("", 0, finish_reason="length", prompt_tokens=37, cached_prompt_tokens=5))
    assert (t.prompt_tokens, t.cached_tokens) == (37, 5)
    t.add(GenerationDelta("", 0))  # a delta without counts keeps them
    assert (t.prompt_tokens, t.cached_tokens) == (37, 5)
