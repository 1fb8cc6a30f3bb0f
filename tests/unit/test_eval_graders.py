"""The graders (app.eval.graders): each failure class has a case, per kind of item, and
the order in which one class wins over another."""

from __future__ import annotations

import json

import pytest

from app.eval.graders import Answer, ToolCall, grade, hangul_share, has_phrase, refuses
from app.eval.sets import EvalSet, Item

SET = EvalSet.model_validate(
    {
        "set": "service",
        "version": 1,
        "max_tokens": 32,
        "systems": {"s": "system"},
        "tools": {
            "get_weather": {
                "description": "weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
            "other": {"description": "x", "parameters": {"type": "object"}},
        },
        "schemas": {
            "person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"],
                "additionalProperties": False,
            },
        },
        "items": [{"id": "x", "prompt": "p", "accept": ["x"]}],
    }
)


def item(**kw: object) -> Item:
    return Item.model_validate({"id": "t", "prompt": "p", **kw})


def call(name: str, args: object) -> ToolCall:
    return ToolCall(name, args if isinstance(args, str) else json.dumps(args))


QUESTION = {"accept": ["paris"]}
NUMBER = {"accept": ["4", "four"]}
PATTERN = {"pattern": "central processing unit"}
BULLETS = {"checks": {"language": "ko", "format": "bullets", "lines": 2}}
NUMBERED = {"checks": {"language": "ko", "format": "numbered", "lines": 3, "required": ["봄"]}}
ONE_LINE = {"checks": {"language": "ko", "format": "one_line", "required": ["서울"]}}
KO_JSON = {"checks": {"format": "json", "json_keys": ["도시"], "required": ["서울"]}}
SHORT = {"checks": {"language": "ko", "max_chars": 10}}
STARTS = {"checks": {"starts_with": "내일", "required_any": ["비", "눈"]}}
PERSON = {"json_schema": "person", "expect": {"name": "Alice", "age": 30}}
WEATHER = {"tools": ["get_weather", "other"], "call": "get_weather", "args": {"city": "Paris"}}
OUT_OF_SCOPE = {"system": "s", "refuse": True}
IN_SCOPE = {"system": "s", "refuse": False, "accept_any": ["key"]}


