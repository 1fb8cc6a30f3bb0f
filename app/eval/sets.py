"""The evaluation sets shipped in ``app/eval/sets/`` (one YAML file per layer), validated
with ``extra="forbid"``: ``general`` (short questions, accepted answers or a pattern),
``korean`` (instructions with machine-checkable constraints) and ``service`` (JSON to a
schema, tool calls, refusals). ``EvalSet.version`` is the file's declared version and the
first 12 hex digits of its SHA-256: a report names both, so a score is tied to the exact
items it graded."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from app.schema import Strict

SETS_DIR = Path(__file__).parent / "sets"
LAYERS = ("general", "korean", "service")
Layer = Literal["general", "korean", "service"]
Format = Literal["bullets", "numbered", "json", "one_line"]


class Checks(Strict):
    """A Korean instruction's constraints (``graders.check_korean``)."""

    language: Literal["ko"] | None = None  # Hangul at least half of the letters
    format: Format | None = None
    lines: int | None = Field(default=None, ge=1)  # exactly this many non-empty lines
    max_lines: int | None = Field(default=None, ge=1)
    min_chars: int | None = Field(default=None, ge=1)
    max_chars: int | None = Field(default=None, ge=1)
    required: list[str] = Field(default_factory=list)  # every one occurs
    required_any: list[str] = Field(default_factory=list)  # at least one occurs
    starts_with: str | None = None
    json_keys: list[str] = Field(default_factory=list)  # the JSON object has these keys


class Item(Strict):
    """One prompt and how its answer is graded (exactly one way per layer)."""

    id: str
    prompt: str
    system: str | None = None  # a name from the set's ``systems``
    # general
    accept: list[str] = Field(default_factory=list)
    pattern: str | None = None
    # korean
    checks: Checks | None = None
    # service: JSON
    json_schema: str | None = None  # a name from the set's ``schemas``
    expect: dict[str, Any] | None = None  # fields the JSON must also have, with these values
    # service: a tool call
    tools: list[str] = Field(default_factory=list)  # names from the set's ``tools``
    tool_choice: Literal["auto", "required"] = "auto"
    call: str | None = None
    args: dict[str, Any] | None = None  # arguments the call must have, with these values
    # service: refusal
    refuse: bool | None = None
    accept_any: list[str] = Field(default_factory=list)  # an in-scope answer has one

    @model_validator(mode="after")
    def _one_grader(self) -> Item:
        kinds = [
            bool(self.accept or self.pattern),
            self.checks is not None,
            self.json_schema is not None,
            self.call is not None,
            self.refuse is not None,
        ]
        if sum(kinds) != 1:
            raise ValueError(f"{self.id}: exactly one way to grade it")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"{self.id}: pattern: {exc}") from None
        return self

    @property
    def kind(self) -> str:
        if self.accept or self.pattern:
            return "answer"
        if self.checks is not None:
            return "instruction"
        if self.json_schema is not None:
            return "json"
        if self.call is not None:
            return "tool_call"
        return "refusal"


class Tool(Strict):
    description: str
    parameters: dict[str, Any]


class EvalSet(Strict):
    set: Layer
    version: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    systems: dict[str, str] = Field(default_factory=dict)
    tools: dict[str, Tool] = Field(default_factory=dict)
    schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)
    items: list[Item]
    digest: str = ""  # of the file (set by ``load``)

    @model_validator(mode="after")
    def _names_resolve(self) -> EvalSet:
        ids = [i.id for i in self.items]
        if len(ids) != len(set(ids)):
            raise ValueError(f"{self.set}: item ids repeat")
        for i in self.items:
            missing = [t for t in i.tools if t not in self.tools]
            if i.system is not None and i.system not in self.systems:
                missing.append(i.system)
            if i.json_schema is not None and i.json_schema not in self.schemas:
                missing.append(i.json_schema)
            if i.call is not None and i.call not in i.tools:
                missing.append(i.call)
            if missing:
                raise ValueError(f"{i.id}: unknown names {missing}")
        return self

    @property
    def label(self) -> str:
        """``<set> v<version> (<digest>)``: what a report names."""
        return f"{self.set} v{self.version} ({self.digest})"

    def messages(self, item: Item) -> list[dict[str, str]]:
        out = []
        if item.system is not None:
            out.append({"role": "system", "content": self.systems[item.system]})
        out.append({"role": "user", "content": item.prompt})
        return out


def load(layer: str, directory: Path = SETS_DIR) -> EvalSet:
    """One set from its YAML file, validated, with its digest."""
    path = directory / f"{layer}.yaml"
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    data["digest"] = hashlib.sha256(raw).hexdigest()[:12]
    return EvalSet.model_validate(data)
