# Graders of the shipped evaluation sets, and their failure taxonomy.
#
# Rule. An answer (its text, tool calls, finish reason, or the API error it got) passes
# or fails with exactly one class, the first that applies in this order:
#   error      the API answered with an error (no answer to grade);
#   refused    it refuses (``REFUSAL``: "I can only help…", "I'm sorry…", "죄송…")
#              where an answer was wanted;
#   truncated  a check failed and the answer stopped at max_tokens (finish "length");
#   tool_error a tool call was wanted: none came, another function was called, or its
#              arguments are not JSON fitting the function's parameters;
#   language   the answer is not in the language asked for (Korean: Hangul is less
#              than ``KOREAN_SHARE`` of its letters);
#   format     its shape is wrong: not JSON, or JSON not fitting the schema; bullets,
#              numbered lines or one line as asked; the number of lines; its length;
#   wrong      the content is wrong: no accepted answer (whole words after
#              normalisation: lower case, punctuation to spaces) or no pattern match;
#              a required item missing; JSON or tool arguments with other values than
#              expected; an out-of-scope request answered.
# Values compare as equal when numbers are equal or strings equal after trimming and
# case folding.
#
# Parameters: ``KOREAN_SHARE`` (0.5), ``REFUSAL`` (the phrases).
"""Graders: ``grade(eval_set, item, answer) -> Verdict``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from app.eval.sets import Checks, EvalSet, Item

Failure = Literal["error", "refused", "truncated", "tool_error", "language", "format", "wrong"]
FAILURES: tuple[Failure, ...] = (
    "error",
    "refused",
    "truncated",
    "tool_error",
    "language",
    "format",
    "wrong",
)
KOREAN_SHARE = 0.5
REFUSAL = re.compile(
    r"\b(i can only help|i can only answer|i can't help|i cannot help|i can not help|"
    r"i'm sorry|i am sorry|i can't assist|i cannot assist|i'm unable|i am unable|"
    r"not able to help|only help with|outside (of )?(my|the) scope)\b|죄송|도와드릴 수 없|"
    r"답변(을|해)? ?드릴 수 없|답할 수 없",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^\s*[-•*·]\s*\S")
_NUMBERED = re.compile(r"^\s*\d+\s*[.)]\s*\S")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the API returns it


@dataclass(frozen=True)
class Answer:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    error: str | None = None  # the API's error, when it gave no answer


@dataclass(frozen=True)
class Verdict:
    ok: bool
    failure: Failure | None = None
    detail: str = ""
    checks: dict[str, bool] = field(default_factory=dict)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def has_phrase(text: str, phrase: str) -> bool:
    """``phrase`` occurs in ``text`` as whole words, both normalised."""
    want = normalise(phrase)
    return bool(want) and f" {want} " in f" {normalise(text)} "


def refuses(text: str) -> bool:
    return REFUSAL.search(text) is not None


def hangul_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    hangul = sum(1 for c in letters if "\uac00" <= c <= "\ud7a3" or "\u3131" <= c <= "\u318e")
    return hangul / len(letters)


def same(got: Any, want: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, int | float) and isinstance(got, int | float):
        return float(got) == float(want)
    if isinstance(want, str) and isinstance(got, str):
        return got.strip().casefold() == want.strip().casefold()
    return bool(got == want)


def parse_json(text: str) -> Any:
    """The answer as JSON (a fenced ```json block counts); raises ValueError."""
    body = text.strip()
    fenced = _FENCE.match(body)
    return json.loads(fenced.group(1) if fenced else body)


def _fail(answer: Answer, failure: Failure, detail: str, checks: dict[str, bool]) -> Verdict:
    if answer.finish_reason == "length" and failure not in ("refused", "tool_error"):
        return Verdict(False, "truncated", f"stopped at max_tokens ({detail})", checks)
    return Verdict(False, failure, detail, checks)


def grade(eval_set: EvalSet, item: Item, answer: Answer) -> Verdict:
    """The verdict on ``answer`` to ``item`` (module comment)."""
    if answer.error is not None:
        return Verdict(False, "error", answer.error)
    kind = item.kind
    if kind == "refusal":
        return _refusal(item, answer)
    if kind != "tool_call" and refuses(answer.text):
        return Verdict(False, "refused", "the answer refuses")
    if kind == "answer":
        return _answer(item, answer)
    if kind == "instruction":
        assert item.checks is not None
        return _instruction(item.checks, answer)
    if kind == "json":
        return _json(eval_set, item, answer)
    return _tool_call(eval_set, item, answer)


def _answer(item: Item, answer: Answer) -> Verdict:
    if item.pattern is not None:
        ok = re.search(item.pattern, normalise(answer.text)) is not None
    else:
        ok = any(has_phrase(answer.text, a) for a in item.accept)
    return Verdict(True) if ok else _fail(answer, "wrong", "no accepted answer", {})


def _instruction(c: Checks, answer: Answer) -> Verdict:
    text = answer.text.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    checks: dict[str, bool] = {}
    parsed: Any = None
    if c.language == "ko":
        checks["language"] = hangul_share(text) >= KOREAN_SHARE
    if c.format == "json" or c.json_keys:
        try:
            parsed = parse_json(text)
            checks["format"] = isinstance(parsed, dict)
        except ValueError:
            checks["format"] = False
    if c.format == "bullets":
        checks["format"] = bool(lines) and all(_BULLET.match(ln) for ln in lines)
    elif c.format == "numbered":
        checks["format"] = bool(lines) and all(_NUMBERED.match(ln) for ln in lines)
    elif c.format == "one_line":
        checks["format"] = len(lines) == 1
    shape = [
        c.lines is None or len(lines) == c.lines,
        c.max_lines is None or len(lines) <= c.max_lines,
        c.min_chars is None or len(text) >= c.min_chars,
        c.max_chars is None or len(text) <= c.max_chars,
    ]
    checks["format"] = checks.get("format", True) and all(shape)
    content = [all(r in text for r in c.required)]
    if c.required_any:
        content.append(any(r in text for r in c.required_any))
    if c.starts_with is not None:
        content.append(text.startswith(c.starts_with))
    if c.json_keys:
        content.append(isinstance(parsed, dict) and all(k in parsed for k in c.json_keys))
    checks["content"] = all(content)
    for name, failure in (("language", "language"), ("format", "format"), ("content", "wrong")):
        if not checks.get(name, True):
            return _fail(answer, failure, f"{name} check failed", checks)  # type: ignore[arg-type]
    return Verdict(True, checks=checks)


def _json(eval_set: EvalSet, item: Item, answer: Answer) -> Verdict:
    assert item.json_schema is not None
    try:
        value = parse_json(answer.text)
    except ValueError:
        return _fail(answer, "format", "not JSON", {})
    try:
        jsonschema.validate(value, eval_set.schemas[item.json_schema])
    except jsonschema.ValidationError as exc:
        return _fail(answer, "format", f"does not fit the schema: {exc.message}", {})
    for key, want in (item.expect or {}).items():
        if not same(value.get(key), want):
            return _fail(answer, "wrong", f"{key} is {value.get(key)!r}, not {want!r}", {})
    return Verdict(True)


def _tool_call(eval_set: EvalSet, item: Item, answer: Answer) -> Verdict:
    assert item.call is not None
    calls = [c for c in answer.tool_calls if c.name == item.call]
    if not answer.tool_calls:
        return Verdict(False, "tool_error", "no tool call")
    if not calls:
        names = ", ".join(c.name for c in answer.tool_calls)
        return Verdict(False, "tool_error", f"called {names}, not {item.call}")
    try:
        args = json.loads(calls[0].arguments)
        jsonschema.validate(args, eval_set.tools[item.call].parameters)
    except (ValueError, jsonschema.ValidationError) as exc:
        return Verdict(False, "tool_error", f"arguments invalid: {exc}")
    for key, want in (item.args or {}).items():
        if not same(args.get(key), want):
            return Verdict(False, "wrong", f"{key} is {args.get(key)!r}, not {want!r}")
    return Verdict(True)


def _refusal(item: Item, answer: Answer) -> Verdict:
    refused = refuses(answer.text)
    if item.refuse:
        return Verdict(True) if refused else Verdict(False, "wrong", "answered out of scope")
    if refused:
        return Verdict(False, "refused", "refused an in-scope request")
    if item.accept_any and not any(has_phrase(answer.text, a) for a in item.accept_any):
        return _fail(answer, "wrong", "none of the expected words", {})
    return Verdict(True)