@pytest.mark.parametrize(
    ("spec", "answer", "failure"),
    [
        # general: accepted answers as whole words, or a pattern
        (QUESTION, Answer("The capital of France is Paris."), None),
        (QUESTION, Answer("It is Lyon."), "wrong"),
        (QUESTION, Answer("Parisian food is good."), "wrong"),  # whole words only
        (
            QUESTION,
            Answer("The capital of France is a city known for its", finish_reason="length"),
            "truncated",
        ),
        (QUESTION, Answer("I'm sorry, I cannot answer that."), "refused"),
        (QUESTION, Answer(error="503 overloaded: busy"), "error"),
        (NUMBER, Answer("2 + 2 = 4"), None),
        (NUMBER, Answer("The answer is four."), None),
        (NUMBER, Answer("It is 42."), "wrong"),
        (PATTERN, Answer("CPU stands for Central Processing Unit."), None),
        (PATTERN, Answer("Computer power unit"), "wrong"),
        # korean: language, format, length, required items
        (BULLETS, Answer("- 사과\n- 바나나"), None),
        (BULLETS, Answer("- apple\n- banana"), "language"),
        (BULLETS, Answer("사과, 바나나"), "format"),
        (BULLETS, Answer("- 사과\n- 바나나\n- 포도"), "format"),  # three lines, not two
        (BULLETS, Answer("- 사과\n- 바", finish_reason="length"), None),  # passed: not truncated
        (BULLETS, Answer("- 사과", finish_reason="length"), "truncated"),
        (NUMBERED, Answer("1. 봄\n2. 여름\n3. 가을"), None),
        (NUMBERED, Answer("1. 여름\n2. 가을\n3. 겨울"), "wrong"),
        (NUMBERED, Answer("- 봄\n- 여름\n- 가을"), "format"),
        (ONE_LINE, Answer("서울은 한국의 수도입니다."), None),
        (ONE_LINE, Answer("서울은 한국의 수도입니다.\n인구가 많습니다."), "format"),
        (ONE_LINE, Answer("부산은 항구 도시입니다."), "wrong"),
        (ONE_LINE, Answer("죄송하지만 답할 수 없습니다."), "refused"),
        (KO_JSON, Answer('{"도시": "서울"}'), None),
        (KO_JSON, Answer('```json\n{"도시": "서울"}\n```'), None),
        (KO_JSON, Answer("도시: 서울"), "format"),
        (KO_JSON, Answer('{"city": "서울"}'), "wrong"),
        (SHORT, Answer("고양이는 귀엽다."), None),
        (SHORT, Answer("고양이는 작고 귀여운 동물로 사람과 함께 삽니다."), "format"),
        (STARTS, Answer("내일은 비가 옵니다."), None),
        (STARTS, Answer("오늘은 비가 옵니다."), "wrong"),
        # service: JSON to a schema
        (PERSON, Answer('{"name": "Alice", "age": 30}'), None),
        (PERSON, Answer('{"name": " alice ", "age": 30.0}'), None),  # trimmed, case-folded
        (PERSON, Answer('{"name": "Alice"}'), "format"),  # age missing
        (PERSON, Answer('{"name": "Alice", "age": "30"}'), "format"),  # not an integer
        (PERSON, Answer("Alice is 30."), "format"),
        (PERSON, Answer('{"name": "Bob", "age": 30}'), "wrong"),
        (PERSON, Answer('{"name": "Alice", "ag', finish_reason="length"), "truncated"),
        # service: a tool call
        (WEATHER, Answer("", (call("get_weather", {"city": "Paris"}),)), None),
        (WEATHER, Answer("", (call("get_weather", {"city": "paris"}),)), None),
        (WEATHER, Answer("It is sunny in Paris."), "tool_error"),  # no call
        (WEATHER, Answer("", (call("other", {}),)), "tool_error"),  # another function
        (WEATHER, Answer("", (call("get_weather", "{city: Paris"),)), "tool_error"),  # not JSON
        (WEATHER, Answer("", (call("get_weather", {"town": "Paris"}),)), "tool_error"),
        (WEATHER, Answer("", (call("get_weather", {"city": "Rome"}),)), "wrong"),
        # service: refusal of an out-of-scope request; an in-scope one answered
        (OUT_OF_SCOPE, Answer("I can only help with Switchyard."), None),
        (OUT_OF_SCOPE, Answer("Here is a poem about the sea..."), "wrong"),
        (IN_SCOPE, Answer("Run switchyard keys create to make a key."), None),
        (IN_SCOPE, Answer("I'm sorry, I can only help with Switchyard."), "refused"),
        (IN_SCOPE, Answer("Please see the documentation."), "wrong"),
        (IN_SCOPE, Answer(error="transport: ConnectError"), "error"),
    ],
)
def test_grade(spec: dict[str, object], answer: Answer, failure: str | None) -> None:
    verdict = grade(SET, item(**spec), answer)
    assert (verdict.ok, verdict.failure) == (failure is None, failure), verdict.detail


@pytest.mark.parametrize(
    ("text", "share"),
    [("사과", 1.0), ("apple", 0.0), ("사과 ab", 0.5), ("123 !", 0.0), ("ㅋㅋ ok", 0.5)],
)
def test_hangul_share(text: str, share: float) -> None:
    assert hangul_share(text) == share


@pytest.mark.parametrize(
    ("text", "phrase", "found"),
    [
        ("Buenos Aires!", "buenos aires", True),
        ("Buenos-Aires", "buenos aires", True),
        ("Parisian", "paris", False),
        ("CO2.", "co2", True),
        ("", "x", False),
    ],
)
def test_whole_words(text: str, phrase: str, found: bool) -> None:
    assert has_phrase(text, phrase) is found


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("I can only help with Switchyard.", True),
        ("Sorry, I am unable to do that", True),
        ("죄송합니다. 도와드릴 수 없습니다.", True),
        ("Paris is the capital.", False),
        ("The key is created with switchyard keys create.", False),
    ],
)
def test_refusals(text: str, refused: bool) -> None:
    assert refuses(text) is refused
