"""Tool calls out of generated text (app/serving/tools.py): named and required choices
from constrained output, auto through vLLM's own tool parsers on scripted text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from app.api.openai_format import delta_calls, merge_calls
from app.engine.protocol import GenerationDelta, InvalidRequest, ToolCallDelta
from app.request import Prompt, ToolChoice
from app.serving.tools import parse_required, shape_tool_calls

WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}  # fmt: skip
PROMPT = Prompt(messages=({"role": "user", "content": "weather?"},), tools=(WEATHER,))


async def script(pieces: Sequence[str]) -> AsyncIterator[GenerationDelta]:
    for i, text in enumerate(pieces):
        last = i == len(pieces) - 1
        yield GenerationDelta(text, 1, "stop" if last else None, prompt_tokens=5 if i == 0 else 0)


async def run(
    pieces: Sequence[str], choice: ToolChoice, parser: str | None = None, tokenizer: object = None
) -> list[GenerationDelta]:
    deltas = shape_tool_calls(script(pieces), choice, PROMPT, parser, tokenizer, "m")
    return [d async for d in deltas]


async def test_named_choice_streams_arguments_of_call_zero() -> None:
    out = await run(['{"city"', ': "Oslo"}'], ToolChoice("named", "weather"))
    assert [d.text for d in out] == ["", ""]
    first, second = out[0].tool_calls[0], out[1].tool_calls[0]
    assert (first.index, first.name, first.arguments) == (0, "weather", '{"city"')
    assert first.id is not None and first.id.startswith("call_") and len(first.id) == 29
    assert (second.id, second.name, second.arguments) == (None, None, ': "Oslo"}')
    assert out[-1].finish_reason == "stop"  # OpenAI's for a named choice
    assert sum(d.num_new_tokens for d in out) == 2 and out[0].prompt_tokens == 5
    calls = merge_calls([c for d in out for c in d.tool_calls])
    function = {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert calls == [{"id": first.id, "type": "function", "function": function}]


async def test_required_choice_parses_the_array_when_it_ends() -> None:
    text = json.dumps([{"name": "weather", "parameters": {"city": "Oslo"}},
                       {"name": "time", "parameters": {}}])  # fmt: skip
    out = await run([text[:10], text[10:]], ToolChoice("required"))
    assert out[0].tool_calls == () and out[0].finish_reason is None
    last = out[-1]
    assert last.finish_reason == "tool_calls"
    assert [(c.index, c.name, json.loads(c.arguments)) for c in last.tool_calls] == [
        (0, "weather", {"city": "Oslo"}), (1, "time", {}),
    ]  # fmt: skip
    assert len({c.id for c in last.tool_calls}) == 2


@pytest.mark.parametrize("text", ['[{"name": "weather", "param', "{}", "not json"])
def test_a_cut_or_odd_required_answer_has_no_calls(text: str) -> None:
    assert parse_required(text) == ()


async def test_auto_needs_a_tool_parser() -> None:
    with pytest.raises(InvalidRequest) as info:
        await run(["x"], ToolChoice("auto"))
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("parser", "pieces", "content"),
    [
        ("hermes", ["I will check. ", "<tool_call>", '{"name": "weather", ',
                    '"arguments": {"city": "Oslo"}}', "</tool_call>"], "I will check. "),
        ("pythonic", ["[weather(", "city='Oslo'", ")]"], ""),
    ],
)  # fmt: skip
async def test_auto_runs_vllms_tool_parser_over_the_stream(
    tiny_model_dir: Path, parser: str, pieces: list[str], content: str
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    out = await run(pieces, ToolChoice("auto"), parser, tokenizer)
    assert "".join(d.text for d in out) == content
    calls = merge_calls([c for d in out for c in d.tool_calls])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("weather", {"city": "Oslo"})
    ]
    assert out[-1].finish_reason == "tool_calls"


async def test_auto_without_a_call_is_plain_text(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    out = await run(["It is ", "sunny."], ToolChoice("auto"), "hermes", tokenizer)
    assert "".join(d.text for d in out) == "It is sunny."
    assert out[-1].finish_reason == "stop" and not any(d.tool_calls for d in out)


def test_streamed_pieces_carry_only_what_they_have() -> None:
    pieces = [ToolCallDelta(0, "call_1", "f", "{"), ToolCallDelta(0, arguments="}")]
    assert delta_calls(pieces) == [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{"}},
        {"index": 0, "function": {"arguments": "}"}},
    ]  # fmt: skip
